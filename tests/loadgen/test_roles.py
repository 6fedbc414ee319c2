"""Each role's own behaviour, on a stand-in Locust environment (the roles import gevent, never locust).

Nothing here calls ``start()``: no background loops, no /metrics server; the tests drive the listeners and
the shape's tick directly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import configargparse
import pytest

from loadgen.exchange import DRAIN_MESSAGE, REPORT_KEY, progress_message, stage_message, worker_report
from loadgen.options import add_locust_arguments
from loadgen.record import RequestRecord
from loadgen.roles import LocalRole, MasterRole, WorkerRole
from loadgen.roles import local as local_role
from loadgen.stage_clock import DRAIN
from loadgen.store import Store
from tests.loadgen.conftest import write_profile

PROFILE: dict[str, Any] = {
    "seed": 5,
    "traffic": [{"name": "chat", "weight": 1, "prompt": {"tokens": 8}, "output_tokens": 4}],
    "stages": [
        {"name": "s1", "users": 3, "duration": 10},
        {"name": "count", "users": 2, "until_requests": 4, "max_duration": 60},
        {"name": "open", "rate": 8, "arrival": "constant", "max_concurrency": 16, "duration": 10},
    ],
}


class FakeRunner:
    def __init__(self, clients: tuple[str, ...] = ()) -> None:
        self.user_count = 0
        self.clients = {c: SimpleNamespace(id=c) for c in clients}
        self.worker_index = 0
        self.sent: list[tuple[str, dict[str, Any], str | None]] = []
        self.stats = SimpleNamespace(reset_all=lambda: self.sent.append(("reset_all", {}, None)))

    @property
    def worker_count(self) -> int:
        return len(self.clients)

    def get_worker_index(self, client_id: str) -> int:
        return sorted(self.clients).index(client_id)

    def send_message(self, kind: str, data: dict[str, Any], client_id: str | None = None) -> None:
        self.sent.append((kind, data, client_id))


def environment(tmp_path: Path, runner: FakeRunner, *argv: str) -> Any:
    profile = write_profile(tmp_path / "p.yaml", PROFILE)
    parser = configargparse.ArgumentParser()
    add_locust_arguments(parser)
    opts = parser.parse_args(
        ["--load-profile", str(profile), "--results", str(tmp_path / "results"), "--model", "m", *argv]
    )
    return SimpleNamespace(parsed_options=opts, host="http://127.0.0.1:9", runner=runner, process_exit_code=None)


def make(kind: type[Any], tmp_path: Path, runner: FakeRunner, *argv: str) -> Any:
    return kind(environment(tmp_path, runner, *argv), report_interval=3.0, locust_version="9.9")


def record(role: Any, stage: str, n: int = 1) -> None:
    cls = role.classes["chat"]
    for _ in range(n):
        role.store.record(RequestRecord(ttft=0.05, e2e=0.08, output_tokens=4), (stage, cls.name, "m"), cls)


# --- worker ---------------------------------------------------------------------------------------------------


def test_worker_follows_stage_messages_with_its_share(tmp_path: Path) -> None:
    worker = make(WorkerRole, tmp_path, FakeRunner())
    worker.executor.model = ""
    worker.on_stage_message(None, SimpleNamespace(data=stage_message(2, time.time(), 2, 1, "served")))
    assert (worker.dispatch.index, worker.recorder.window, worker.model) == (2, "open", "served")
    schedule = worker.dispatch.schedule
    assert schedule is not None and schedule.rate == 4.0  # half of 8 req/s
    assert schedule.next_at == pytest.approx(worker.dispatch.started_perf + 1 / 8)  # interleaved with worker 0
    worker.on_stage_message(None, SimpleNamespace(data=stage_message(0, time.time(), 2, 1, "other")))
    assert (worker.recorder.window, worker.model) == ("s1", "served")  # the first model sticks
    worker.on_stage_message(None, SimpleNamespace(data=DRAIN_MESSAGE))
    assert worker.recorder.window == DRAIN and set(worker.store.cpu_seconds) == {"s1", "open"}


def test_worker_ships_its_delta_with_every_report(tmp_path: Path) -> None:
    worker = make(WorkerRole, tmp_path, FakeRunner())
    record(worker, "s1", 2)
    worker.recorder.in_flight = 3
    data: dict[str, Any] = {}
    worker.on_report_to_master("w1", data)
    doc = data[REPORT_KEY]
    assert doc["in_flight"] == 3 and Store.from_wire(worker.bounds, doc["store"]).finished("s1") == 2
    assert worker.store.finished() == 0  # the next report starts from zero
    assert worker.measuring() is True


def test_worker_reports_progress_only_in_request_count_stages_and_on_change(tmp_path: Path) -> None:
    worker = make(WorkerRole, tmp_path, FakeRunner())
    worker.recorder.finished_by_stage["s1"] = 5
    assert worker.progress_update(-1) is None  # a duration stage: the reports are enough
    worker.on_stage_message(None, SimpleNamespace(data=stage_message(1, time.time(), 1, 0, "m")))
    assert worker.progress_update(-1) == progress_message("count", 0)
    worker.recorder.finished_by_stage["count"] = 2
    assert worker.progress_update(0) == progress_message("count", 2)
    assert worker.progress_update(2) is None


# --- local ----------------------------------------------------------------------------------------------------


def test_local_clock_runs_the_stages_then_writes_the_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = FakeRunner()
    local = make(LocalRole, tmp_path, runner, "--run-id", "r1")
    assert local.tick() == (3, 100.0)  # begins the run on the first tick
    assert (local.begun, local.live.current_stage, local.run_id) == (True, "s1", "r1")
    assert ("s1", "interactive", "m") in local.store.series  # label sets exported from the start
    local.clock.window_start -= 10.0  # s1's 10 s are over
    assert local.tick() == (2, 100.0)
    assert (local.clock.index, local.dispatch.index, local.recorder.window) == (1, 1, "count")
    record(local, "count", 4)
    local.clock.window_start -= 0.5
    assert local.tick() == (16, 100.0)  # 4 requests: the count stage is over; the open stage's pool
    local.clock.window_start -= 10.0
    assert local.tick() is None  # the last stage ended and no user is left: local ends at once
    assert local.finished and local.recorder.window == DRAIN and local.tick() is None
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "loadgen: stage s1 (1/3): 3 users",
        "loadgen: stage count (2/3): 2 users",
        "loadgen: stage open (3/3): 8 req/s constant (pool 16)",
        "loadgen: last stage done; letting in-flight requests finish",
    ]
    assert [(w.spec.name, w.end_reason) for w in local.clock.windows] == [
        ("s1", "duration"), ("count", "until_requests"), ("open", "duration"),
    ]  # fmt: skip
    local.on_test_stop(local.env)
    assert local.env.process_exit_code == 0 and not local.begun
    doc = json.loads((tmp_path / "results" / "r1" / "benchmark_result.json").read_text())
    assert {k: doc["run"][k] for k in ("run_id", "mode", "workers", "completed", "model", "seed")} == {
        "run_id": "r1", "mode": "local", "workers": 0, "completed": True, "model": "m", "seed": 5,
    }  # fmt: skip
    assert doc["run"]["versions"]["locust"] == "9.9"


def test_local_stop_mid_stage_marks_it_stopped_and_invalid_cpu_exits_3(tmp_path: Path) -> None:
    local = make(LocalRole, tmp_path, FakeRunner(), "--run-id", "r2", "--cpu-threshold", "0.5")
    local.begin()
    local.clock.window_start -= 2.0
    local.cpu.peak = 0.75
    local.after_cpu_sample()
    assert local.live.results_valid is False and local.cpu_guard.valid is False
    local.on_test_stop(local.env)
    doc = json.loads((tmp_path / "results" / "r2" / "benchmark_result.json").read_text())
    assert doc["run"]["completed"] is False and doc["stages"][0]["end_reason"] == "stopped"
    assert doc["validity"]["results_valid"] is False and local.env.process_exit_code == 3


def test_local_fatal_target_ends_at_the_first_tick(tmp_path: Path) -> None:
    local = make(LocalRole, tmp_path, FakeRunner())
    assert local.check_target().startswith("loadlens: error: cannot reach target http://127.0.0.1:9: ")
    local.fatal = "unreachable"
    assert local.tick() is None and not local.begun


# --- master ---------------------------------------------------------------------------------------------------


def test_master_tells_each_worker_once_including_late_joiners(tmp_path: Path) -> None:
    runner = FakeRunner(("a", "b"))
    master = make(MasterRole, tmp_path, runner)
    master.begin()
    start = master.clock.window_start
    assert runner.sent == [
        ("loadlens_stage", stage_message(0, start, 2, 0, "m"), "a"),
        ("loadlens_stage", stage_message(0, start, 2, 1, "m"), "b"),
    ]
    master.tick()
    assert len(runner.sent) == 2  # nothing new to say
    runner.clients["c"] = SimpleNamespace(id="c")
    master.tick()
    assert runner.sent[2:] == [("loadlens_stage", stage_message(0, start, 3, 2, "m"), "c")]


def test_master_merges_reports_and_counts_with_progress_messages(tmp_path: Path) -> None:
    master = make(MasterRole, tmp_path, FakeRunner(("a", "b")))
    master.begin()
    sender = Store(master.bounds)
    cls = master.classes["chat"]
    sender.record(RequestRecord(ttft=0.05, e2e=0.08, output_tokens=4), ("count", cls.name, "m"), cls)
    master.on_worker_report("a", {REPORT_KEY: worker_report(sender, 0.4, 0.6, 0.3, 2)})
    master.on_worker_report("b", {"other": 1})  # a report without our payload is ignored
    assert master.store.finished("count") == 1
    assert (master.cpu_now(), master.cpu_peak(), master.cpu_mean(), master.in_flight()) == (0.4, 0.6, 0.3, 2)
    assert master.finished_count("count") == 1
    master.on_progress_message(None, SimpleNamespace(node_id="a", data=progress_message("count", 3)))
    master.on_progress_message(None, SimpleNamespace(node_id="b", data=progress_message("count", 2)))
    assert master.finished_count("count") == 5  # the workers' messages run ahead of their reports
    assert (master.worker_count(), master.mode) == (2, "distributed")


def test_master_drain_tells_the_workers_and_waits_for_their_last_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = FakeRunner(("a",))
    master = make(MasterRole, tmp_path, runner)
    master.begin()
    now = time.time()
    # The role's wall clock stands still from here: the drain rule compares it with the drain's start.
    monkeypatch.setattr(local_role, "time", SimpleNamespace(time=lambda: now, monotonic=time.monotonic))
    master.clock.advance(now, "duration")
    master.clock.advance(now, "until_requests")
    assert master.clock.advance(now, "duration") is False
    master.start_drain()
    assert runner.sent[-1] == ("loadlens_stage", DRAIN_MESSAGE, None)
    assert master.tick() == (0, 1000.0)  # no user left, but the last report is up to 3 s away
    master.clock.draining_since = now - 3.6
    assert master.tick() is None and master.finished
