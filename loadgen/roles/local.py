"""The local role (one process): the stage clock, requests, /metrics, progress lines and the results.

The master role extends it. The shape's ``tick`` advances the clock; after the last stage the users are
stopped gracefully (each finishes its request, bounded by the profile's ``stop_timeout_s``), then the test
ends and ``test_stop`` writes the results.
"""

from __future__ import annotations

import logging
import platform
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent
from gevent.pywsgi import WSGIServer
from prometheus_client import CollectorRegistry, make_wsgi_app

from loadgen import __version__
from loadgen.cpu_guard import CpuGuard, cpu_threshold
from loadgen.metrics import LiveState, LoadgenCollector
from loadgen.options import default_run_id
from loadgen.probe import TargetUnreachable, first_model
from loadgen.progress import progress_line
from loadgen.results import build_result, class_shares, fairness, iso, write_result
from loadgen.roles.base import Role
from loadgen.saturation import END_REASON, Watch, stage_blocks
from loadgen.serverside import figures_for_stages
from loadgen.stage_clock import StageClock, drain_limit, drain_verdict, spawn_rate
from loadgen.store import Store
from loadgen.summary import stage_table

if TYPE_CHECKING:
    from locust.env import Environment

log = logging.getLogger("loadlens.loadgen")

UNTIL_REQUESTS_POLL_S = 0.02
UNTIL_REQUESTS_POLL_FOR_S = 0.9


class LocalRole(Role):
    mode = "local"
    """``run.mode`` in benchmark_result.json."""
    awaits_reports = False
    """Whether the drain waits for a last worker report after the users stopped."""

    def __init__(self, environment: Environment, *, report_interval: float, locust_version: str) -> None:
        super().__init__(environment, report_interval=report_interval, locust_version=locust_version)
        self.cpu_guard = CpuGuard(cpu_threshold(self.opts.cpu_threshold, self.slos))
        self.clock = StageClock(self.stages)
        self.begun = False
        self.finished = False
        self.fatal = ""
        """Why the run cannot start (the target is unreachable): the first tick ends the test."""
        self.run_id = ""
        self.run_started = 0.0
        self.result_path: Path | None = None
        self.result_doc: dict[str, Any] = {}
        self.live = LiveState(
            profile=self.profile.name,
            version=__version__,
            locust_version=locust_version,
            stages=[s.name for s in self.stages],
            store=self.store,
        )
        self.shares = class_shares(self.profile, self.slos)
        self.saturation = Watch()
        """The live over-saturation check (every 5 s; ``--stop-on-oversaturation`` ends the run on a hit)."""

    def start(self) -> None:
        super().start()
        self.registry = CollectorRegistry()
        LoadgenCollector(self.live, registry=self.registry)
        if self.opts.metrics_port:
            app = make_wsgi_app(self.registry)
            self.metrics_server = WSGIServer((self.opts.metrics_host, self.opts.metrics_port), app, log=None)
            self.metrics_server.start()
            log.info("metrics on http://%s:%d/metrics", self.opts.metrics_host, self.metrics_server.server_port)
        if self.opts.progress_interval > 0:
            gevent.spawn(self._progress_loop)

    def check_target(self) -> str:
        """Fail fast: the target must answer /v1/models (it also names the default model). '' when it does."""
        try:
            model = first_model(self.target.url, self.opts.api_key or None)
        except TargetUnreachable as err:
            return f"loadlens: error: {err}"
        if not self.executor.model:
            self.executor.model = model
        return ""

    # --- what the master does differently -----------------------------------------------------------------

    def worker_count(self) -> int:
        return 0

    def cpu_now(self) -> float:
        return self.cpu.current

    def cpu_peak(self) -> float:
        return self.cpu.peak

    def cpu_mean(self) -> float:
        return self.cpu.mean

    def in_flight(self) -> int:
        return self.recorder.in_flight

    def finished_count(self, stage: str) -> int:
        """Finished requests of a stage so far."""
        return self.store.finished(stage)

    def stage_entered(self) -> None:
        """Called after each stage change."""

    def each_tick(self) -> None:
        """Called at every tick of a running test."""

    def reset_run(self) -> None:
        """Called when a run begins."""

    # --- stage clock --------------------------------------------------------------------------------------

    def begin(self) -> None:
        if self.begun:
            return
        self.begun = True
        self.finished = False
        self.recorder.store = Store(self.bounds)
        self.live.store = self.store
        self.cpu_time.restart()
        self._seed_series()
        self.run_started = time.time()
        self.run_id = self.opts.run_id or default_run_id(self.profile.name)
        self.cpu.reset()
        self.cpu.active = True
        self.reset_run()
        self.cpu_guard.reset()
        self.saturation.reset()
        self.live.over_saturated = set()
        self.live.results_valid = True
        self.result_path = None
        now = time.time()
        self.clock.start(now)
        self._entered(now, previous=None)

    def _seed_series(self) -> None:
        """Export every label set from the start, at zero."""
        models = {m for t in self.profile.traffic for m in t.models_for(self.model or "unknown")}  # adapters too
        classes = set(self.classes.values())
        self.store.seed((s.name, c.name, m) for s in self.stages for c in classes for m in models)

    def _entered(self, now: float, previous: int | None) -> None:
        index = self.clock.index
        stage = self.clock.stage
        self.apply_stage(index, now)
        self.live.current_stage = stage.name
        self.live.target_users = stage.user_count
        self.live.target_rate = stage.rate or 0.0
        self.stage_entered()
        if previous is not None and self.clock.leaves_warmup(previous) and self.env.runner is not None:
            self.env.runner.stats.reset_all()  # Locust's own tables leave the warmup out too
        log.info("stage %s (%d/%d): %s", stage.name, index + 1, len(self.stages), stage.target())
        print(f"loadgen: stage {stage.name} ({index + 1}/{len(self.stages)}): {stage.target()}", flush=True)

    def tick(self) -> tuple[int, float] | None:
        """The shape's tick: advance the stage clock, return (users, spawn rate), None when done."""
        if self.fatal or (self.finished and self.begun):
            return None  # the target is unreachable, or the run ended and test_stop has not run yet
        if not self.begun:
            self.begin()  # also a new run started from the web UI after a finished one
        self.each_tick()
        if self.clock.draining:
            return self._drain_tick()
        stage = self.clock.stage
        now = time.time()
        pause = self.clock.time_to_boundary(now)
        if pause:
            gevent.sleep(pause)  # end on time rather than at the next 1 s tick
            now = time.time()
        # Not on the tick that began the run: its users are spawned only once the tick returns (a trace's first
        # rows would go out most of a second late).
        if stage.until_requests is not None and self.clock.elapsed(now) >= UNTIL_REQUESTS_POLL_S:
            # Poll for most of a tick so a request-count stage ends within ~20 ms of its last request.
            deadline = time.monotonic() + UNTIL_REQUESTS_POLL_FOR_S
            while self.finished_count(stage.name) < stage.until_requests and time.monotonic() < deadline:
                gevent.sleep(UNTIL_REQUESTS_POLL_S)
            now = time.time()
        finished = self.finished_count(stage.name) if stage.until_requests is not None else 0
        reason = self.clock.end_reason(now, finished)
        if not reason and self.check_saturation(now):
            self.clock.stop(now, END_REASON)
            self.start_drain()
            print(
                f"loadgen: stopping the run (--stop-on-oversaturation): stage {stage.name} is over-saturated; "
                "letting in-flight requests finish",
                flush=True,
            )
            return self._drain_tick()
        if reason:
            previous = self.clock.index
            if not self.clock.advance(now, reason):
                self.start_drain()
                print("loadgen: last stage done; letting in-flight requests finish", flush=True)
                return self._drain_tick()
            self._entered(now, previous)
            stage = self.clock.stage
        return stage.user_count, spawn_rate(stage)

    def start_drain(self) -> None:
        self.enter_drain()

    def check_saturation(self, now: float) -> bool:
        """The live over-saturation check of the running stage (when due). True: it found the stage
        over-saturated just now and ``--stop-on-oversaturation`` asks to end the run."""
        stage = self.clock.stage
        judgement = self.saturation.check(self.store, stage, start=self.clock.window_start, now=now)
        if judgement is None:
            return False
        self.live.over_saturated.add(stage.name)
        at = now - self.clock.window_start
        print(f"loadgen: stage {stage.name} is over-saturated at {at:.0f}s: {judgement.reason}", flush=True)
        return bool(getattr(self.opts, "stop_on_oversaturation", False))

    def _drain_tick(self) -> tuple[int, float] | None:
        assert self.clock.draining_since is not None
        runner = self.env.runner
        waited = time.time() - self.clock.draining_since
        users = runner.user_count if runner is not None else 0
        stop_timeout = self.profile.stop_timeout_s
        verdict = drain_verdict(
            waited, users, stop_timeout_s=stop_timeout, report_interval=self.report_interval,
            await_reports=self.awaits_reports,
        )  # fmt: skip
        if verdict == "wait":
            return 0, 1000.0
        if verdict == "timeout":
            limit = drain_limit(stop_timeout, self.report_interval)
            log.warning("users did not stop within %.0f s; ending anyway", limit)
        self.finished = True
        return None

    # --- CPU guard, progress ------------------------------------------------------------------------------

    def measuring(self) -> bool:
        return self.begun and not self.finished

    def after_cpu_sample(self) -> None:
        if self.measuring():
            self.cpu_time.charge(self.store, self.recorder.window)
        self.live.cpu_ratio = self.cpu_now()
        self.live.in_flight = self.in_flight()
        runner = self.env.runner
        self.live.users = runner.user_count if runner is not None else 0
        self.live.workers = self.worker_count()
        if not self.measuring():
            return
        self.live.fairness = {
            s.name: f for s in self.stages if (f := fairness(self.store, {s.name}, self.shares)) is not None
        }
        reason = self.cpu_guard.check(self.cpu_peak())
        if reason:
            self.live.results_valid = False
            log.warning("%s; results are marked invalid. Use more processes (--workers N).", reason)

    def _progress_loop(self) -> None:
        while True:
            gevent.sleep(self.opts.progress_interval)
            if self.measuring():
                print(self.progress_line(), flush=True)

    def progress_line(self) -> str:
        elapsed = time.time() - self.clock.window_start
        return progress_line(self.clock.stage, elapsed, self.store, self.live.users, self.live.cpu_ratio)

    # --- start and end ------------------------------------------------------------------------------------

    def on_test_start(self, environment: Environment, **kwargs: Any) -> None:
        self.begin()

    def on_test_stop(self, environment: Environment, **kwargs: Any) -> None:
        if not self.begun:
            return
        now = time.time()
        self.cpu_time.charge(self.store, self.recorder.window)
        completed = self.clock.draining
        if not completed:
            self.clock.close(now, "stopped")
        self.finished = True
        self.begun = False
        self.cpu.active = False
        self.live.current_stage = None
        try:
            self.result_path = self.write_results(now, completed and not self.clock.stopped_early)
        except Exception:  # never lose the run's exit path to a reporting bug; say so loudly
            log.exception("could not write benchmark_result.json")
            environment.process_exit_code = 1
            return
        try:
            print(stage_table(self.result_doc), flush=True)
        except Exception:  # the table is for reading; the file is written, the exit path must not be lost
            log.exception("could not print the results table")
        print(f"loadgen: results written to {self.result_path}", flush=True)
        if environment.process_exit_code is None or environment.process_exit_code == 0:
            environment.process_exit_code = 0 if self.cpu_guard.valid else 3

    def run_block(self, end: float, completed: bool) -> dict[str, Any]:
        """The ``run`` block of benchmark_result.json."""
        return {
            "run_id": self.run_id,
            "target": self.target.url,
            "model": self.model,
            "profile": self.profile.name,
            "seed": self.seed,
            "users_scale": self.profile.users_scale,
            "time_scale": self.profile.time_scale,
            "start_time": iso(self.run_started),
            "end_time": iso(end),
            "start_timestamp": round(self.run_started, 3),
            "end_timestamp": round(end, 3),
            "duration_s": round(end - self.run_started, 3),
            "completed": completed,
            "mode": self.mode,
            "workers": self.worker_count(),
            "hostname": socket.gethostname(),
            "argv": sys.argv[1:],
            "versions": {
                "loadlens": __version__,
                "locust": self.locust_version,
                "python": platform.python_version(),
            },
        }

    def write_results(self, end: float, completed: bool) -> Path:
        windows = self.clock.kept_windows()
        server = None
        if self.opts.prometheus:
            server = figures_for_stages(self.opts.prometheus, [(w.spec.name, w.start, w.end) for w in windows])
        doc = build_result(
            run=self.run_block(end, completed),
            profile=self.profile,
            slos=self.slos,
            store=self.store,
            windows=windows,
            validity=self.cpu_guard.validity(self.cpu_peak(), self.cpu_mean()),
            server=server,
            saturation=stage_blocks(self.store, windows, self.saturation.detected),
        )
        self.result_doc = doc
        return write_result(Path(self.opts.results) / self.run_id, doc)
