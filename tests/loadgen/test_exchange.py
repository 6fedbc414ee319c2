"""Master/worker messages: stage orders, progress, and report deltas that merge exactly."""

from __future__ import annotations

from loadgen.exchange import (
    DRAIN_MESSAGE,
    StageOrder,
    parse_progress,
    progress_message,
    stage_message,
    worker_report,
    worker_stats,
)
from loadgen.metrics import bucket_bounds
from loadgen.record import RequestRecord
from loadgen.store import Store
from loadlens.contracts.slo import load_slos


def test_stage_message_round_trip_gives_the_worker_its_share() -> None:
    msg = stage_message(2, 1700.5, 4, 3, "m")
    assert msg == {"index": 2, "start": 1700.5, "workers": 4, "worker_index": 3, "model": "m"}
    assert StageOrder.parse(msg) == StageOrder(
        drain=False, index=2, start=1700.5, share=0.25, worker_index=3, model="m"
    )
    assert StageOrder.parse({"index": 0, "start": 1.0, "workers": 0}) == StageOrder(drain=False, start=1.0)
    assert StageOrder.parse(DRAIN_MESSAGE) == StageOrder(drain=True)


def test_progress_round_trip() -> None:
    assert parse_progress(progress_message("warmup", 17)) == ("warmup", 17)


def test_worker_report_takes_the_delta_and_merges_exactly() -> None:
    slos = load_slos(None)
    bounds = bucket_bounds(slos)
    cls = slos.class_for_priority(0)
    worker, master = Store(bounds), Store(bounds)
    worker.record(RequestRecord(ttft=0.05, e2e=0.1, output_tokens=3), ("s", cls.name, "m"), cls)
    worker.window_tokens["s"] += 3
    report = worker_report(worker, 0.5, 0.75, 0.25, 2)
    assert {k: report[k] for k in ("cpu", "cpu_peak", "cpu_mean", "in_flight")} == {
        "cpu": 0.5, "cpu_peak": 0.75, "cpu_mean": 0.25, "in_flight": 2,
    }  # fmt: skip
    assert worker.finished() == 0 and worker.window_tokens == {}  # shipped once, never twice
    master.merge(Store.from_wire(bounds, report["store"]))
    assert master.finished("s") == 1 and master.window_tokens == {"s": 3}
    assert worker_stats(report) == {"cpu": 0.5, "cpu_peak": 0.75, "cpu_mean": 0.25, "in_flight": 2.0}
    assert worker_stats({}) == {"cpu": 0.0, "cpu_peak": 0.0, "cpu_mean": 0.0, "in_flight": 0.0}
