"""Guide 2.1 measured: per-token greedy-decode latency of a Llama-shaped model, base vs unmerged PEFT LoRA.

A ``LlamaForCausalLM`` built from a config with random weights (no download), a random prompt, then N greedy
decode steps through the KV cache, each step timed on its own: CUDA events on a GPU, ``time.perf_counter`` on
a CPU. Every repeat times the base model and then each rank in turn (the adapter injected with
``get_peft_model``, timed, removed with ``unload()`` without merging: the serving case of adapters kept apart),
so a load change on the host hits every variant alike. The adapter's bytes are the guide's formula
(``loadlens.lora.sizes``) and are checked against the tensors PEFT made. The increment over base is fitted to
``a * rank**b`` by least squares in log-log space (``power_fit``). Used by ``benchmarks/gpu_lora_check.py``.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from loadlens.lora.shapes import from_hf_config
from loadlens.lora.sizes import adapter_size

TARGETS = ("q_proj", "v_proj")  # guide 2.1/2.2
ALPHA = 16


@dataclass(frozen=True)
class DecodeShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


# On a GPU: the layer width of an 8B Llama (hidden 4096, 32 heads, 8 KV heads, MLP 14336) with 4 layers, so the
# whole run takes seconds; on a CPU: a tiny one so CI stays fast.
CUDA_SHAPE = DecodeShape(hidden=4096, layers=4, heads=32, kv_heads=8, intermediate=14336, vocab=32000)
CPU_SHAPE = DecodeShape(hidden=256, layers=2, heads=8, kv_heads=4, intermediate=512, vocab=1024)
TINY_SHAPE = DecodeShape(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, vocab=64)


def llama_config(shape: Any, max_positions: int = 2048) -> Any:
    """A transformers ``LlamaConfig`` for any shape with ``vocab``, ``hidden``, ``intermediate``, ``layers``,
    ``heads`` and ``kv_heads`` (this module's :class:`DecodeShape`, the probe check's model shape)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max_positions,
    )


def build_model(shape: DecodeShape, torch: Any, device: str, dtype: Any, seed: int = 0) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: no host copy of a GPU-sized model
        model: Any = LlamaForCausalLM(llama_config(shape))
    return model.to(dtype=dtype).eval()


def dtype_name(torch: Any, dtype: Any) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def formula_bytes(shape: DecodeShape, rank: int, dtype: str) -> int:
    """Guide 2.1's formula: layers x target modules x r x (d_in + d_out) x bytes per parameter."""
    base = from_hf_config(llama_config(shape).to_dict(), "lora_decode_timing")
    return adapter_size(base, rank, TARGETS, dtype).bytes


def attach_lora(model: Any, rank: int, torch: Any, *, seed: int, zero_b: bool = False, name: str = "default") -> Any:
    """``model`` with one unmerged rank-``rank`` adapter on q_proj/v_proj (alpha 16). B is random (so the
    adapter changes the output) unless ``zero_b``: then the path runs but adds exactly nothing."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0)
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing: not ours
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = get_peft_model(model, cfg, adapter_name=name)
    with torch.no_grad():
        for pname, param in peft_model.named_parameters():
            if f"lora_B.{name}." in pname:
                param.zero_() if zero_b else param.normal_(0.0, 0.02)
    return peft_model.eval()


def lora_tensor_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)


@dataclass(frozen=True)
class Timed:
    mean_ms: float
    median_ms: float
    steps: int


class StepClock:
    """Seconds of each decode step: CUDA events (read after one synchronize) or perf_counter on a CPU."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch, self.cuda = torch, device.startswith("cuda")
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        if self.cuda:
            self.torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [(b - a) * 1000 for a, b in zip(self.marks, self.marks[1:], strict=False)]


def greedy_decode(model: Any, prompt: Any, new_tokens: int, torch: Any, device: str) -> tuple[Any, list[float]]:
    """Greedy tokens (batch x new_tokens) and the milliseconds of each decode step after the prefill."""
    clock = StepClock(torch, device)
    # ``past_key_values=`` works from old transformers to new ones (5.x warns that it is renamed ``cache``).
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = model(input_ids=prompt, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        tokens = [token]
        clock.mark()
        for _ in range(new_tokens - 1):
            out = model(input_ids=token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            clock.mark()
    return torch.cat(tokens, dim=1), clock.step_ms()


def summarise(step_ms: Sequence[float]) -> Timed:
    return Timed(round(statistics.fmean(step_ms), 4), round(statistics.median(step_ms), 4), len(step_ms))


def power_fit(ranks: Sequence[int], increments: Sequence[float]) -> dict[str, Any]:
    """``increment = a * rank**b`` by least squares on (log rank, log increment): b, its standard error
    (residual variance over n - 2 degrees of freedom, divided by the spread of log rank), a, and whether
    growth is sub-linear (b < 1; ``sublinear_2se``: b + 2 se < 1). Non-positive increments cannot be logged
    and are left out; with fewer than 3 points left there is no fit and ``reason`` says why."""
    points = [(r, d) for r, d in zip(ranks, increments, strict=True) if d > 0]
    dropped = [r for r, d in zip(ranks, increments, strict=True) if d <= 0]
    if len(points) < 3:
        return {"exponent": None, "reason": f"{len(points)} positive increment(s); a fit needs 3", "dropped": dropped}
    xs = [math.log(r) for r, _ in points]
    ys = [math.log(d) for _, d in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = math.exp(my - b * mx)
    ssr = sum((y - (my + b * (x - mx))) ** 2 for x, y in zip(xs, ys, strict=True))
    se = math.sqrt(ssr / (len(points) - 2) / sxx)
    return {
        "exponent": round(b, 4),
        "exponent_se": round(se, 4),
        "coefficient_ms": round(a, 6),
        "points": len(points),
        "dropped": dropped,
        "sublinear": b < 1,
        "sublinear_2se": b + 2 * se < 1,
    }


def time_ranks(
    shape: DecodeShape,
    torch: Any,
    device: str,
    dtype: Any,
    *,
    ranks: Sequence[int],
    batch: int,
    prompt_tokens: int,
    new_tokens: int,
    warmup: int,
    repeats: int,
) -> dict[str, Any]:
    """One batch size: per variant (base, then each rank) the mean and median per-token milliseconds over all
    repeats' steps, the median of the per-repeat medians, the increment over base and the fit."""
    model = build_model(shape, torch, device, dtype)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, shape.vocab, (batch, prompt_tokens), generator=gen).to(device)
    variants = [0, *ranks]
    steps: dict[int, list[float]] = {v: [] for v in variants}
    medians: dict[int, list[float]] = {v: [] for v in variants}
    size_ok: dict[int, bool] = {}
    for rep in range(warmup + repeats):
        for rank in variants:
            m = model if rank == 0 else attach_lora(model, rank, torch, seed=100 + rank)
            if rank and rank not in size_ok:
                size_ok[rank] = lora_tensor_bytes(m) == formula_bytes(shape, rank, dtype_name(torch, dtype))
            _, ms = greedy_decode(m, prompt, new_tokens, torch, device)
            if rank:
                model = m.unload()  # the base model back, its layers unwrapped, nothing merged
            if rep >= warmup:
                steps[rank] += ms
                medians[rank].append(statistics.median(ms))
    base = summarise(steps[0])
    rows = []
    for rank in variants:
        t = summarise(steps[rank])
        width = dtype_name(torch, dtype)
        rows.append(
            {
                "variant": "base" if rank == 0 else f"lora-r{rank}",
                "rank": rank,
                "adapter_bytes": formula_bytes(shape, rank, width) if rank else 0,
                "adapter_bytes_match_peft": size_ok.get(rank) if rank else None,
                **asdict(t),
                "median_of_repeat_medians_ms": round(statistics.median(medians[rank]), 4),
                "increment_median_ms": round(t.median_ms - base.median_ms, 4),
                "increment_ratio": round(t.median_ms / base.median_ms, 4),
            }
        )
    fit = power_fit(list(ranks), [r["increment_median_ms"] for r in rows[1:]])
    del model
    return {"batch": batch, "rows": rows, "fit": fit}
