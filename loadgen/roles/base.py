"""What every Locust process does, whatever its role: settings, stage state, users' requests, self-watch."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event
import gevent.lock

from loadgen import __version__
from loadgen.client import Target, stream, traceparent
from loadgen.cpu_guard import CpuAccount, CpuMonitor
from loadgen.dispatch import StageDispatch
from loadgen.execute import Recorder, RequestExecutor, User
from loadgen.metrics import bucket_bounds
from loadgen.probe import first_model
from loadgen.profile import Profile, load_profile
from loadgen.saturation import outstanding
from loadgen.stage_clock import DRAIN
from loadgen.store import Store
from loadlens.contracts.slo import PriorityClass, SLOConfig, load_slos

if TYPE_CHECKING:
    from locust.env import Environment

log = logging.getLogger("loadlens.loadgen")

DEFAULT_HOST = "http://127.0.0.1:8000"
LAG_PROBE_S = 0.005


class Role:
    """Base of the three roles. ``start`` spawns the background loops and registers Locust listeners."""

    sends_requests = True
    """False for the master: it has no users, so nothing of its own to sample for the over-saturation test."""

    def __init__(self, environment: Environment, *, report_interval: float, locust_version: str) -> None:
        self.env = environment
        self.locust_version = locust_version
        opts = environment.parsed_options
        assert opts is not None
        self.opts = opts
        self.report_interval = report_interval
        """Locust's worker report interval (3 s): how stale merged figures can be."""
        profile = load_profile(opts.load_profile)
        self.profile: Profile = profile.scaled(users=opts.users_scale, time=opts.time_scale)
        self.seed: int = self.profile.seed if opts.seed < 0 else opts.seed
        self.slos: SLOConfig = load_slos(opts.slo_file or None)
        self.bounds = bucket_bounds(self.slos)
        self.classes: dict[str, PriorityClass] = {t.name: t.slo_class(self.slos) for t in self.profile.traffic}
        self.stages = self.profile.stages
        self.target = Target(environment.host or DEFAULT_HOST)
        self.auth = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
        self.recorder = Recorder(Store(self.bounds), self.stages[0].name)
        self.dispatch = StageDispatch(
            self.stages, self.seed, lock=gevent.lock.Semaphore(), new_event=gevent.event.Event
        )
        self.cpu = CpuMonitor()
        self.cpu_time = CpuAccount()
        self.executor = RequestExecutor(
            profile=self.profile,
            seed=self.seed,
            classes=self.classes,
            recorder=self.recorder,
            dispatch=self.dispatch,
            target=self.target,
            target_url=self.target.url,
            auth=self.auth,
            user_agent=f"loadlens-loadgen/{__version__}",
            send=stream,
            new_traceparent=traceparent,
            fire=self._fire_request_event,
            resolve_model=lambda: first_model(self.target.url, self.opts.api_key or None),
            process_index=lambda: int(getattr(self.env.runner, "worker_index", 0)),
            model=opts.model or "",
        )

    @property
    def store(self) -> Store:
        return self.recorder.store

    @property
    def model(self) -> str:
        return self.executor.model

    def start(self) -> None:
        events = self.env.events
        events.test_start.add_listener(self.on_test_start)  # type: ignore[no-untyped-call]
        events.test_stop.add_listener(self.on_test_stop)  # type: ignore[no-untyped-call]
        gevent.spawn(self._cpu_loop)
        gevent.spawn(self._loop_lag_loop)
        if self.sends_requests:
            gevent.spawn(self._queue_loop)

    # --- role-specific ----------------------------------------------------------------------------------

    def measuring(self) -> bool:
        """Whether what this process spends now (CPU, event-loop lag) belongs to the run."""
        raise NotImplementedError

    def after_cpu_sample(self) -> None:
        raise NotImplementedError

    def on_test_start(self, environment: Environment, **kwargs: Any) -> None:
        raise NotImplementedError

    def on_test_stop(self, environment: Environment, **kwargs: Any) -> None:
        raise NotImplementedError

    # --- stage state -------------------------------------------------------------------------------------

    def apply_stage(self, index: int, start_wall: float, *, share: float = 1.0, worker_index: int = 0) -> None:
        self.cpu_time.charge(self.store, self.recorder.window)  # CPU so far belongs to the stage that ends
        self.recorder.window = self.stages[index].name
        self.dispatch.apply(index, start_wall, share=share, worker_index=worker_index)

    def enter_drain(self) -> None:
        """After the last stage: tokens and CPU of the requests still finishing belong to no stage window."""
        self.cpu_time.charge(self.store, self.recorder.window)
        self.recorder.window = DRAIN

    # --- users -------------------------------------------------------------------------------------------

    def wait_time(self, user: User) -> float:
        """Locust's wait: 0 in closed loop (or a 429 back-off). In open loop, wait for the next arrival.

        Locust marks the user as waiting during this call, so stopping it here is immediate.
        """
        backoff = float(user.backoff)
        user.backoff = 0.0
        slot = self.dispatch.claim()
        if slot is None:
            return backoff
        user.slot = slot
        return 0.0

    def run_request(self, user: User) -> bool:
        """False: the user has no valid open-loop slot and must go through ``wait_time`` for one."""
        return self.executor.run(user)

    def _fire_request_event(self, **kwargs: Any) -> None:
        fire: Any = self.env.events.request.fire  # untyped in Locust
        fire(**kwargs)

    # --- background loops --------------------------------------------------------------------------------

    def _cpu_loop(self) -> None:
        while True:
            gevent.sleep(1.0)
            self.cpu.sample()
            self.after_cpu_sample()

    def _queue_loop(self) -> None:
        """In the middle of every wall second of an open-loop stage, sample the requests this process holds
        (in flight plus due, unsent arrivals): the over-saturation test's load series (one sample per second
        and process, so the master's sum is the whole load generator's)."""
        last = -1
        while True:
            now = time.time()
            second = math.floor(now)
            gevent.sleep((second + 0.5 if now < second + 0.5 else second + 1.5) - now)
            second = math.floor(time.time())
            stage = self.dispatch.stage
            if second == last or not stage.open_loop or not self.measuring():
                continue
            last = second
            held = outstanding(self.recorder.in_flight, self.dispatch.schedule, time.perf_counter())
            self.store.queue_sample(stage.name, second, held)

    def _loop_lag_loop(self) -> None:
        """Sleep 5 ms at a time and record how late each wake-up is: the client's own timestamp delay."""
        perf = time.perf_counter
        while True:
            t0 = perf()
            gevent.sleep(LAG_PROBE_S)
            if self.measuring():
                self.store.lag(self.recorder.window).record(max(0.0, perf() - t0 - LAG_PROBE_S))
