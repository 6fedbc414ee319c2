"""Sim engine capacity, without HTTP: closed-loop streams consume tokens straight from ``SimEngine``.

Run: ``python -m benchmarks.sim_engine [--quick] [--duration S]`` (``make bench`` runs it).

Each row runs S concurrent closed-loop streams (prompt 256 tokens, ``max_tokens=128``, ``ignore_eos``) for D
seconds in this one process, and reports:

- tok/s: output tokens the consumers received per second of wall time;
- steps/s and mean batch: engine steps per second, sequences per step;
- timing error p50/p99/mean: how late the loop woke against each step's deadline
  (``loadlens_sim_timing_error_seconds``; quantiles interpolated within its buckets, as ``histogram_quantile``
  would, the mean exact);
- slips: times the loop fell > 0.25 s behind and restarted its schedule;
- CPU µs/token: process CPU time (engine loop + consumers) per output token.

Two workloads: ``tiny`` on h100-sxm, whose steps (~1 ms) are so short that the loop saturates - its tok/s is
the engine's capacity on one core; and ``deepseek-r1-distill-llama-8b`` on h100-sxm at real time, whose 8-16 ms
steps leave the loop mostly idle - its timing error is the scheduling precision under realistic load.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from exporters.serving.engine import GenerationRequest, SamplingParams
from exporters.serving.engines.sim import SimEngine, load_gpu_profile, load_model_profile

PROMPT = " ".join(f"w{i % 89:02d}x" for i in range(256))  # 256 one-token words, few shared prefix blocks


@dataclass
class Row:
    label: str
    streams: int
    tokens_per_s: float
    steps_per_s: float
    mean_batch: float
    err_p50_ms: float
    err_p99_ms: float
    err_mean_ms: float
    slips: int
    cpu_us_per_token: float


def _quantile(registry: CollectorRegistry, name: str, q: float) -> float:
    """``histogram_quantile`` over one unlabelled histogram: linear inside the bucket holding rank q."""
    buckets: list[tuple[float, float]] = []
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == f"{name}_bucket":
                buckets.append((float(s.labels["le"]), s.value))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    if total == 0:
        return 0.0
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return bound  # beyond the last boundary: only "more than" is known
            width = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / width if width else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound


async def _run(model: str, gpu: str, speed: float, streams: int, duration: float) -> Row:
    registry = CollectorRegistry()
    engine = SimEngine(load_model_profile(model), load_gpu_profile(gpu), registry=registry, speed=speed, seed=1)
    await engine.start()
    tokens = 0
    stop_at = time.monotonic() + duration
    counter = 0

    async def client(k: int) -> None:
        nonlocal tokens, counter
        while time.monotonic() < stop_at:
            counter += 1
            request = GenerationRequest(
                request_id=f"b{k}-{counter}",
                endpoint="completions",
                model=model,
                prompt=PROMPT,
                image_count=0,
                sampling=SamplingParams(max_tokens=128, ignore_eos=True),
                arrival_time=time.monotonic(),
            )
            stream = await engine.generate(request)
            async for event in stream:
                tokens += event.new_tokens

    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(client(k) for k in range(streams)))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    await engine.stop()

    def value(name: str) -> float:
        return registry.get_sample_value(name) or 0.0

    steps = value("loadlens_sim_step_duration_seconds_count")
    err_count = value("loadlens_sim_timing_error_seconds_count")
    return Row(
        label=f"{model}@{gpu} x{speed:g}",
        streams=streams,
        tokens_per_s=tokens / wall,
        steps_per_s=steps / wall,
        mean_batch=value("loadlens_sim_batch_size_sum") / steps if steps else 0.0,
        err_p50_ms=1e3 * _quantile(registry, "loadlens_sim_timing_error_seconds", 0.5),
        err_p99_ms=1e3 * _quantile(registry, "loadlens_sim_timing_error_seconds", 0.99),
        err_mean_ms=1e3 * value("loadlens_sim_timing_error_seconds_sum") / err_count if err_count else 0.0,
        slips=int(value("loadlens_sim_schedule_slips_total")),
        cpu_us_per_token=1e6 * cpu / tokens if tokens else 0.0,
    )


def _print(rows: Sequence[Row]) -> None:
    head = (
        f"{'workload':<44} {'streams':>7} {'tok/s':>9} {'steps/s':>8} {'batch':>6} "
        f"{'err p50 ms':>10} {'err p99 ms':>10} {'err mean':>8} {'slips':>5} {'CPU µs/tok':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.label:<44} {r.streams:>7} {r.tokens_per_s:>9.0f} {r.steps_per_s:>8.0f} {r.mean_batch:>6.1f} "
            f"{_ms(r.err_p50_ms):>10} {_ms(r.err_p99_ms):>10} {r.err_mean_ms:>8.3f} {r.slips:>5} "
            f"{r.cpu_us_per_token:>10.1f}"
        )
    print("err: wake-up lateness against the step deadlines; '>100' = beyond the histogram's last bucket.")


def _ms(value: float) -> str:
    return ">100" if value == float("inf") else f"{value:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sim_engine", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per row (default 6)")
    parser.add_argument("--quick", action="store_true", help="2 s per row")
    args, _ = parser.parse_known_args(argv)
    duration = 2.0 if args.quick else args.duration
    workloads = [("tiny", "h100-sxm", 1.0), ("deepseek-r1-distill-llama-8b", "h100-sxm", 1.0)]
    rows = [
        asyncio.run(_run(model, gpu, speed, streams, duration))
        for model, gpu, speed in workloads
        for streams in (64, 256)
    ]
    _print(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
