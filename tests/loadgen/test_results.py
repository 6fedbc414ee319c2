"""benchmark_result.json: vLLM-compatible keys, warmup excluded from overall, per-class figures, Jain's index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from loadgen.metrics import bucket_bounds
from loadgen.profile import parse_profile
from loadgen.record import RequestRecord
from loadgen.results import StageWindow, build_result, jain_index, pkey, write_result
from loadgen.store import Store
from loadlens.contracts.results import RESULT_FILE, parse_result
from loadlens.contracts.slo import load_slos
from tests.loadgen.result_golden import GOLDEN, golden_document

SLOS = load_slos()
PROFILE = parse_profile(
    {
        "version": 1,
        "name": "mix",
        "traffic": [
            {"name": "chat", "weight": 3, "priority": 0},
            {"name": "batch", "weight": 1, "priority": 10},
        ],
        "stages": [
            {"name": "warmup", "users": 1, "until_requests": 2, "warmup": True},
            {"name": "s1", "users": 2, "duration": 10},
        ],
    }
)
VLLM_KEYS = [
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    *[f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p50", "p99")],
    "p99.9_itl_ms",
]


def rec(ttft: float, n: int = 5, e2e: float = 0.2) -> RequestRecord:
    gap = (e2e - ttft) / (n - 1)
    return RequestRecord(ttft=ttft, e2e=e2e, output_tokens=n, prompt_tokens=4, itl=[(gap, n - 1)], chunk_gaps=[gap])


def build() -> dict[str, Any]:
    store = Store(bucket_bounds(SLOS))
    interactive, batch = SLOS.class_for_priority(0), SLOS.class_for_priority(10)
    for _ in range(3):
        store.record(rec(5.0), ("warmup", "interactive", "m"), interactive)  # cold start: must not leak
    for _ in range(30):
        store.record(rec(0.05), ("s1", "interactive", "m"), interactive)
    for _ in range(10):
        store.record(rec(0.5, n=11, e2e=1.0), ("s1", "batch", "m"), batch)
    store.record(RequestRecord(outcome="server_error", reason="HTTP 500"), ("s1", "batch", "m"), batch)
    store.window_tokens["s1"] = 300
    store.tokens_by_second.update({1000: 20, 1001: 35, 1005: 99})
    windows = [
        StageWindow(0, PROFILE.stages[0], 990.0, 1000.0, "until_requests"),
        StageWindow(1, PROFILE.stages[1], 1000.0, 1002.0, "duration"),
    ]
    return build_result(
        run={"run_id": "r"}, profile=PROFILE, slos=SLOS, store=store, windows=windows, validity={"results_valid": True}
    )


def test_vllm_compatible_keys_and_values() -> None:
    doc = build()
    s1 = doc["stages"][1]
    for key in VLLM_KEYS:
        assert key in s1 and key in doc["overall"], key
    assert s1["completed"] == 40 and s1["failed"] == 1
    assert s1["duration"] == 2.0
    assert s1["request_throughput"] == 20.0
    assert s1["output_throughput"] == 130.0
    assert s1["total_token_throughput"] == 210.0
    assert s1["delivered_output_throughput"] == 150.0
    assert s1["max_output_tokens_per_s"] == 35
    assert s1["failure_reasons"] == {"HTTP 500": 1}
    assert s1["p50_ttft_ms"] == pytest.approx(50.0, rel=5e-4)
    assert s1["mean_ttft_ms"] == pytest.approx((30 * 50 + 10 * 500) / 40)
    assert s1["mean_tpot_ms"] == pytest.approx((30 * 37.5 + 10 * 50) / 40)


def test_warmup_is_reported_but_excluded_from_overall() -> None:
    doc = build()
    assert doc["stages"][0]["warmup"] and doc["stages"][0]["completed"] == 3
    assert doc["overall"]["stages"] == ["s1"]
    assert doc["overall"]["completed"] == 40
    assert doc["overall"]["max_ttft_ms"] == pytest.approx(500.0)  # the 5 s warmup TTFTs are not in it


def test_classes_goodput_and_fairness() -> None:
    doc = build()
    classes = doc["overall"]["classes"]
    assert set(classes) == {"interactive", "batch"}
    assert classes["batch"]["p99_ttft_ms"] == pytest.approx(500.0, rel=5e-4)
    # batch (TTFT SLO 2.5 s) met everything; interactive requests at 50 ms TTFT too.
    assert doc["overall"]["request_goodput"] == 20.0
    # Normalised throughput = output tokens per second of request time: interactive 150 tok / 6 s = 25,
    # batch 110 tok / 10 s = 11, so J = (25 + 11)^2 / (2 * (25^2 + 11^2)).
    expected = 36**2 / (2 * (25**2 + 11**2))
    assert doc["overall"]["jain_fairness_index"] == pytest.approx(expected, rel=1e-5)
    assert doc["stages"][1]["jain_fairness_index"] == pytest.approx(expected, rel=1e-5)
    assert doc["stages"][0]["jain_fairness_index"] is None  # only one class ran in the warmup


def test_jain_index_and_percentile_keys() -> None:
    assert jain_index([1, 1, 1]) == 1.0
    assert jain_index([1, 0]) == 0.5
    assert jain_index([5]) is None
    assert (pkey(99.0), pkey(99.9), pkey(50.0)) == ("p99", "p99.9", "p50")


def test_written_file_is_strict_json(tmp_path: Path) -> None:
    doc = build()
    doc["stages"][0]["extra"] = None
    path = write_result(tmp_path / "run", doc)
    assert path.name == RESULT_FILE
    loaded = json.loads(path.read_text())
    assert loaded["schema"] == "loadlens.benchmark_result" and loaded["schema_version"] == 1
    assert loaded["stages"][0]["mean_dispatch_lag_ms"] is None  # no NaN in the file: nulls
    assert [r["stage"] for r in loaded["summary_table"]] == ["s1"]


def test_the_written_document_is_the_typed_model() -> None:
    """What build_result writes parses as the contract's model, figure for figure."""
    doc = build()
    result = parse_result(json.loads(json.dumps(doc)))
    assert result.model_dump(by_alias=True, exclude_unset=True) == doc
    assert result.stages[1].p99_9_ttft_ms == doc["stages"][1]["p99.9_ttft_ms"]


def test_a_key_the_model_does_not_declare_is_refused_at_write_time() -> None:
    """A writer that adds a key without declaring (and documenting) it fails at once, not in a reader."""
    with pytest.raises(ValidationError, match=r"run\.hostnme\n  Extra inputs are not permitted"):
        build_result(
            run={"run_id": "r", "hostnme": "typo"}, profile=PROFILE, slos=SLOS, store=Store(bucket_bounds(SLOS)),
            windows=[], validity={"results_valid": True},
        )  # fmt: skip


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_file_is_byte_for_byte_the_golden_one(name: str, tmp_path: Path) -> None:
    """Key order and number forms too, over every block of the file (tests/loadgen/result_golden.py)."""
    path = write_result(tmp_path, golden_document(name))
    regenerate = "regenerate with: .venv/bin/python -m tests.loadgen.result_golden"
    assert path.read_text() == GOLDEN[name].read_text(), regenerate


def test_a_bad_block_from_a_caller_is_named_by_its_place_in_the_document() -> None:
    """Server figures and the over-saturation block come as mappings: their errors name the stage's place."""
    windows = [StageWindow(0, PROFILE.stages[0], 990.0, 1000.0), StageWindow(1, PROFILE.stages[1], 1000.0, 1002.0)]
    args: dict[str, Any] = dict(
        run={"run_id": "r"}, profile=PROFILE, slos=SLOS, store=Store(bucket_bounds(SLOS)), windows=windows,
        validity={"results_valid": True},
    )  # fmt: skip
    with pytest.raises(ValidationError, match=r"stages\.1\.server\.peak_vram_gb\n  Extra inputs are not permitted"):
        build_result(**args, server={"s1": {"peak_vram_gb": 1.0}})
    with pytest.raises(ValidationError, match=r"stages\.0\.saturation\.verdict\n  Input should be 'over_saturated'"):
        build_result(**args, saturation={"warmup": {"verdict": "maybe", "reason": "", "mode": "open", "alpha": 0.01}})
