"""The worker role: sends requests, follows the master's stage messages, ships its measurements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gevent

from loadgen.exchange import PROGRESS_MESSAGE, REPORT_KEY, STAGE_MESSAGE, StageOrder, progress_message, worker_report
from loadgen.roles.base import Role

if TYPE_CHECKING:
    from locust.env import Environment

PROGRESS_INTERVAL_S = 0.25


class WorkerRole(Role):
    """No clock of its own: stages arrive as messages; every report carries the store's delta to the master."""

    def start(self) -> None:
        super().start()
        runner = self.env.runner
        assert runner is not None
        runner.register_message(STAGE_MESSAGE, self.on_stage_message)
        self.env.events.report_to_master.add_listener(self.on_report_to_master)  # type: ignore[no-untyped-call]
        gevent.spawn(self._progress_to_master_loop)

    def measuring(self) -> bool:
        return True  # the master decides what belongs to the run; a worker ships everything

    def after_cpu_sample(self) -> None:
        self.cpu_time.charge(self.store, self.recorder.window)
        self.cpu.active = self.env.runner is not None and self.env.runner.user_count > 0

    def on_test_start(self, environment: Environment, **kwargs: Any) -> None:
        self.cpu.active = True

    def on_test_stop(self, environment: Environment, **kwargs: Any) -> None:
        pass  # the master writes the results

    def on_stage_message(self, environment: Environment, msg: Any, **kwargs: Any) -> None:
        order = StageOrder.parse(msg.data)
        if order.drain:
            self.enter_drain()
            return
        if order.model and not self.executor.model:
            self.executor.model = order.model
        self.apply_stage(order.index, order.start, share=order.share, worker_index=order.worker_index)

    def on_report_to_master(self, client_id: str, data: dict[str, Any], **kwargs: Any) -> None:
        data[REPORT_KEY] = worker_report(
            self.store, self.cpu.current, self.cpu.peak, self.cpu.mean, self.recorder.in_flight
        )

    def progress_update(self, sent: int) -> dict[str, Any] | None:
        """The progress message to send now (a request-count stage whose count changed), else None."""
        stage = self.dispatch.stage
        if stage.until_requests is None:
            return None
        n = self.recorder.finished_by_stage[stage.name]
        return None if n == sent else progress_message(stage.name, n)

    def _progress_to_master_loop(self) -> None:
        """During request-count stages, tell the master how many requests finished, 4 times a second."""
        sent = -1
        while True:
            gevent.sleep(PROGRESS_INTERVAL_S)
            runner = self.env.runner
            update = self.progress_update(sent) if runner is not None else None
            if update is not None and runner is not None:
                runner.send_message(PROGRESS_MESSAGE, update)
                sent = int(update["finished"])
