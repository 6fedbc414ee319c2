"""The packaged sim profiles beside a published vLLM benchmark (issue 25 item 5; docs/calibration.md).

Run: ``python -m benchmarks.published_vllm [--quick] [--seconds S] [--json FILE]``. For each published table in
``PUBLISHED`` it replays the table's load on the sim with the packaged profiles that stand for the table's
model and GPU (``exporters/serving/calibrate/replay.py``: the sim engine in virtual time, closed-loop users, no
HTTP, no client overhead), and prints each published figure beside the sim's with the error
(sim − published) / published. Nothing is fitted to the table: the profiles are the packaged ones.

What a published figure is, and how the sim's figure is computed to match it, is in ``Figure.how``. Only
figures the source states with their load are used; a source's figures that the stored copy does not show
are not guessed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporters.serving.calibrate.replay import StageLoad, replay
from loadlens.contracts.gpu_profile import load_gpu_profile
from loadlens.contracts.model_profile import load_model_profile

Replays = dict[int, dict[str, float | None]]
"""A source's replayed figures by concurrency (closed-loop users)."""


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    published: float
    how: str
    """What the source states, in its words' sense, and how the sim's figure is computed to match it."""
    sim: Callable[[Replays], float | None]


@dataclass(frozen=True, slots=True)
class Published:
    source: str
    title: str
    model: str
    """The source's model, and the packaged model profile that stands for it."""
    model_profile: str
    gpu: str
    gpu_profile: str
    vllm: str
    load: str
    prompt_tokens: int
    output_tokens: int
    concurrencies: tuple[int, ...]
    figures: tuple[Figure, ...]
    note: str


def _decode_rate(replays: Replays) -> float | None:
    itl = replays[1].get("median_itl_ms")
    return None if not itl else 1000.0 / itl


def _throughput_ratio(replays: Replays) -> float | None:
    one, eight = replays[1].get("output_throughput"), replays[8].get("output_throughput")
    return None if not one or eight is None else eight / one


PUBLISHED: tuple[Published, ...] = (
    Published(
        source="https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on",
        title="vLLM throughput-latency sweep on NVIDIA A100",
        model="meta-llama/Llama-3.1-8B-Instruct, BF16",
        model_profile="deepseek-r1-distill-llama-8b",
        gpu="NVIDIA A100 40GB (one GPU, no tensor parallelism)",
        gpu_profile="a100-40gb-pcie",
        vllm="0.23.0, default scheduling",
        load=(
            "vllm bench serve, random dataset, 1,024-token prompts, 128 output tokens with --ignore-eos,"
            " --max-concurrency C (1 to 64, doubling), 20*C prompts, --request-rate inf"
        ),
        prompt_tokens=1024,
        output_tokens=128,
        concurrencies=(1, 8),
        figures=(
            Figure(
                name="decode tokens/s of one request at C=1",
                published=75.0,
                how=(
                    "the page: 'decode at one request per time runs at about 75 tokens/sec'; the sim: 1000 / its"
                    " median inter-token latency (ms) at 1 user"
                ),
                sim=_decode_rate,
            ),
            Figure(
                name="output throughput at C=8 over C=1",
                published=6.6,
                how=(
                    "the page: 'batching buys throughput almost for free up to a concurrency of 8, a 6.6x gain';"
                    " the sim: its output tokens/s at 8 users over its output tokens/s at 1 user"
                ),
                sim=_throughput_ratio,
            ),
        ),
        note=(
            "The stored copy of the page holds its setup, method and summary, not its per-concurrency table, so"
            " only the two figures its summary states are compared. Llama-3.1-8B and DeepSeek-R1-Distill-Llama-8B"
            " have the same shape (LlamaForCausalLM: 32 layers, hidden 4096, 8 KV heads, intermediate 14336,"
            " vocabulary 128256). The page names an A100 40GB without its form factor; the packaged 40 GB profile"
            " is the PCIe card (the same 1,555 GB/s and 312 TFLOP/s dense BF16 as the 40 GB SXM4, a lower power"
            " cap)."
        ),
    ),
)


def compare(published: Published, seconds: float) -> dict[str, object]:
    """One source: the sim's replays at its concurrencies and each figure beside the published one."""
    model = load_model_profile(published.model_profile)
    gpu = load_gpu_profile(published.gpu_profile)
    replays: Replays = {}
    for users in published.concurrencies:
        load = StageLoad(users=users, prompt=published.prompt_tokens, output=published.output_tokens,
                         duration_s=seconds, warmup_s=5.0)  # fmt: skip
        replays[users] = replay(model, gpu, load).figures
    rows = []
    for figure in published.figures:
        value = figure.sim(replays)
        error = None if value is None else (value - figure.published) / figure.published
        rows.append({"figure": figure.name, "published": figure.published, "sim": value, "error": error,
                     "how": figure.how})  # fmt: skip
    return {
        "source": published.source,
        "title": published.title,
        "model": published.model,
        "model_profile": published.model_profile,
        "gpu": published.gpu,
        "gpu_profile": published.gpu_profile,
        "vllm": published.vllm,
        "load": published.load,
        "note": published.note,
        "replays": {str(users): figures for users, figures in replays.items()},
        "figures": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="modeled seconds per replayed concurrency")
    p.add_argument("--quick", action="store_true", help="10 modeled seconds per concurrency (what make bench passes)")
    p.add_argument("--json", type=Path, help="also write the comparison here")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds = 10.0
    if args.seconds <= 0:
        p.error(f"--seconds must be positive, got {args.seconds}")
    results = [compare(published, args.seconds) for published in PUBLISHED]
    for result in results:
        print(f"{result['title']} ({result['source']})")
        print(f"  model {result['model']} -> sim model profile {result['model_profile']}")
        print(f"  GPU {result['gpu']} -> sim GPU profile {result['gpu_profile']}; vLLM {result['vllm']}")
        print(f"  load: {result['load']}")
        for row in result["figures"]:  # type: ignore[attr-defined]
            sim = "n/a" if row["sim"] is None else f"{row['sim']:.2f}"
            error = "n/a" if row["error"] is None else f"{row['error'] * 100:+.1f} %"
            print(f"  {row['figure']:<40} published {row['published']:>7.2f}  sim {sim:>7}  error {error}")
        print(f"  note: {result['note']}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
