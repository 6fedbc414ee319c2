"""The master role: the local role's clock and output, but the requests are the workers'.

It tells every worker (late joiners too) which stage runs, merges their report deltas into its store, and
counts request-count stages with the workers' faster progress messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from loadgen.exchange import (
    DRAIN_MESSAGE,
    PROGRESS_MESSAGE,
    REPORT_KEY,
    STAGE_MESSAGE,
    parse_progress,
    stage_message,
    worker_stats,
)
from loadgen.roles.local import LocalRole
from loadgen.store import Store

if TYPE_CHECKING:
    from locust.env import Environment
    from locust.runners import MasterRunner


class MasterRole(LocalRole):
    mode = "distributed"
    sends_requests = False  # the workers sample what they hold; their samples arrive in the store deltas
    awaits_reports = True  # the users' last measurements arrive with the next worker report

    def __init__(self, environment: Environment, *, report_interval: float, locust_version: str) -> None:
        super().__init__(environment, report_interval=report_interval, locust_version=locust_version)
        self.worker_stats: dict[str, dict[str, float]] = {}
        self.worker_progress: dict[str, dict[str, int]] = {}
        self.notified: set[str] = set()
        self.cpu_peak_workers = 0.0

    @property
    def runner(self) -> MasterRunner:
        return cast("MasterRunner", self.env.runner)

    def start(self) -> None:
        self.env.events.worker_report.add_listener(self.on_worker_report)  # type: ignore[no-untyped-call]
        self.runner.register_message(PROGRESS_MESSAGE, self.on_progress_message)
        super().start()

    # --- the local role's hooks -----------------------------------------------------------------------------

    def worker_count(self) -> int:
        return self.runner.worker_count

    def cpu_now(self) -> float:
        return max([self.cpu.current] + [w["cpu"] for w in self.worker_stats.values()])

    def cpu_peak(self) -> float:
        return max(self.cpu.peak, self.cpu_peak_workers)

    def cpu_mean(self) -> float:
        means = [w["cpu_mean"] for w in self.worker_stats.values()]
        return max(means) if means else self.cpu.mean

    def in_flight(self) -> int:
        return self.recorder.in_flight + int(sum(w["in_flight"] for w in self.worker_stats.values()))

    def finished_count(self, stage: str) -> int:
        """The merged store, or the workers' faster progress messages."""
        from_workers = sum(p.get(stage, 0) for p in self.worker_progress.values())
        return max(self.store.finished(stage), from_workers)

    def reset_run(self) -> None:
        self.cpu_peak_workers = 0.0

    def stage_entered(self) -> None:
        self.notified = set()
        self.notify_workers()

    def each_tick(self) -> None:
        self.notify_workers()

    def start_drain(self) -> None:
        super().start_drain()
        self.runner.send_message(STAGE_MESSAGE, DRAIN_MESSAGE)

    # --- exchange -------------------------------------------------------------------------------------------

    def notify_workers(self) -> None:
        """Tell every worker that has not heard it yet about the current stage (late joiners too)."""
        runner = self.runner
        workers = max(1, runner.worker_count)
        for client in list(runner.clients.values()):
            if client.id in self.notified:
                continue
            self.notified.add(client.id)
            message = stage_message(
                self.clock.index,
                self.clock.window_start,
                workers,
                runner.get_worker_index(client.id),  # type: ignore[no-untyped-call]
                self.model,
            )
            runner.send_message(STAGE_MESSAGE, message, client_id=client.id)

    def on_worker_report(self, client_id: str, data: dict[str, Any], **kwargs: Any) -> None:
        doc = data.get(REPORT_KEY)
        if not doc:
            return
        self.store.merge(Store.from_wire(self.bounds, doc["store"]))
        self.worker_stats[client_id] = worker_stats(doc)
        self.cpu_peak_workers = max(self.cpu_peak_workers, self.worker_stats[client_id]["cpu_peak"])

    def on_progress_message(self, environment: Environment, msg: Any, **kwargs: Any) -> None:
        stage, finished = parse_progress(msg.data)
        self.worker_progress.setdefault(msg.node_id, {})[stage] = finished
