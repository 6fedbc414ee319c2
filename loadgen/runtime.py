"""Everything the locustfile does, per Locust process: stages, users' requests, worker/master exchange, output.

Roles: ``local`` (one process), ``master`` (runs the stage clock, merges, serves /metrics, writes results, sends
no requests) and ``worker`` (sends requests, ships measurement deltas every report interval).

Stage clock (master or local): the shape's ``tick`` advances it. A duration stage ends exactly on time (tick
sleeps up to the boundary when it is less than a tick away); an ``until_requests`` stage ends at the first tick
after enough of its requests finished (in distributed mode counts arrive every 3 s, so a few more may run).
After the last stage the users are stopped gracefully (each finishes its request, bounded by the profile's
``stop_timeout_s``), the last worker reports are awaited, then the test ends and the results are written.

Imported only inside Locust processes: it imports gevent.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import platform
import random
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import gevent.lock
import locust
import psutil
from gevent.pywsgi import WSGIServer
from locust.env import Environment
from locust.exception import RescheduleTask
from locust.runners import WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner
from prometheus_client import CollectorRegistry, make_wsgi_app

from loadgen import __version__
from loadgen.client import Target, stream, traceparent
from loadgen.metrics import DEFAULT_METRICS_PORT, LiveState, LoadgenCollector, bucket_bounds
from loadgen.profile import Profile, load_profile
from loadgen.prompts import PromptFactory
from loadgen.record import SUCCESS, RequestRecord
from loadgen.results import StageWindow, build_result, class_shares, fairness, iso, write_result
from loadgen.serverside import figures_for_stages
from loadgen.store import Store
from loadlens.contracts.slo import PriorityClass, SLOConfig, load_slos

log = logging.getLogger("loadlens.loadgen")

STAGE_MESSAGE = "loadlens_stage"
PROGRESS_MESSAGE = "loadlens_progress"
DRAIN = "(drain)"
"""Window name for what happens after the last stage (never a stage name: parentheses are not allowed there)."""
REPORT_KEY = "loadlens"
DEFAULT_CPU_THRESHOLD = 0.9
CPU_WINDOW_S = 5
CPU_MIN_SAMPLES = 3
"""The guard judges a moving average of 3-5 one-second samples, so one busy second (spawning) cannot trip it."""
LAG_PROBE_S = 0.005
RETRY_AFTER_CAP_S = 1.0
"""A closed-loop user that got 429 waits Retry-After, at most this long, before its next request."""


def add_arguments(parser: Any) -> None:
    """Custom Locust options; each also reads the same ``LOADLENS_*`` variable as ``loadlens load``."""
    group = parser.add_argument_group("loadlens", "LLM load profile (docs/loadgen.md)")
    group.add_argument(
        "--load-profile", default="quick", env_var="LOADLENS_LOAD_PROFILE", help="profile name or YAML path"
    )
    group.add_argument(
        "--model", default="", env_var="LOADLENS_LOAD_MODEL", help="model name (default: the target's first)"
    )
    group.add_argument("--users-scale", type=float, default=1.0, env_var="LOADLENS_LOAD_USERS_SCALE", help="users x F")
    group.add_argument(
        "--time-scale", type=float, default=1.0, env_var="LOADLENS_LOAD_TIME_SCALE", help="durations x F"
    )
    group.add_argument(
        "--seed", type=int, default=-1, env_var="LOADLENS_LOAD_SEED", help="prompt seed (default: profile's)"
    )
    group.add_argument("--results", default="results", env_var="LOADLENS_LOAD_RESULTS", help="results directory")
    group.add_argument("--run-id", default="", env_var="LOADLENS_LOAD_RUN_ID", help="results sub-directory name")
    group.add_argument(
        "--prometheus", default="", env_var="LOADLENS_LOAD_PROMETHEUS", help="Prometheus URL, server side"
    )
    group.add_argument("--slo-file", default="", env_var="LOADLENS_LOAD_SLO_FILE", help="SLO file (default: packaged)")
    group.add_argument("--api-key", default="", env_var="LOADLENS_LOAD_API_KEY", help="bearer token for the target")
    group.add_argument(
        "--metrics-port", type=int, default=DEFAULT_METRICS_PORT, env_var="LOADLENS_LOAD_METRICS_PORT", help="0 = off"
    )
    group.add_argument("--metrics-host", default="127.0.0.1", env_var="LOADLENS_LOAD_METRICS_HOST", help="bind address")
    group.add_argument(
        "--cpu-threshold",
        type=float,
        default=0.0,
        env_var="LOADLENS_LOAD_CPU_THRESHOLD",
        help="CPU ratio that invalidates results (default: the SLO file's alerting.loadgen_cpu_ratio, else 0.9)",
    )
    group.add_argument(
        "--progress-interval",
        type=float,
        default=5.0,
        env_var="LOADLENS_LOAD_PROGRESS_INTERVAL",
        help="seconds, 0 = off",
    )


@dataclass
class Slot:
    """An open-loop send: its scheduled time (perf_counter), the stage that scheduled it, and that stage's gen."""

    at: float
    stage: str
    gen: int


class OpenLoopSchedule:
    """Arrival times for this process: constant spacing or Poisson (exponential gaps), from ``start``."""

    def __init__(self, rate: float, arrival: str, start: float, rng: random.Random, offset: float = 0.0) -> None:
        self.rate = rate
        self.constant = arrival == "constant"
        self.rng = rng
        self.next_at = start + (offset if self.constant else rng.expovariate(rate))

    def take(self) -> float:
        at = self.next_at
        self.next_at += 1.0 / self.rate if self.constant else self.rng.expovariate(self.rate)
        return at


class CpuMonitor:
    """This process's CPU, sampled every second, averaged over 5 s (1.0 = one core)."""

    def __init__(self) -> None:
        self.proc = psutil.Process(os.getpid())
        self.proc.cpu_percent(None)
        self.samples: collections.deque[float] = collections.deque(maxlen=CPU_WINDOW_S)
        self.current = 0.0
        self.peak = 0.0
        self.total = 0.0
        self.count = 0
        self.active = False  # only samples taken while a test runs count towards peak and mean

    def sample(self) -> None:
        self.samples.append(self.proc.cpu_percent(None) / 100.0)
        self.current = sum(self.samples) / len(self.samples)
        if self.active and len(self.samples) >= CPU_MIN_SAMPLES:
            self.peak = max(self.peak, self.current)
            self.total += self.samples[-1]
            self.count += 1

    def reset(self) -> None:
        self.peak = self.total = 0.0
        self.count = 0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


def _utcnow() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def resolve_model(target: Target, headers: dict[str, str], timeout: float = 5.0) -> str:
    """The first model the target lists at /v1/models (raises OSError/ValueError when unreachable)."""
    req = urllib.request.Request(target.url.rstrip("/").removesuffix("/v1") + "/v1/models", headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as response:
        doc = json.loads(response.read())
    models = doc.get("data") or []
    base = [m for m in models if not m.get("parent")] or models
    if not base:
        raise ValueError("the target lists no models at /v1/models")
    return str(base[0]["id"])


class Runtime:
    def __init__(self, environment: Environment) -> None:
        self.env = environment
        opts = environment.parsed_options
        assert opts is not None
        self.opts = opts
        runner = environment.runner
        self.role = (
            "master" if isinstance(runner, MasterRunner) else "worker" if isinstance(runner, WorkerRunner) else "local"
        )
        profile = load_profile(opts.load_profile)
        self.profile: Profile = profile.scaled(users=opts.users_scale, time=opts.time_scale)
        self.seed = self.profile.seed if opts.seed < 0 else opts.seed
        self.slos: SLOConfig = load_slos(opts.slo_file or None)
        alerting = getattr(self.slos, "alerting", None) or {}
        self.cpu_threshold = opts.cpu_threshold or float(alerting.get("loadgen_cpu_ratio", DEFAULT_CPU_THRESHOLD))
        self.bounds = bucket_bounds(self.slos)
        self.classes: dict[str, PriorityClass] = {
            t.name: self.slos.class_for_priority(t.effective_priority) for t in self.profile.traffic
        }
        self.target = Target(environment.host or "http://127.0.0.1:8000")
        self.auth = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
        self.model: str = opts.model or ""
        self.store = Store(self.bounds)
        self.prompts: PromptFactory | None = None
        self.stages = self.profile.stages
        # Stage state, on every process (workers learn it from the master's messages).
        self.stage_index = 0
        self.stage_gen = 0
        self.stage_started_perf = time.perf_counter()
        self.schedule: OpenLoopSchedule | None = None
        self.dispatch_lock = gevent.lock.Semaphore()
        self.stage_changed = gevent.event.Event()
        self.in_flight = 0
        self.cpu = CpuMonitor()
        self.cpu_mark = time.process_time()
        self.window = self.stages[0].name
        """Where arriving tokens and CPU time are charged: the current stage, or DRAIN after the last one."""
        # Master/local only.
        self.begun = False
        self.windows: list[StageWindow] = []
        self.window_start = 0.0
        self.draining_since: float | None = None
        self.finished = False
        self.run_id = ""
        self.run_started = 0.0
        self.worker_stats: dict[str, dict[str, float]] = {}
        self.notified: set[str] = set()
        self.fatal = ""
        self.worker_progress: dict[str, dict[str, int]] = {}
        self.finished_by_stage: collections.Counter[str] = collections.Counter()  # worker: cumulative
        self.cpu_peak_workers = 0.0
        self.results_valid = True
        self.invalid_reasons: list[str] = []
        self.live = LiveState(
            profile=self.profile.name,
            version=__version__,
            locust_version=locust.__version__,
            stages=[s.name for s in self.stages],
            store=self.store,
        )
        self.shares = class_shares(self.profile, self.slos)
        self.result_path: Path | None = None
        self._wire(environment)

    # --- wiring ------------------------------------------------------------------------------------------

    def _wire(self, env: Environment) -> None:
        events = env.events
        events.test_start.add_listener(self.on_test_start)  # type: ignore[no-untyped-call]
        events.test_stop.add_listener(self.on_test_stop)  # type: ignore[no-untyped-call]
        gevent.spawn(self._cpu_loop)
        gevent.spawn(self._loop_lag_loop)
        if self.role == "worker":
            assert env.runner is not None
            env.runner.register_message(STAGE_MESSAGE, self.on_stage_message)
            events.report_to_master.add_listener(self.on_report_to_master)  # type: ignore[no-untyped-call]
            gevent.spawn(self._progress_to_master_loop)
        else:
            if self.role == "master":
                events.worker_report.add_listener(self.on_worker_report)  # type: ignore[no-untyped-call]
                assert env.runner is not None
                env.runner.register_message(PROGRESS_MESSAGE, self.on_progress_message)
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
            model = resolve_model(self.target, self.auth)
        except (OSError, ValueError, KeyError, urllib.error.URLError) as err:
            reason = getattr(err, "reason", err)
            return f"loadlens: error: cannot reach target {self.target.url}: {reason}"
        if not self.model:
            self.model = model
        return ""

    # --- stage clock (master/local) ----------------------------------------------------------------------

    def begin(self) -> None:
        if self.begun:
            return
        self.begun = True
        self.finished = False
        self.store = Store(self.bounds)
        self.live.store = self.store
        self.cpu_mark = time.process_time()
        self._seed_series()
        self.windows = []
        self.draining_since = None
        self.run_started = time.time()
        self.run_id = self.opts.run_id or f"{self.profile.name}-{_utcnow()}"
        self.cpu.reset()
        self.cpu.active = True
        self.cpu_peak_workers = 0.0
        self.results_valid = True
        self.invalid_reasons = []
        self.live.results_valid = True
        self.result_path = None
        self._enter(0, time.time())

    def _seed_series(self) -> None:
        models = {t.model or self.model or "unknown" for t in self.profile.traffic}
        classes = set(self.classes.values())
        self.store.seed((s.name, c.name, m) for s in self.stages for c in classes for m in models)

    def _enter(self, index: int, now: float) -> None:
        stage = self.stages[index]
        previous = self.stages[self.stage_index] if self.windows else None
        self.window_start = now
        self._apply_stage(index, now, share=1.0, worker_index=0, workers=1)
        self.live.current_stage = stage.name
        self.live.target_users = stage.user_count
        self.live.target_rate = stage.rate or 0.0
        self.notified = set()
        self._notify_workers()
        if previous is not None and previous.warmup and not stage.warmup and self.env.runner is not None:
            self.env.runner.stats.reset_all()  # Locust's own tables leave the warmup out too
        log.info("stage %s (%d/%d): %s", stage.name, index + 1, len(self.stages), stage.target())
        print(f"loadgen: stage {stage.name} ({index + 1}/{len(self.stages)}): {stage.target()}", flush=True)

    def _notify_workers(self) -> None:
        """Master: tell every worker that has not heard it yet about the current stage (late joiners too)."""
        runner = self.env.runner
        if self.role != "master" or not isinstance(runner, MasterRunner):
            return
        workers = max(1, runner.worker_count)
        for client in list(runner.clients.values()):
            if client.id in self.notified:
                continue
            self.notified.add(client.id)
            runner.send_message(
                STAGE_MESSAGE,
                {
                    "index": self.stage_index,
                    "start": self.window_start,
                    "workers": workers,
                    "worker_index": runner.get_worker_index(client.id),  # type: ignore[no-untyped-call]
                    "model": self.model,
                },
                client_id=client.id,
            )

    def _close_window(self, now: float, reason: str) -> None:
        self.windows.append(
            StageWindow(self.stage_index, self.stages[self.stage_index], self.window_start, now, reason)
        )

    def tick(self) -> tuple[int, float] | None:
        """The shape's tick: advance the stage clock, return (users, spawn rate), None when done."""
        if self.fatal or (self.finished and self.begun):
            return None  # the target is unreachable, or the run ended and test_stop has not run yet
        if not self.begun:
            self.begin()  # also a new run started from the web UI after a finished one
        self._notify_workers()
        if self.draining_since is not None:
            return self._drain_tick()
        stage = self.stages[self.stage_index]
        now = time.time()
        elapsed = now - self.window_start
        if stage.duration is not None and 0 < stage.duration - elapsed < 1.0:
            gevent.sleep(stage.duration - elapsed)  # end on time rather than at the next 1 s tick
            now = time.time()
            elapsed = now - self.window_start
        if stage.until_requests is not None:
            # Poll for most of a tick so a request-count stage ends within ~20 ms of its last request.
            deadline = time.monotonic() + 0.9
            while self._finished(stage.name) < stage.until_requests and time.monotonic() < deadline:
                gevent.sleep(0.02)
            now = time.time()
            elapsed = now - self.window_start
        reason = ""
        if stage.until_requests is not None and self._finished(stage.name) >= stage.until_requests:
            reason = "until_requests"
        elif stage.duration is not None and elapsed >= stage.duration:
            reason = "duration"
        elif stage.duration is None and elapsed >= stage.max_duration:
            reason = "max_duration"
        if reason:
            self._close_window(now, reason)
            if self.stage_index + 1 < len(self.stages):
                self._enter(self.stage_index + 1, now)
                stage = self.stages[self.stage_index]
            else:
                self.draining_since = now
                self._start_drain()
                print("loadgen: last stage done; letting in-flight requests finish", flush=True)
                return self._drain_tick()
        rate = stage.spawn_rate or max(100.0, float(stage.user_count))
        return stage.user_count, rate

    def _start_drain(self) -> None:
        """After the last stage: tokens and CPU of the requests still finishing belong to no stage window."""
        self._account_cpu()
        self.window = DRAIN
        if self.role == "master":
            assert self.env.runner is not None
            self.env.runner.send_message(STAGE_MESSAGE, {"drain": True})

    def _finished(self, stage: str) -> int:
        """Finished requests of a stage: the merged store, or the workers' faster progress messages."""
        from_workers = sum(p.get(stage, 0) for p in self.worker_progress.values())
        return max(self.store.finished(stage), from_workers)

    def _drain_tick(self) -> tuple[int, float] | None:
        assert self.draining_since is not None
        runner = self.env.runner
        waited = time.time() - self.draining_since
        limit = self.profile.stop_timeout_s + 2 * WORKER_REPORT_INTERVAL + 5
        users = runner.user_count if runner is not None else 0
        if users == 0 and (self.role == "local" or waited >= WORKER_REPORT_INTERVAL + 0.5):
            self.finished = True
            return None
        if waited > limit:
            log.warning("users did not stop within %.0f s; ending anyway", limit)
            self.finished = True
            return None
        return 0, 1000.0

    # --- stage state on every process --------------------------------------------------------------------

    def _account_cpu(self) -> None:
        """Charge this process's CPU time since the last call to the window current now."""
        now = time.process_time()
        self.store.cpu_seconds[self.window] += now - self.cpu_mark
        self.cpu_mark = now

    def _apply_stage(self, index: int, start_wall: float, *, share: float, worker_index: int, workers: int) -> None:
        self._account_cpu()  # what was spent so far belongs to the stage that is ending
        stage = self.stages[index]
        self.stage_index = index
        self.window = stage.name
        self.stage_gen += 1
        # Convert the master's wall-clock start into this process's perf_counter timeline.
        start_perf = time.perf_counter() - max(0.0, time.time() - start_wall)
        self.stage_started_perf = start_perf
        if stage.rate is not None:
            rng = random.Random(f"arrivals:{self.seed}:{stage.name}:{worker_index}")
            offset = worker_index / stage.rate  # workers interleave their constant-rate sends
            self.schedule = OpenLoopSchedule(stage.rate * share, stage.arrival, start_perf, rng, offset)
        else:
            self.schedule = None
        changed, self.stage_changed = self.stage_changed, gevent.event.Event()
        changed.set()  # wake the sender waiting for the old schedule's next arrival

    def on_stage_message(self, environment: Environment, msg: Any, **kwargs: Any) -> None:
        data = msg.data
        if data.get("drain"):
            self._account_cpu()
            self.window = DRAIN
            return
        if data.get("model") and not self.model:
            self.model = data["model"]
        self._apply_stage(
            int(data["index"]),
            float(data["start"]),
            share=1.0 / max(1, int(data["workers"])),
            worker_index=int(data.get("worker_index", 0)),
            workers=int(data["workers"]),
        )

    # --- users ---------------------------------------------------------------------------------------------

    def wait_time(self, user: Any) -> float:
        """Locust's wait: 0 in closed loop (or a 429 back-off). In open loop, wait for the next arrival.

        Idle senders queue on one lock and only its holder sleeps until the next scheduled arrival, so no
        sender holds a slot far in the future (a stage change would strand it). The holder takes the slot
        when it is due, or at once when it is already overdue (every sender was busy: the request goes out
        late and is measured from its scheduled time). Locust marks the user as waiting during this call, so
        stopping it here is immediate.
        """
        backoff = float(user.backoff)
        user.backoff = 0.0
        if self.schedule is None:
            return backoff
        with self.dispatch_lock:
            while True:
                schedule = self.schedule
                if schedule is None:
                    return backoff  # the stage changed to closed loop while we queued
                delay = schedule.next_at - time.perf_counter()
                if delay > 0 and self.stage_changed.wait(delay):
                    continue  # woken by a stage change: look at the new schedule
                user.slot = Slot(schedule.take(), self.stages[self.stage_index].name, self.stage_gen)
                return 0.0

    def run_request(self, user: Any) -> None:
        slot: Slot | None = user.slot
        user.slot = None
        stage = self.stages[self.stage_index]
        now = time.perf_counter()
        if stage.open_loop and slot is None:
            raise RescheduleTask()  # go through wait_time to claim a slot
        if slot is not None and slot.gen != self.stage_gen and slot.at >= self.stage_started_perf:
            raise RescheduleTask()  # scheduled by a stage that ended before its time came
        if slot is not None:
            intended, stage_name, lag = slot.at, slot.stage, max(0.0, now - slot.at)
        else:
            intended, stage_name, lag = now, stage.name, None
        if not self.model:
            self.model = resolve_model(self.target, self.auth)
        if self.prompts is None:
            worker_index = getattr(self.env.runner, "worker_index", 0)
            self.prompts = PromptFactory(self.profile, seed=self.seed, process_index=max(0, worker_index))
        request = self.prompts.next(self.model)
        cls = self.classes[request.traffic.name]
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": f"loadlens-loadgen/{__version__}",
            "traceparent": traceparent(),
            **self.auth,
        }
        self.in_flight += 1
        record: RequestRecord | None = None
        reusable = False
        retry_after = None
        try:
            record, reusable, retry_after = stream(
                user.http, self.target, request, headers, intended, self._on_tokens, self.profile.request_timeout_s
            )
        finally:
            self.in_flight -= 1
            if record is None:  # killed mid-request (Locust stopped the user): the server sees a disconnect
                record = RequestRecord(outcome="cancelled", reason="stopped by the load generator")
            record.dispatch_lag = lag
            self.store.record(record, (stage_name, cls.name, request.model), cls)
            if record.outcome != "cancelled":
                self.finished_by_stage[stage_name] += 1
            if not reusable:
                user.reconnect()
        if record.outcome == "rate_limited" and slot is None:
            user.backoff = min(RETRY_AFTER_CAP_S, retry_after or RETRY_AFTER_CAP_S)
        self._fire_locust_events(request.traffic.name, stage_name, cls.name, record)

    def _on_tokens(self, n: int) -> None:
        store = self.store  # re-read each time: a worker swaps its store at every report
        store.window_tokens[self.window] += n
        store.tokens_by_second[int(time.time())] += n

    def _fire_locust_events(self, name: str, stage_name: str, cls: str, record: RequestRecord) -> None:
        if record.outcome == "cancelled":
            return
        current = self.stages[self.stage_index]
        if (
            stage_name != current.name
            and not current.warmup
            and any(s.name == stage_name and s.warmup for s in self.stages)
        ):
            return  # a warmup request finishing after the warmup: Locust's tables were reset without it
        fire: Any = self.env.events.request.fire  # untyped in Locust
        ctx = {"stage": stage_name, "priority_class": cls}
        exc = None if record.ok else RequestFailed(record.reason or record.outcome)
        e2e_ms = (record.e2e or 0.0) * 1e3
        fire(
            request_type="E2E",
            name=name,
            response_time=e2e_ms,
            response_length=record.output_tokens,
            exception=exc,
            context=ctx,
            response=None,
            start_time=time.time() - (record.e2e or 0.0),
            url=self.target.url,
        )
        if record.outcome != SUCCESS:
            return
        if record.ttft is not None:
            fire(
                request_type="TTFT",
                name=name,
                response_time=record.ttft * 1e3,
                response_length=0,
                exception=None,
                context=ctx,
            )
        tpot = record.tpot
        if tpot is not None:
            fire(
                request_type="TPOT", name=name, response_time=tpot * 1e3, response_length=0, exception=None, context=ctx
            )

    # --- distributed exchange ------------------------------------------------------------------------------

    def on_report_to_master(self, client_id: str, data: dict[str, Any], **kwargs: Any) -> None:
        data[REPORT_KEY] = {
            "store": self.store.take_delta(),
            "cpu": self.cpu.current,
            "cpu_peak": self.cpu.peak,
            "cpu_mean": self.cpu.mean,
            "in_flight": self.in_flight,
        }

    def on_worker_report(self, client_id: str, data: dict[str, Any], **kwargs: Any) -> None:
        doc = data.get(REPORT_KEY)
        if not doc:
            return
        self.store.merge(Store.from_wire(self.bounds, doc["store"]))
        self.worker_stats[client_id] = {
            "cpu": float(doc.get("cpu", 0.0)),
            "cpu_peak": float(doc.get("cpu_peak", 0.0)),
            "cpu_mean": float(doc.get("cpu_mean", 0.0)),
            "in_flight": float(doc.get("in_flight", 0)),
        }
        self.cpu_peak_workers = max(self.cpu_peak_workers, float(doc.get("cpu_peak", 0.0)))

    def _progress_to_master_loop(self) -> None:
        """Worker: during request-count stages, tell the master how many requests finished, 4 times a second."""
        sent = -1
        while True:
            gevent.sleep(0.25)
            stage = self.stages[self.stage_index]
            if stage.until_requests is None or self.env.runner is None:
                continue
            n = self.finished_by_stage[stage.name]
            if n != sent:
                self.env.runner.send_message(PROGRESS_MESSAGE, {"stage": stage.name, "finished": n})
                sent = n

    def on_progress_message(self, environment: Environment, msg: Any, **kwargs: Any) -> None:
        data = msg.data
        self.worker_progress.setdefault(msg.node_id, {})[str(data["stage"])] = int(data["finished"])

    # --- CPU guard, progress -------------------------------------------------------------------------------

    def _cpu_loop(self) -> None:
        while True:
            gevent.sleep(1.0)
            self.cpu.sample()
            if self.role == "worker" or (self.begun and not self.finished):
                self._account_cpu()
            if self.role == "worker":
                self.cpu.active = self.env.runner is not None and self.env.runner.user_count > 0
                continue
            current = max([self.cpu.current] + [w["cpu"] for w in self.worker_stats.values()])
            self.live.cpu_ratio = current
            self.live.in_flight = self.in_flight + int(sum(w["in_flight"] for w in self.worker_stats.values()))
            runner = self.env.runner
            self.live.users = runner.user_count if runner is not None else 0
            self.live.workers = runner.worker_count if isinstance(runner, MasterRunner) else 0
            if self.begun and not self.finished:
                self.live.fairness = {
                    s.name: f for s in self.stages if (f := fairness(self.store, {s.name}, self.shares)) is not None
                }
                peak = max(self.cpu.peak, self.cpu_peak_workers)
                if peak > self.cpu_threshold and self.results_valid:
                    self.results_valid = False
                    self.live.results_valid = False
                    reason = (
                        f"load generator CPU reached {peak:.0%} of a core (threshold {self.cpu_threshold:.0%}): "
                        "timestamps are delayed by the client itself"
                    )
                    self.invalid_reasons.append(reason)
                    log.warning("%s; results are marked invalid. Use more processes (--workers N).", reason)

    def _loop_lag_loop(self) -> None:
        """Sleep 5 ms at a time and record how late each wake-up is: the client's own timestamp delay."""
        perf = time.perf_counter
        while True:
            t0 = perf()
            gevent.sleep(LAG_PROBE_S)
            if self.role == "worker" or (self.begun and not self.finished):
                self.store.lag(self.window).record(max(0.0, perf() - t0 - LAG_PROBE_S))

    def _progress_loop(self) -> None:
        while True:
            gevent.sleep(self.opts.progress_interval)
            if not self.begun or self.finished:
                continue
            print(self.progress_line(), flush=True)

    def progress_line(self) -> str:
        """Stage so far: finished requests and streamed tokens per second, TTFT p99, ITL p50, CPU."""
        stage = self.stages[self.stage_index]
        elapsed = max(1e-6, time.time() - self.window_start)
        series = self.store.merged([k for k in self.store.series if k[0] == stage.name])
        ttft = series.dists["ttft"]
        itl = series.dists["itl"]
        planned = f"/{stage.duration:.0f}s" if stage.duration is not None else f" until {stage.until_requests} req"
        ttft_txt = f"{ttft.quantile(0.99) * 1e3:.1f}ms" if ttft.count else "-"
        itl_txt = f"{itl.quantile(0.5) * 1e3:.2f}ms" if itl.count else "-"
        tokens = self.store.window_tokens.get(stage.name, 0)
        return (
            f"loadgen: [{stage.name} {elapsed:.0f}s{planned}] users={self.live.users} "
            f"req/s={(series.completed + series.failed) / elapsed:.1f} out_tok/s={tokens / elapsed:.0f} "
            f"ttft_p99={ttft_txt} itl_p50={itl_txt} ok={series.completed} failed={series.failed} "
            f"cpu={self.live.cpu_ratio:.0%}"
        )

    # --- start and end -------------------------------------------------------------------------------------

    def on_test_start(self, environment: Environment, **kwargs: Any) -> None:
        if self.role == "worker":
            self.cpu.active = True
            return
        self.begin()

    def on_test_stop(self, environment: Environment, **kwargs: Any) -> None:
        if self.role == "worker" or not self.begun:
            return
        now = time.time()
        self._account_cpu()
        completed = self.draining_since is not None
        if not completed:
            self._close_window(now, "stopped")
        self.finished = True
        self.begun = False
        self.cpu.active = False
        self.live.current_stage = None
        try:
            self.result_path = self.write_results(now, completed)
        except Exception:  # never lose the run's exit path to a reporting bug; say so loudly
            log.exception("could not write benchmark_result.json")
            environment.process_exit_code = 1
            return
        print(f"loadgen: results written to {self.result_path}", flush=True)
        if environment.process_exit_code is None or environment.process_exit_code == 0:
            environment.process_exit_code = 0 if self.results_valid else 3

    def write_results(self, end: float, completed: bool) -> Path:
        windows = [w for w in self.windows if w.duration > 0 or w.end_reason != "stopped"]
        server = None
        if self.opts.prometheus:
            server = figures_for_stages(self.opts.prometheus, [(w.spec.name, w.start, w.end) for w in windows])
        cpu_peak = max(self.cpu.peak, self.cpu_peak_workers)
        worker_means = [w["cpu_mean"] for w in self.worker_stats.values()]
        validity = {
            "results_valid": self.results_valid,
            "reasons": self.invalid_reasons,
            "loadgen_cpu_peak_ratio": round(cpu_peak, 4),
            "loadgen_cpu_mean_ratio": round(max(worker_means) if worker_means else self.cpu.mean, 4),
            "cpu_threshold_ratio": self.cpu_threshold,
        }
        runner = self.env.runner
        run = {
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
            "mode": "distributed" if self.role == "master" else "local",
            "workers": runner.worker_count if isinstance(runner, MasterRunner) else 0,
            "hostname": socket.gethostname(),
            "argv": sys.argv[1:],
            "versions": {
                "loadlens": __version__,
                "locust": locust.__version__,
                "python": platform.python_version(),
            },
        }
        doc = build_result(
            run=run,
            profile=self.profile,
            slos=self.slos,
            store=self.store,
            windows=windows,
            validity=validity,
            server=server,
        )
        return write_result(Path(self.opts.results) / self.run_id, doc)


class RequestFailed(Exception):
    """What Locust's failure table shows for a failed request (the reason is bounded: status and error type)."""


RT: Runtime | None = None


def setup(environment: Environment) -> Runtime:
    """Called from ``events.init`` in every Locust process."""
    global RT
    RT = Runtime(environment)
    if RT.role != "worker":
        # Not SystemExit: with --processes the forked workers would wait a minute for a dead master. The
        # first tick ends the test instead, which also stops the workers.
        RT.fatal = RT.check_target()
        if RT.fatal:
            print(RT.fatal, file=sys.stderr, flush=True)
            environment.process_exit_code = 1
    environment.stop_timeout = max(environment.stop_timeout or 0.0, RT.profile.stop_timeout_s)
    return RT


def runtime() -> Runtime:
    if RT is None:
        raise RuntimeError("the loadlens runtime is set up by the locustfile's init listener")
    return RT


__all__ = ["Runtime", "Slot", "add_arguments", "runtime", "setup"]
