"""What the master and its workers tell each other (Locust messages and the report payload).

master → worker ``loadlens_stage``: the stage to enter (index, wall-clock start, worker count, the worker's
index, the default model), or ``{"drain": true}`` after the last stage.
worker → master ``loadlens_progress``: requests finished in a request-count stage, 4 times a second.
worker → master report (every 3 s, key ``loadlens``): the store's delta, CPU and requests in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadgen.store import Store

STAGE_MESSAGE = "loadlens_stage"
PROGRESS_MESSAGE = "loadlens_progress"
REPORT_KEY = "loadlens"


def stage_message(index: int, start: float, workers: int, worker_index: int, model: str) -> dict[str, Any]:
    return {"index": index, "start": start, "workers": workers, "worker_index": worker_index, "model": model}


DRAIN_MESSAGE: dict[str, Any] = {"drain": True}


@dataclass(frozen=True)
class StageOrder:
    """A stage message as a worker applies it: its share of open-loop rates is 1/workers."""

    drain: bool
    index: int = 0
    start: float = 0.0
    share: float = 1.0
    worker_index: int = 0
    model: str = ""

    @classmethod
    def parse(cls, data: dict[str, Any]) -> StageOrder:
        if data.get("drain"):
            return cls(drain=True)
        return cls(
            drain=False,
            index=int(data["index"]),
            start=float(data["start"]),
            share=1.0 / max(1, int(data["workers"])),
            worker_index=int(data.get("worker_index", 0)),
            model=str(data.get("model") or ""),
        )


def progress_message(stage: str, finished: int) -> dict[str, Any]:
    return {"stage": stage, "finished": finished}


def parse_progress(data: dict[str, Any]) -> tuple[str, int]:
    return str(data["stage"]), int(data["finished"])


def worker_report(store: Store, cpu: float, cpu_peak: float, cpu_mean: float, in_flight: int) -> dict[str, Any]:
    """The report payload; takes the store's delta (the store starts empty again)."""
    return {"store": store.take_delta(), "cpu": cpu, "cpu_peak": cpu_peak, "cpu_mean": cpu_mean, "in_flight": in_flight}


def worker_stats(doc: dict[str, Any]) -> dict[str, float]:
    """The figures of a report the master keeps per worker (the latest report wins)."""
    return {
        "cpu": float(doc.get("cpu", 0.0)),
        "cpu_peak": float(doc.get("cpu_peak", 0.0)),
        "cpu_mean": float(doc.get("cpu_mean", 0.0)),
        "in_flight": float(doc.get("in_flight", 0)),
    }
