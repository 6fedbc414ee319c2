"""Guide 3.3: a one-token step of a small random transformer stack, eager and as a CUDA graph.

The stack is ``torch.nn.TransformerEncoder`` (``layers`` pre-built ``TransformerEncoderLayer`` of ``width``,
``heads`` heads, feed-forward 4·width), random weights, in eval mode under ``torch.no_grad``, fed ``batch``
sequences of one token: the shape of a decode step without a KV cache (the issue's anchor: 8 layers, 1024
wide, batch 32). Figures:

- first call: host time of the first forward of the freshly built stack, synchronised (kernel selection, lazy
  initialisation and allocation included); it runs before every other measurement of the command, so it also
  includes what the process's first kernels pay (cuBLAS handles);
- eager step: median steady-state forward (the command's timer);
- capture: host time of ``torch.cuda.graph`` capture after the side-stream warm-up the CUDA graph API asks for,
  synchronised; success is whether capture raised;
- replay step: median ``graph.replay()``.

On the CPU smoke test there are no CUDA graphs: the eager figures only, and the reason.
"""

from __future__ import annotations

import time
from typing import Any

from loadlens.contracts.gpu_bench_result import GraphRow
from loadlens.gpubench import counts
from loadlens.gpubench.measure import Timer, dtype_of, one_line
from loadlens.gpubench.plan import Plan

GRAPH_HEADS_PER_WIDTH = 64
"""Head dimension of the stack: width / 64 heads (16 at 1024)."""


def build_stack(torch: Any, layers: int, width: int, device: str, dtype: Any) -> Any:
    heads = max(1, width // GRAPH_HEADS_PER_WIDTH)
    layer = torch.nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, batch_first=True, dropout=0.0)
    stack = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return stack.to(device=device, dtype=dtype).eval()


def measure(torch: Any, plan: Plan, device: str, timer: Timer) -> GraphRow:
    dtype = plan.dtypes[0]
    dt = dtype_of(torch, dtype)
    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    with torch.no_grad():
        stack = build_stack(torch, plan.graph_layers, plan.graph_width, device, dt)
        x = torch.randn(plan.graph_batch, 1, plan.graph_width, device=device, dtype=dt)
        sync()
        t0 = time.perf_counter()
        stack(x)
        sync()
        first = time.perf_counter() - t0
        eager = counts.median(timer(lambda: stack(x), plan.warmup, plan.iterations))
        base: dict[str, Any] = {
            "layers": plan.graph_layers,
            "width": plan.graph_width,
            "heads": max(1, plan.graph_width // GRAPH_HEADS_PER_WIDTH),
            "batch": plan.graph_batch,
            "dtype": dtype,
            "first_call_seconds": first,
            "eager_step_seconds": eager,
        }
        if not cuda:
            return GraphRow(**base, capture_ok=False, reason="no CUDA graphs on the CPU")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                stack(x)
        torch.cuda.current_stream().wait_stream(side)
        sync()
        graph = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        try:
            with torch.cuda.graph(graph):
                stack(x)
            sync()
        except Exception as err:  # capture failed: the figure the guide asks for
            return GraphRow(**base, capture_ok=False, reason=f"capture failed: {one_line(str(err))}")
        capture = time.perf_counter() - t0
        replay = counts.median(timer(graph.replay, plan.warmup, plan.iterations))
        speedup = eager / replay if replay > 0 else None
        return GraphRow(**base, capture_ok=True, capture_seconds=capture, replay_step_seconds=replay, speedup=speedup)
