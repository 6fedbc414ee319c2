"""The golden ``benchmark_result.json``: every block of the file from a fixed store, and how to regenerate it.

Byte for byte, so a change of a key's order or of a number's form (``3`` or ``3.0``) shows, not only of its
value. The inputs touch every part of the typed model: a closed and an open stage beside a warmup, and (its
own document) a trace stage; two classes and two models; adapters, prefix groups, a conversation, a think
time and spread output lengths; server
figures (one stage's Prometheus unreachable); the over-saturation judgement with its trends; the workload's
turns; loop lag and CPU time. Regenerate after an intended change (and review the diff)::

    .venv/bin/python -m tests.loadgen.result_golden      # rewrites tests/fixtures/results/*/benchmark_result.json
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from loadgen.metrics import bucket_bounds
from loadgen.profile import Profile, parse_profile
from loadgen.record import RequestRecord
from loadgen.results import StageWindow, build_result, write_result
from loadgen.saturation import stage_blocks
from loadgen.store import Store
from loadlens.contracts.results import RESULT_FILE
from loadlens.contracts.slo import load_slos

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"
GOLDEN = {name: FIXTURES / name / RESULT_FILE for name in ("mix", "trace")}
"""One document per profile: a trace profile cannot hold the mix's traffic."""
TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
T0 = 1_800_000_000.0


def golden_profile() -> Profile:
    return parse_profile(
        {
            "version": 1,
            "name": "golden",
            "description": "every block of the result file",
            "traffic": [
                {
                    "name": "talk",
                    "weight": 3,
                    "priority": 0,
                    "prompt": {"tokens": {"mean": 48, "stdev": 16, "min": 16, "max": 96}},
                    "prefix": {"tokens": 256, "groups": [{"share": 0.6}, {"share": 0.3, "tokens": 128}]},
                    "conversation": {"turns": {"mean": 3, "stdev": 1, "min": 2, "max": 4}, "think_time_s": 0.5},
                },
                {
                    "name": "sum",
                    "weight": 1,
                    "priority": 10,
                    "endpoint": "completions",
                    "adapters": {"sql-lora": 2, "base": 1},
                    "output_tokens": {"mean": 32, "stdev": 8, "min": 8},
                    "think_time_s": {"mean": 0.25, "stdev": 0.1},
                },
            ],
            "stages": [
                {"name": "warmup", "users": 1, "until_requests": 2, "warmup": True},
                {"name": "c4", "users": 4, "duration": 10},
                {"name": "open", "rate": 2.5, "arrival": "poisson", "max_concurrency": 16, "duration": 10},
            ],
        },
    ).scaled(users=2.0, time=0.5)


def trace_profile() -> Profile:
    """A trace stage (a trace profile's traffic may not set prompts, prefixes or conversations)."""
    return parse_profile(
        {
            "version": 1,
            "name": "golden-trace",
            "traffic": [{"name": "rows", "endpoint": "completions"}],
            "stages": [
                {"name": "warmup", "users": 1, "until_requests": 2, "warmup": True},
                {"name": "replay", "trace": {"path": "mooncake.jsonl", "format": "mooncake", "speedup": 2, "end": 1}},
            ],
        },
        base=TRACES,
    ).scaled(time=0.5)


def _record(ttft: float, e2e: float, tokens: int, prompt: int) -> RequestRecord:
    gap = (e2e - ttft) / (tokens - 1)
    return RequestRecord(
        ttft=ttft, e2e=e2e, output_tokens=tokens, prompt_tokens=prompt, itl=[(gap, tokens - 1)], chunk_gaps=[gap]
    )


def golden_document(name: str) -> dict[str, Any]:
    # The SLO file's source as a path in the checkout, not this machine's absolute one: the file is the same
    # wherever the repository is cloned.
    slos = dataclasses.replace(load_slos(), source="loadlens/contracts/slos.yaml")
    profile = golden_profile() if name == "mix" else trace_profile()
    interactive, batch = slos.class_for_priority(0), slos.class_for_priority(10)
    store = Store(bucket_bounds(slos))
    ends = ("until_requests", "duration", "duration", "stopped")
    # the warmup too short to judge; the open stage's TTFT grows without bound
    windows = [
        StageWindow(i, s, T0 + 40 * i, T0 + 40 * i + (4.5 if i == 0 else 30.5), ends[i])
        for i, s in enumerate(profile.stages)
    ]
    for i, w in enumerate(windows):
        name = w.spec.name
        for k in range(15 + i):
            ttft = 0.04 + (0.06 if name == "open" else 0.01) * k + 0.05 * i
            store.record(
                _record(ttft, ttft + 0.5, 11, 40 + k),
                (name, interactive.name, "tiny"),
                interactive,
                now=w.start + min(1.9 * k + 1, w.duration),
            )
            store.workload.record(
                name, _record(ttft, ttft + 0.5, 11, 40 + k), shared=256 if k % 2 else 0, block_size=16, turn=1 + k % 3
            )
        for k in range(5):
            store.record(
                _record(0.3 + 0.1 * k, 2.0, 21, 300),
                (name, batch.name, "sql-lora" if k % 3 else "tiny"),
                batch,
                now=w.start + k + 1,
            )
        store.record(RequestRecord(outcome="server_error", reason="HTTP 500"), (name, batch.name, "tiny"), batch)
        store.record(RequestRecord(outcome="cancelled"), (name, interactive.name, "tiny"), interactive)
        store.window_tokens[name] = 100 + 10 * i
        store.cpu_seconds[name] = 0.25 * (i + 1)
        for k in range(3):
            store.lag(name).record(0.001 * (k + 1))
        stage = store.workload.stage(name)
        stage.conversations_started, stage.conversations_completed, stage.conversations_ended_early = 6, 4, 1
        for second in range(int(w.start), int(w.end) + 1):
            store.tokens_by_second[second] += 30 + second % 7
            store.queue_sample(name, second, 3 + (second - int(w.start)))
    server: dict[str, dict[str, Any]] = {
        "c4": {"window_seconds": 5, "queries": {"peak_vram_gib": "max(x)"}, "errors": [], "peak_vram_gib": 12.5,
               "mean_gpu_utilization_ratio": None, "gpu_utilization_peak_to_trough_ratio": 0.25,
               "server_mean_ttft_ms": 61.0, "server_p99_ttft_ms": 120.5, "server_output_throughput": 300.0,
               "server_peak_waiting_requests": 2.0, "lora_swap_blocked_requests": 0.0,
               "lora_swap_delayed_requests": 0.0, "slo_eligible_requests": 16.0, "prefix_cache_hit_ratio": 0.5,
               "prefix_cache_hit_tokens": 2048.0, "prefix_cache_query_tokens": 4096.0},
        "open": {"errors": ["Prometheus http://127.0.0.1:9 unreachable: refused"]},
    }  # fmt: skip
    run = {
        "run_id": "golden", "target": "http://127.0.0.1:8000", "model": "tiny", "profile": "golden", "seed": 7,
        "users_scale": 2.0, "time_scale": 0.5, "start_time": "2027-01-15T08:00:00.000Z",
        "end_time": "2027-01-15T08:00:16.500Z", "start_timestamp": T0, "end_timestamp": T0 + 16.5,
        "duration_s": 16.5, "completed": True, "mode": "local", "workers": 0, "hostname": "golden-host",
        "argv": ["--profile", "golden"], "versions": {"loadlens": "0.0.0", "locust": "2.0", "python": "3.11.2"},
    }  # fmt: skip
    validity = {"results_valid": False, "reasons": ["load generator CPU above 0.9"], "loadgen_cpu_peak_ratio": 0.95,
                "loadgen_cpu_mean_ratio": 0.5, "cpu_threshold_ratio": 0.9}  # fmt: skip
    return build_result(
        run=run,
        profile=profile,
        slos=slos,
        store=store,
        windows=windows,
        validity=validity,
        server=server,
        saturation=stage_blocks(store, windows, {"open": 4.0}),
    )


def main() -> int:
    for name, path in GOLDEN.items():
        print(f"wrote {write_result(path.parent, golden_document(name))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
