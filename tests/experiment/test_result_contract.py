"""experiment_result.json's typed model: a written document round-trips, an undeclared key or another schema
is refused naming the key; the server sampler's exposition parsing and window summary."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import loadlens.contracts.experiment_result as contract
from loadlens.contracts.experiment_result import (
    ExperimentInfo,
    ExperimentResult,
    ExperimentResultError,
    ServerInfo,
    Trial,
    TrialRun,
    parse_experiment_result,
)
from loadlens.experiment.figures import aggregate, extract_figures
from loadlens.experiment.sampler import ServerSampler, parse_exposition
from tests.support.paths import ROOT


def result() -> ExperimentResult:
    return ExperimentResult(
        run_id="r",
        experiment=ExperimentInfo(
            name="x",
            source="x.yaml",
            sha256="0" * 64,
            repeats=1,
            time_scale=1.0,
            users_scale=1.0,
            analysis="table",
            parameters={"ws": [1, 2]},
        ),  # fmt: skip
        server=ServerInfo(mode="sim", target="http://127.0.0.1:1"),
        start_time="2026-12-01T00:00:00.00Z",
        trials=[Trial(index=0, name="a", profile="p", params={"w": 1}, knobs={"batching_window_us": 1})],
    )


def test_round_trip_and_schema() -> None:
    doc = result().dump()
    assert doc["schema"] == "loadlens.experiment_result" and doc["schema_version"] == 1
    assert parse_experiment_result(doc) == result()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": 1}, "<memory>: extra: Extra inputs are not permitted"),
        ({"schema": "other"}, "<memory>: schema: String should match pattern '^loadlens.experiment_result$'"),
        ({"schema_version": 2}, "<memory>: schema_version: Input should be less than or equal to 1"),
        ({"trials": [{"index": 0}]}, "<memory>: trials.0.name: Field required"),
    ],
)
def test_bad_documents_name_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ExperimentResultError) as err:
        parse_experiment_result({**result().dump(), **change})
    assert str(err.value) == message


def test_exposition_sums_label_sets() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="a"} 3.0\n'
        'vllm:num_requests_running{engine="0",model_name="b"} 2.0\n'
        "vllm:num_requests_waiting 7.0\n"
        'vllm:num_preemptions_total{engine="0",model_name="a"} 11.0\n'
        'vllm:num_requests_running_other{x="1"} 100\n'
    )
    assert parse_exposition(text) == {"running": 5.0, "waiting": 7.0, "preemptions": 11.0}


def test_summary_keeps_only_samples_inside_the_windows() -> None:
    sampler = ServerSampler("http://127.0.0.1:9")
    sampler.samples = [
        (1.0, {"running": 100.0, "waiting": 0.0, "preemptions": 0.0}),
        (10.0, {"running": 4.0, "waiting": 2.0, "preemptions": 5.0}),
        (11.0, {"running": 6.0, "waiting": 4.0, "preemptions": 9.0}),
        (30.0, {"running": 100.0, "waiting": 100.0, "preemptions": 50.0}),
    ]
    s = sampler.summary([(9.5, 12.0)])
    assert (s.samples, s.mean_running, s.peak_running, s.mean_waiting, s.peak_waiting, s.preemptions) == (
        2, 5.0, 6.0, 3.0, 4.0, 4.0)  # fmt: skip


def test_figures_and_their_aggregate_over_repeats() -> None:
    doc = {
        "overall": {"completed": 90, "failed": 10, "outcomes": {"success": 90, "rate_limited": 4, "server_error": 6},
                    "p99_e2el_ms": 12.5, "mean_ttft_ms": None, "classes": {"batch": {"completed": 9}}},
        "stages": [{"warmup": True, "server": {"peak_vram_gib": 99.0}},
                   {"warmup": False, "server": {"peak_vram_gib": 8.0, "server_mean_ttft_ms": 4.0}},
                   {"warmup": False, "server": {"peak_vram_gib": 9.0, "server_mean_ttft_ms": 6.0}}],
    }  # fmt: skip
    figs = extract_figures(doc)
    assert figs["error_ratio"] == 0.1 and figs["rate_limited_ratio"] == 0.04 and figs["server_error_ratio"] == 0.06
    assert figs["batch.completed"] == 9.0 and figs["mean_ttft_ms"] is None
    assert figs["server.peak_vram_gib"] == 9.0 and figs["server.server_mean_ttft_ms"] == 5.0
    runs = [
        TrialRun(repeat=k, run_id=f"r{k}", result_path="x", log_path="y", exit_code=0, completed=True,
                 start_timestamp=0.0, end_timestamp=1.0, duration_s=1.0, figures={"p99_e2el_ms": v})
        for k, v in ((1, 10.0), (2, 14.0))
    ]  # fmt: skip
    stat = aggregate(runs)["p99_e2el_ms"]
    assert (stat.mean, stat.std, stat.min, stat.max, stat.n, stat.values) == (12.0, 2.8284271247461903, 10.0, 14.0, 2,
                                                                                [10.0, 14.0])  # fmt: skip


def test_docs_name_every_key() -> None:
    """docs/experiments.md names every key of every model of experiment_result.json."""
    text = (ROOT / "docs" / "experiments.md").read_text()
    models = [v for v in vars(contract).values() if isinstance(v, type) and issubclass(v, BaseModel)]
    missing = sorted(
        f"{m.__name__}.{f.alias or name}"
        for m in models
        for name, f in m.model_fields.items()
        if f"`{f.alias or name}`" not in text
    )
    assert missing == []
