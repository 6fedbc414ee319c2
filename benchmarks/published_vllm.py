"""The packaged sim profiles beside published vLLM benchmarks (issue 25 item 5; docs/calibration.md, section 6).

Run: ``python -m benchmarks.published_vllm [--quick] [--seconds S] [--json FILE] [--markdown]``. For each
published table in ``PUBLISHED`` it replays the table's load on the sim with the packaged profiles that stand
for the table's model and GPU (``exporters/serving/calibrate/replay.py``: the sim engine in virtual time,
closed-loop users, no HTTP, no client overhead), and prints each published figure beside the sim's with the
error (sim − published) / published. Nothing is fitted to the tables: the profiles are the packaged ones.
``--markdown`` prints each source's table as docs/calibration.md carries it (a test checks the docs current).

What a published figure is, and how the sim's figure is computed to match it, is in ``Figure.how``; what the
source does not state, in ``Published.note``. Only figures the source states with their load are used; a
length or version the stored copy does not show is not guessed (``vllm`` then says so).
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

Replays = dict[str, dict[str, float | None]]
"""A source's replayed figures by :attr:`Load.label`."""


@dataclass(frozen=True, slots=True)
class Load:
    """One replayed load: ``users`` closed-loop users, each sending ``prompt``-token requests for ``output``
    tokens (ignore_eos), one after another."""

    users: int
    prompt: int
    output: int

    @property
    def label(self) -> str:
        return f"{self.users} users, {self.prompt} in, {self.output} out"


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
    """The vLLM version (and settings) as the source states them, or ``not stated: ...``."""
    load: str
    """The source's load, in its terms."""
    loads: tuple[Load, ...]
    """What the sim replays for it."""
    figures: tuple[Figure, ...]
    note: str
    """What the source does not state, and what stands in for it."""
    min_seconds: float = 0.0
    """The least modeled seconds a load is measured for, whatever ``--seconds`` says: long enough for a whole
    request to fit in the window (a request counts where it starts in it, measured to its end)."""


A100_C1, A100_C8 = Load(1, 1024, 128), Load(8, 1024, 128)
RATE = "server_output_throughput"
"""The sim's output tokens made per second of the window (its ``vllm:generation_tokens_total``): a steady rate,
as a benchmark's tokens over its whole run; the replay's ``output_throughput`` counts whole requests begun in
the window, as the load generator does, and moves by a request at the window's edges."""


def _decode_rate(replays: Replays) -> float | None:
    itl = replays[A100_C1.label].get("median_itl_ms")
    return None if not itl else 1000.0 / itl


def _throughput_ratio(replays: Replays) -> float | None:
    one, eight = replays[A100_C1.label].get(RATE), replays[A100_C8.label].get(RATE)
    return None if not one or eight is None else eight / one


def _at(load: Load, key: str) -> Callable[[Replays], float | None]:
    """The replay's own figure ``key`` under ``load``, as it is."""

    def figure(replays: Replays) -> float | None:
        return replays[load.label].get(key)

    return figure


def _speed(load: Load) -> Callable[[Replays], float | None]:
    """Output tokens over one request's whole time (prefill included), tokens/s: ``output / E2E``."""

    def figure(replays: Replays) -> float | None:
        e2e = replays[load.label].get("median_e2el_ms")
        return None if not e2e else load.output / (e2e / 1000.0)

    return figure


MUSGRAVE_A100 = Published(
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
    loads=(A100_C1, A100_C8),
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
)

VLLM_CI_H200 = Published(
    source="https://buildkite.com/vllm/performance-benchmark/builds/9515",
    title="vLLM performance benchmark (Buildkite vllm/performance-benchmark, build 9515), latency tests",
    model="llama-3.1 8B (test latency_llama8B_tp1; the page names no precision)",
    model_profile="deepseek-r1-distill-llama-8b",
    gpu="NVIDIA H200 (the table's GPU column; tensor parallelism 1)",
    gpu_profile="h200",
    vllm="not stated: the page is a build of vLLM's own CI pipeline and its stored text names no version or commit",
    load=(
        "vLLM's latency test: one batch of 8 requests (fixed batch size 8), 32-token prompts, 128 output"
        " tokens; mean, median and P99 of the batch's end-to-end latency over the test's iterations"
    ),
    loads=(Load(8, 32, 128),),
    figures=(
        Figure(
            name="end-to-end latency of a batch of 8 (ms)",
            published=833.53,
            how=(
                "the page: latency_llama8B_tp1 on H200, median latency 833.53 ms (mean 833.421, P99 834.167):"
                " the time one batch of 8 requests of 32 prompt and 128 output tokens takes, offline (no HTTP);"
                " the sim: its median E2E at 8 closed-loop users sending the same requests (the 8 stay in step,"
                " so one request's E2E is the batch's)"
            ),
            sim=_at(Load(8, 32, 128), "median_e2el_ms"),
        ),
    ),
    note=(
        "Only the latency table states its lengths: the page's throughput and serving tables sample ShareGPT"
        " prompts, whose lengths it does not state, so they are not compared. The page does not state the vLLM"
        " version. Llama-3.1-8B's shape is the packaged deepseek-r1-distill-llama-8b's (LlamaForCausalLM, 32"
        " layers, hidden 4096, 8 KV heads). The packaged h200 profile is the 141 GB SXM card; the page says"
        " H200 only."
    ),
)

QWEN3_C4 = Load(4, 233, 221)

GPUSTACK_QWEN3_H100 = Published(
    source="https://github.com/gpustack/gpustack/blob/main/docs/performance-lab/qwen3-8b/h100-latency.md",
    title="GPUStack performance lab: Optimizing Qwen3-8B Latency on NVIDIA H100 GPUs (the vLLM baseline)",
    model="Qwen/Qwen3-8B (bf16, vllm serve Qwen/Qwen3-8B with no other flag)",
    model_profile="qwen3-8b",
    gpu="a single NVIDIA H100 SXM",
    gpu_profile="h100-sxm",
    vllm="v0.11.0",
    load=(
        "vllm bench serve --backend openai-chat, ShareGPT, 100 prompts, --max-concurrency 4, request rate inf;"
        " the run states 23,260 input and 22,061 generated tokens in all, not each request's lengths"
    ),
    loads=(QWEN3_C4,),
    figures=(
        Figure(
            name="median TTFT at 4 (ms)",
            published=60.26,
            how="the run's Median TTFT (ms); the sim: its median client TTFT at 4 users",
            sim=_at(QWEN3_C4, "median_ttft_ms"),
        ),
        Figure(
            name="median ITL at 4 (ms)",
            published=7.37,
            how="the run's Median ITL (ms) (median TPOT 7.40); the sim: its median inter-token latency at 4 users",
            sim=_at(QWEN3_C4, "median_itl_ms"),
        ),
        Figure(
            name="output throughput at 4 (tokens/s)",
            published=496.88,
            how="the run's Output token throughput (tok/s); the sim: its output tokens/s over the window",
            sim=_at(QWEN3_C4, RATE),
        ),
        Figure(
            name="mean E2E latency at 4 (ms)",
            published=1680.0,
            how=(
                "the page's summary table: vLLM baseline, ShareGPT BS=4, mean latency 1.68 s/req; the sim: its"
                " mean E2E at 4 users"
            ),
            sim=_at(QWEN3_C4, "mean_e2el_ms"),
        ),
    ),
    note=(
        "ShareGPT prompts differ in length; the page states the run's totals only, so the sim sends every"
        " request the mean lengths, 233 prompt tokens (23,260 / 100) and 221 output tokens (22,061 / 100), with"
        " ignore_eos. The median ITL and the throughput depend little on the spread of lengths at 4 users; the"
        " TTFT does (a long prompt's prefill, or one landing in another's). The chat endpoint adds the chat"
        " template's tokens to each prompt, which the bench's input count does not include. The packaged"
        " qwen3-8b profile is Qwen/Qwen3-8B's config.json; h100-sxm is the 80 GB SXM5 card."
    ),
)

QWEN_SPEED_LOADS = tuple(Load(1, prompt, 2048) for prompt in (1, 6144, 14336, 30720))
QWEN_DOCS = "https://github.com/QwenLM/Qwen2.5/blob/{commit}/docs/source/benchmark/speed_benchmark.rst"


def _qwen_speed(model: str, version: str, environment: str, commit: str, speeds: tuple[float, ...]) -> Published:
    """A "7B (vLLM)" table of Qwen's speed benchmark: BF16, one A100 80GB, batch 1, 2,048 tokens out."""
    return Published(
        source=QWEN_DOCS.format(commit=commit),
        title=f"{version.split()[0]} Speed Benchmark (Qwen's docs at {commit[:7]}), 7B (vLLM)",
        model=f"Qwen/{model}, BF16, one GPU",
        model_profile="qwen2.5-7b",
        gpu="NVIDIA A100 80GB (the page names no form factor)",
        gpu_profile="a100-80gb-sxm",
        vllm=f"{version.split()[1]} (gpu_memory_utilization=0.9, max_model_len=32768, enforce_eager=False)",
        load=(
            "batch size 1: one request at a time generating 2,048 tokens after an input of 1, 6,144, 14,336 or"
            " 30,720 tokens; speed in tokens/s"
        ),
        loads=QWEN_SPEED_LOADS,
        figures=tuple(
            Figure(
                name=f"speed at input {load.prompt} (tokens/s)",
                published=speed,
                how=(
                    f"the table: {model}, input length {load.prompt}, BF16, 1 GPU, {speed} tokens/s; Qwen's speed"
                    " script (examples/speed-benchmark/speed_benchmark_vllm.py) divides the output length by the"
                    " time of the whole generate call, prefill included; the sim: 2048 / its median E2E (s) of"
                    " one user sending the same request"
                ),
                sim=_speed(load),
            )
            for load, speed in zip(QWEN_SPEED_LOADS, speeds, strict=True)
        ),
        note=(
            f"The page gives the environment ({environment}) and the lengths, not the speed's formula: the"
            " formula is the speed script's, added to the same repository in November 2024. The input of 1 is"
            " the script's dummy input once (its token count is not stated); the longer inputs are chat-templated"
            " queries padded to about the stated length. The 63,488 and 129,024 rows need YaRN past the model's"
            " 32,768 positions: not compared. The packaged qwen2.5-7b profile is Qwen2.5-7B-Instruct's"
            " config.json (Qwen2-7B-Instruct's has the same shape); a100-80gb-sxm stands for the unnamed A100"
            " 80GB form factor (the 80 GB PCIe card has 1,935 GB/s against the SXM4's 2,039)."
        ),
        min_seconds=90.0,
    )


QWEN25_A100 = _qwen_speed(
    "Qwen2.5-7B-Instruct", "Qwen2.5 0.6.3", "A100 80GB, CUDA 12.1, vLLM 0.6.3, PyTorch 2.4.0",
    "a912d239c2d0e2e5d10bb8d02e6f5685edb43e68", (84.28, 80.70, 77.69, 70.33),
)  # fmt: skip
QWEN2_A100 = _qwen_speed(
    "Qwen2-7B-Instruct", "Qwen2 0.4.2", "A100 80GB, CUDA 11.8, vLLM 0.4.2, PyTorch 2.3.0",
    "4da996c576418cc9ecdff35aeddfcdca814e9568", (80.45, 76.41, 66.54, 55.83),
)  # fmt: skip

PUBLISHED: tuple[Published, ...] = (MUSGRAVE_A100, VLLM_CI_H200, GPUSTACK_QWEN3_H100, QWEN25_A100, QWEN2_A100)


def compare(published: Published, seconds: float) -> dict[str, object]:
    """One source: the sim's replays of its loads and each figure beside the published one."""
    model = load_model_profile(published.model_profile)
    gpu = load_gpu_profile(published.gpu_profile)
    replays: Replays = {}
    for load in published.loads:
        stage = StageLoad(users=load.users, prompt=load.prompt, output=load.output,
                          duration_s=max(seconds, published.min_seconds), warmup_s=5.0)  # fmt: skip
        replays[load.label] = replay(model, gpu, stage).figures
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
        "replays": replays,
        "figures": rows,
    }


def _number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def markdown(result: dict[str, object]) -> list[str]:
    """One source's figures as the Markdown table docs/calibration.md (section 6) and BENCHMARKS.md carry."""
    lines = [
        f"**{result['title']}**: sim `{result['model_profile']}` on `{result['gpu_profile']}`",
        "",
        "| figure | published | sim | error |",
        "|---|---:|---:|---:|",
    ]
    for row in result["figures"]:  # type: ignore[attr-defined]
        error = "n/a" if row["error"] is None else f"{row['error'] * 100:+.1f} %"
        lines.append(f"| {row['figure']} | {row['published']:g} | {_number(row['sim'])} | {error} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    seconds_help = "modeled seconds per load (at least a source's min_seconds)"
    p.add_argument("--seconds", type=float, default=60.0, help=seconds_help)
    p.add_argument("--quick", action="store_true", help="10 modeled seconds per load (what make bench passes)")
    p.add_argument("--json", type=Path, help="also write the comparison here")
    p.add_argument("--markdown", action="store_true", help="print each source's table as Markdown (the docs' form)")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds = 10.0
    if args.seconds <= 0:
        p.error(f"--seconds must be positive, got {args.seconds}")
    results = [compare(published, args.seconds) for published in PUBLISHED]
    for result in results:
        if args.markdown:
            print("\n".join(markdown(result)) + "\n")
            continue
        print(f"{result['title']} ({result['source']})")
        print(f"  model {result['model']} -> sim model profile {result['model_profile']}")
        print(f"  GPU {result['gpu']} -> sim GPU profile {result['gpu_profile']}; vLLM {result['vllm']}")
        print(f"  load: {result['load']}")
        for row in result["figures"]:  # type: ignore[attr-defined]
            error = "n/a" if row["error"] is None else f"{row['error'] * 100:+.1f} %"
            sim = _number(row["sim"])
            print(f"  {row['figure']:<40} published {row['published']:>8.2f}  sim {sim:>8}  error {error}")
        print(f"  note: {result['note']}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
