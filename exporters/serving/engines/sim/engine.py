"""The simulated engine: a continuous-batching vLLM-V1-like server on a modeled GPU, in real time.

One asyncio task runs the step loop. It idles until work arrives, then waits up to ``batching_window_us`` (before
the first step, or with ``batching_window_mode=admission`` before every admission) and a step that admits pays
``insertion_overhead_us`` (guide 4.1's U-curve). Each step the scheduler plans a batch (when: :mod:`.step_planner`),
the roofline prices it, the loop sleeps until the step's absolute deadline (previous deadline + modeled duration /
``speed``: errors never accumulate), and every sampled request gets one token. Engine-side timestamps
(``RequestTiming`` marks, every ``vllm:*`` latency) are ``time.monotonic()`` instants of what really happened (a
request is scheduled when the loop planned its step, a token produced when handed to its stream, however late the
loop woke), so a sim that cannot keep real time shows the latency clients saw; the API server's share of TTFT and
E2E is :mod:`.frontend`'s. :mod:`.lateness` judges the loop's wake-ups (a warning past 50 ms late; more than 0.25 s
behind, the schedule restarts from "now"). The engine reports records (:mod:`.stats`) to a stat logger; the
Prometheus one (:class:`.vllm_metrics.VllmMetrics`) owns every series, the engine knows none.

Usage::

    engine = SimEngine(load_model_profile("tiny"), load_gpu_profile("h100-sxm"), registry=CollectorRegistry())
    await engine.start()
    stream = await engine.generate(request)      # EngineError before any output
    async for event in stream: ...
    await engine.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from exporters.serving.engine import (
    Engine,
    EngineError,
    ErrorKind,
    FinishReason,
    GenerationRequest,
    Health,
    LoRARequest,
    ModelCard,
    OutputEvent,
    RequestStream,
    RequestTiming,
)
from exporters.serving.engines.sim import roofline, stats
from exporters.serving.engines.sim.admission import check_request
from exporters.serving.engines.sim.admission_window import window_close
from exporters.serving.engines.sim.device_model import DeviceModel
from exporters.serving.engines.sim.frontend import Frontend
from exporters.serving.engines.sim.knob_plan import plan_change, scheduler_config, startup_state
from exporters.serving.engines.sim.kv_sizing import cache_config_info
from exporters.serving.engines.sim.lateness import Lateness
from exporters.serving.engines.sim.live_request import (
    LiveRequests,
    block_hashes,
    emit_tokens,
    new_live_request,
    output_rng,
)
from exporters.serving.engines.sim.lora_adapters import AdapterOp, AdapterRegistry
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.sched_types import Adapter, SchedRequest
from exporters.serving.engines.sim.scheduler import Scheduler
from exporters.serving.engines.sim.step_planner import StepPlanner
from exporters.serving.engines.sim.step_pricing import StepNoise, price_step
from exporters.serving.engines.sim.stream import SimStream
from exporters.serving.engines.sim.timer import DeadlineTimer, Timer
from exporters.serving.engines.sim.tokenizer import make_words
from exporters.serving.engines.sim.vllm_metrics import VllmMetrics, mfu_step
from loadlens.contracts import mfu, model_config
from loadlens.contracts.model_profile import ModelProfile

if TYPE_CHECKING:  # the registry only passes through to the Prometheus logger
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)


class SimEngine(Engine):
    """See the module docstring. Knob names, units and defaults: :mod:`.knobs` and docs/sim-engine.md."""

    name = "sim"

    def __init__(
        self,
        model: ModelProfile,
        gpu: GPUProfile,
        *,
        registry: CollectorRegistry,
        served_model_name: str | None = None,
        speed: float = 1.0,
        seed: int = 0,
        jitter: float = 0.0,
        knobs: Mapping[str, Any] | None = None,
        stat_loggers: Sequence[stats.StatLogger] = (),
        enable_mfu_metrics: bool = False,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[asyncio.AbstractEventLoop], Timer] = DeadlineTimer,
    ) -> None:
        """``stat_loggers`` get every record too, after the Prometheus logger on ``registry``. ``clock`` and
        ``timer`` (which wakes the loop at ``clock`` instants) are a test seam: a virtual-time loop's.
        ``enable_mfu_metrics`` registers vLLM's ``vllm:estimated_*_per_gpu_total`` counters (its
        ``--enable-mfu-metrics``)."""
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a positive finite number, got {speed}")
        if not (math.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter must be a finite number >= 0, got {jitter}")
        self.model = model
        self.gpu = gpu
        self.served_model_name = served_model_name or model.name
        self.speed = speed
        self.seed = seed
        self.jitter = jitter
        self._clock, self._new_timer = clock, timer

        self._state = startup_state(model, gpu, knobs)
        k = self._state.knobs
        self._sched = Scheduler(
            scheduler_config(k), k.num_gpu_blocks or 0, enable_prefix_caching=k.enable_prefix_caching
        )
        cache_info = cache_config_info(k, self._state.override)
        prometheus = VllmMetrics(registry, model_name=self.served_model_name, max_model_len=k.max_model_len,
                                 cache_info=cache_info, max_loras=k.max_loras,
                                 enable_mfu_metrics=enable_mfu_metrics)  # fmt: skip
        # vLLM's MFU estimate of each step (loadlens/contracts/mfu.py), computed only when it is counted.
        self._mfu = mfu.shape(model_config.from_model_profile(model)) if enable_mfu_metrics else None
        self._stats: stats.StatLogger = stats.StatLoggers([prometheus, *stat_loggers]) if stat_loggers else prometheus
        self._sched.pool.clock = clock
        self._sched.pool.on_evict = lambda life, idle, gaps: self._stats.record_event(
            stats.BlockEviction(life, idle, gaps)
        )
        self._device, self._frontend = DeviceModel(model, gpu, seed=seed, clock=clock), Frontend(gpu, speed, clock)
        self._device.configure(k)
        self._words = make_words(seed)
        self._noise = StepNoise(jitter, gpu.step_spread_seconds, seed)
        self._adapters = AdapterRegistry(model, self.served_model_name)
        self._live = LiveRequests()
        self._ops: deque[AdapterOp] = deque()
        self._current_op: AdapterOp | None = None
        self._task: asyncio.Task[None] | None = None
        self._timer: Timer | None = None
        self._idle: asyncio.Future[float] | None = None
        self._was_idle = True
        self._first_arrival: float | None = None
        self._window: asyncio.Future[float] | None = None
        self._last_admission, self._cursor = -math.inf, self._clock()
        self._planner = StepPlanner()  # when each step is planned (async_scheduling)
        self._stopping = False
        self._crashed: BaseException | None = None
        self._counter = 0
        self._lateness = Lateness(log)

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._stopping = False
        self._cursor = self._clock()
        self._was_idle = True
        self._first_arrival = None
        self._timer = self._new_timer(asyncio.get_running_loop())
        self._task = asyncio.create_task(self._run(), name="loadlens-sim-engine")

    async def stop(self) -> None:
        self._stopping = True
        for request_id in self._live.ids():
            self._abort(request_id, notify=True)
        pending = [*self._ops, *([self._current_op] if self._current_op else [])]
        self._ops.clear()
        for op in pending:
            if not op.done.done():
                op.done.set_exception(EngineError(ErrorKind.UNAVAILABLE, "sim engine stopped"))
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        self._publish()

    async def health(self) -> Health:
        if self._crashed is not None:
            return Health(False, f"sim engine loop crashed: {self._crashed!r}")
        if self._task is None:
            return Health(False, "sim engine not running")
        s = self._sched
        return Health(True, f"running={len(s.running)} waiting={s.num_waiting} kv_cache_usage={s.pool.usage():.3f}")

    def max_model_len(self) -> int:
        return self._state.knobs.max_model_len

    def device_state(self, since_us: int = 0) -> Mapping[str, Any]:
        return self._device.state(since_us)

    # --- admission -----------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> RequestStream:
        await self._frontend.enter()  # the API server's input part (frontend.py): vLLM checks after its arrival stamp
        if self._crashed is not None:
            raise EngineError(ErrorKind.INTERNAL, f"sim engine loop crashed: {self._crashed!r}")
        if self._task is None or self._stopping:
            raise EngineError(ErrorKind.UNAVAILABLE, "sim engine is not running")
        adapter = self._adapters.resolve(request)
        k = self._state.knobs
        admitted = check_request(request, k, self.model, self.served_model_name, self._live)
        prompt_tokens, s = admitted.prompt_tokens, self._sched
        if s.num_waiting >= k.max_waiting:
            self._reject("max_num_queued_reqs", f"the waiting queue is full ({k.max_waiting} requests)")
        if k.max_waiting_tokens and s.waiting_tokens + prompt_tokens > k.max_waiting_tokens:
            self._reject("max_num_queued_tokens", f"the waiting queue is full ({k.max_waiting_tokens} prompt tokens)")

        now = self._clock()
        sched = SchedRequest(
            request_id=request.request_id,
            prompt_len=prompt_tokens,
            priority=request.priority,
            arrival=now,
            block_hashes=block_hashes(admitted.ids, adapter.name if adapter else ""),
            lora=adapter,
            images=request.image_count,
            image_start=len(admitted.ids),
        )
        rng = output_rng(self.seed, request, self._counter)
        self._counter += 1
        stream = SimStream(request.request_id, RequestTiming(queued=now), self._close_stream)
        mean = k.mean_natural_output_tokens
        live = new_live_request(
            request, sched, stream, rng, prompt_tokens=prompt_tokens, max_tokens=admitted.max_tokens,
            mean_natural_output_tokens=mean,
        )  # fmt: skip
        self._live.add(live)
        s.add(sched)
        self._on_arrival(now)
        return stream

    def _reject(self, reason: stats.RejectReason, why: str) -> None:
        self._stats.record_event(stats.Rejection(reason))
        raise EngineError(ErrorKind.QUEUE_FULL, f"Server is overloaded: {why}; retry later.",
                          retry_after_seconds=self._live.retry_after())  # fmt: skip

    def _on_arrival(self, now: float) -> None:
        if self._was_idle and self._first_arrival is None:
            self._first_arrival = now
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(now)
            return
        window = self._window
        if window is not None and not window.done():
            s, k = self._sched, self._state.knobs
            if s.num_waiting >= k.max_num_seqs or s.waiting_tokens >= k.max_num_batched_tokens:
                window.set_result(now)

    # --- aborts --------------------------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        self._abort(request_id, notify=True)

    def _close_stream(self, request_id: str) -> None:
        self._abort(request_id, notify=False)

    def _abort(self, request_id: str, *, notify: bool, reason: FinishReason = FinishReason.ABORT) -> None:
        live = self._live.pop(request_id)
        if live is None:
            return
        self._sched.abort(live.sched)
        live.stream.timing.finished = self._clock()
        self._stats.record_event(stats.EarlyEnd(reason))
        if notify:
            live.stream.push(OutputEvent("", 0, live.prompt_tokens, live.sched.num_output, finish_reason=reason))

    # --- the loop ------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._sched.has_work() and not self._ops:
                    self._sched.num_deferred = 0
                    self._publish(idle=True)
                    self._was_idle = True
                    self._idle = loop.create_future()
                    await self._idle
                    self._idle = None
                if self._was_idle:
                    # First work after idleness: start at its arrival, after the batching window.
                    self._was_idle = False
                    first = self._first_arrival if self._first_arrival is not None else self._clock()
                    self._first_arrival = None
                    start = max(self._cursor, first)
                    window = self._state.knobs.batching_window_us * 1e-6 / self.speed
                    if window > 0 and self._sched.has_work() and not self._ops:
                        start = await self._batching_window(start + window)
                    self._cursor = start
                    if not self._sched.has_work() and not self._ops:
                        continue  # what woke us was aborted meanwhile
                if self._ops:
                    self._current_op = self._ops.popleft()
                    await self._adapter_op(self._current_op)
                    self._current_op = None
                else:
                    await self._step()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug: fail every request loudly rather than hang them
            log.exception("sim engine loop crashed")
            self._crashed = err
            for request_id in self._live.ids():
                self._abort(request_id, notify=True, reason=FinishReason.ERROR)

    async def _batching_window(self, end: float) -> float:
        """Wait until ``end`` or until the batch is full (``_on_arrival`` resolves it early); return when the
        window closed."""
        assert self._timer is not None
        self._window = self._timer.sleep_until(end)
        try:
            return await self._window
        finally:
            self._window = None

    async def _sleep_until(self, when: float) -> None:
        if when <= self._clock() or self._timer is None:
            await asyncio.sleep(0)  # behind schedule: still let clients run
            return
        await self._timer.sleep_until(when)

    def _advance_cursor(self, deadline: float) -> tuple[float, stats.WakeupStats]:
        """Move the schedule on from ``deadline``; returns now (wall) and how late the loop woke."""
        now = self._clock()
        wakeup = self._lateness.woke(deadline, now)
        self._cursor = now if wakeup.slipped else deadline
        return now, wakeup

    async def _step(self) -> None:
        speed = self.speed
        t0 = self._cursor
        close = window_close(self._state.knobs, self._sched, self._last_admission, 1e-6 / speed)
        admit = close is None or close <= t0
        if not admit and not self._sched.running:
            # Nothing runs while the window gathers: wait for it to close (or the batch to fill).
            assert close is not None
            self._cursor = max(t0, await self._batching_window(close))
            return
        batch = self._planner.plan(self._sched, t0, admit=admit, async_scheduling=self._state.knobs.async_scheduling)
        if not batch:
            now = self._clock()
            if t0 < now:
                # Everything waiting arrived after this step's start: begin at the first such arrival.
                earliest = self._sched.earliest_arrival()
                self._cursor = max(t0, min(now if earliest is None else earliest, now))
                return
            # Cannot happen with validated knobs (one request always fits); never spin if it does.
            log.warning("sim engine: work pending but nothing schedulable")
            await self._sleep_until(now + 0.001)
            self._cursor = self._clock()
            return
        # Marks first, while every planned request is still live (a failed adapter below may end some).
        live = self._live
        planned = self._clock()  # when this step really took its requests (t0 if the loop keeps time)
        for req in batch.newly_scheduled:
            timing = live[req.request_id].stream.timing
            timing.scheduled = max(planned, timing.queued) if timing.queued is not None else planned
        for req in batch.preempted:
            live[req.request_id].stream.timing.preemptions += 1
        factor, spread = self._noise.draw()
        insertion = self._state.knobs.insertion_overhead_us * 1e-6
        step = price_step(self.model, self.gpu, batch, start=t0, speed=speed, factor=factor,
                          insertion_overhead=insertion, spread_seconds=spread)  # fmt: skip
        if batch.num_admitted:
            self._last_admission = t0
        for load in batch.adapter_loads:
            if not self._device.load_adapter(load.adapter):
                self._fail_adapter(load.adapter)
        for a in batch.adapter_evictions:
            self._device.free_adapter(a)
        self._device.record_step(step.cost, batch.shape, busy_start=step.busy_start, end=step.end)
        est = mfu_step(self._mfu, batch.reqs, batch.num_new) if self._mfu is not None else mfu.NOTHING
        step_stats = stats.StepStats(step.end - t0, batch.shape.num_seqs, len(batch.preempted), batch.prefix_queries,
                          batch.prefix_hits, list(step.adapter_loads), est.flops, est.read_bytes, est.write_bytes,
                          step.end - step.busy_start, batch.iteration_counts())  # fmt: skip
        self._stats.record_step(step_stats)

        await self._sleep_until(step.end)
        now, wakeup = self._advance_cursor(step.end)
        self._planner.ran(t0, self._cursor)
        if step.cost.stall_seconds:
            self._live.charge_block(t0, step.stall_end)
        # Tokens are stamped when the loop hands them on (now), not at the modeled step end: a late loop delivers
        # late, as a real server's histograms show. The API server sees them after its output part (frontend.py).
        seen, out = self._frontend.output(now, batch.shape.num_seqs)
        it, finished = emit_tokens(self._live, self._sched.complete(batch), now, self._words, seen=seen, deliver=out)
        if finished:
            self._sched.finish(finished)
        self._publish(wakeup, it)
        if it.num_generation_tokens:
            # Let the streams' consumers take their tokens before the next step is planned (planning costs up to
            # ~1 ms of CPU): the HTTP layer sees them microseconds after their stamp; the deadlines do not move.
            await asyncio.sleep(0)

    def _publish(
        self,
        wakeup: stats.WakeupStats | None = None,
        iteration: stats.IterationStats | None = None,
        *,
        idle: bool = False,
    ) -> None:
        """Hand the logger the engine's state, with what the loop learned since (see :class:`stats.EngineStats`)."""
        s = self._sched
        lora: stats.LoraStats | None = None
        waiting: tuple[str, ...] = ()
        running: tuple[str, ...] = ()
        if self._live.with_lora:  # walking the queues is skipped while no request uses an adapter
            waiting, running = s.adapters_in_use()
        if len(self._adapters) or running or waiting:
            lora = stats.LoraStats(self._state.knobs.max_loras, waiting, running)
        self._stats.record(stats.EngineStats(s.stats(), lora, wakeup, iteration, idle))

    # --- adapters ------------------------------------------------------------------------------------------

    async def models(self) -> list[ModelCard]:
        base = ModelCard(id=self.served_model_name, max_model_len=self._state.knobs.max_model_len,
                         root=self.model.hf_repo)  # fmt: skip
        return [base, *self._adapters.cards()]

    async def load_adapter(self, lora: LoRARequest) -> None:
        adapter = self._adapters.prepare(lora, self._state.knobs.max_lora_rank)
        if self._task is None or self._stopping:
            self._register(adapter)  # not serving yet: nothing to block
            return
        loop = asyncio.get_running_loop()
        op = AdapterOp(adapter, self._clock(), loop.create_future())
        self._adapters.start_loading(adapter.name)
        self._ops.append(op)
        self._on_arrival(op.enqueued)
        try:
            await op.done
        finally:
            self._adapters.done_loading(adapter.name)

    async def _adapter_op(self, op: AdapterOp) -> None:
        """Read an adapter into the host cache. vLLM runs ``add_lora`` on the engine-core loop between steps,
        so every request waits for it: this is the guide-2.4 hot-swap blocking window."""
        t0 = max(self._cursor, op.enqueued)
        seconds = roofline.adapter_read_seconds(self.gpu, op.adapter.nbytes)
        t1 = t0 + seconds / self.speed
        self._stats.record_event(stats.AdapterRead(t1 - t0))
        await self._sleep_until(t1)
        _, wakeup = self._advance_cursor(t1)
        self._live.charge_block(t0, t1)
        self._register(op.adapter, wakeup)
        if not op.done.done():
            op.done.set_result(None)

    def _register(self, adapter: Adapter, wakeup: stats.WakeupStats | None = None) -> None:
        self._adapters.add(adapter)
        self._sched.cache_adapter(adapter)
        self._publish(wakeup)

    def _fail_adapter(self, adapter: Adapter) -> None:
        """The device could not allocate the adapter (OOM): its requests fail, its slot empties."""
        log.error("sim engine: out of device memory loading adapter %s", adapter.name)
        self._sched.release_gpu_slot(adapter)
        for live in list(self._live):
            if live.sched.lora is adapter:
                self._abort(live.sched.request_id, notify=True, reason=FinishReason.ERROR)

    async def unload_adapter(self, lora_name: str) -> None:
        adapter = self._adapters.remove(lora_name)
        for freed in self._sched.forget_adapter(adapter):
            self._device.free_adapter(freed)
        self._publish()

    # --- knobs ---------------------------------------------------------------------------------------------

    def knobs(self) -> dict[str, Any]:
        return self._state.knobs.as_dict()

    async def set_knobs(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        state = plan_change(self._state, changes, self.model, self.gpu, max_adapter_rank=self._adapters.max_rank())
        # Validated: apply everything; nothing below may fail.
        self._state = new = state
        k = new.knobs
        done = self._sched.reconfigure(
            scheduler_config(k), num_blocks=k.num_gpu_blocks or 0, enable_prefix_caching=k.enable_prefix_caching
        )
        for req in done.preempted:
            self._live[req.request_id].stream.timing.preemptions += 1
        for a in done.evicted:
            self._device.free_adapter(a)
        self._device.configure(k)
        self._stats.record_event(stats.KnobChange(len(done.preempted), cache_config_info(k, new.override)))
        self._publish()
        return self.knobs()
