"""The simulated engine: a continuous-batching vLLM-V1-like server on a modeled GPU, in real time.

One asyncio task runs the step loop. It idles until work arrives; after the first arrival into an idle
engine it waits up to ``batching_window_us`` (or until the batch is full) so more requests join the first
step. Each step the scheduler plans a batch, the roofline model prices it, and the loop sleeps until the
step's absolute deadline (previous deadline + modeled duration / ``speed``, so errors never accumulate);
then every sampled request gets one token. Engine-side timestamps (``RequestTiming`` marks and every
``vllm:*`` latency) are those modeled instants on the ``time.monotonic()`` clock; how late the loop actually
woke is ``loadlens_sim_timing_error_seconds``. If it falls more than 0.25 s behind, the schedule restarts
from "now" (``loadlens_sim_schedule_slips_total``) so the marks never drift away from what clients see.

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
import dataclasses
import json
import logging
import math
import random
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

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
from exporters.serving.engines.sim import roofline
from exporters.serving.engines.sim.device import SimulatedGPU, device_state
from exporters.serving.engines.sim.knobs import STARTUP_ONLY, Knobs, coerce, merge
from exporters.serving.engines.sim.profile import LINEAR_MODULES, GPUProfile, ModelProfile, ProfileError
from exporters.serving.engines.sim.roofline import BLOCK_SIZE
from exporters.serving.engines.sim.scheduler import (
    Adapter,
    Policy,
    SchedRequest,
    Scheduler,
    SchedulerConfig,
    cdiv,
)
from exporters.serving.engines.sim.timer import DeadlineTimer
from exporters.serving.engines.sim.tokenizer import WORD_BITS, encode, make_words, stable_seed
from exporters.serving.engines.sim.vllm_metrics import VllmMetrics

log = logging.getLogger(__name__)

SLIP_SECONDS = 0.25
"""Lateness beyond which the loop gives up catching up and restarts its schedule from now."""
NATURAL_LENGTH_SIGMA = 0.8
_ATTENTION = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
"""Spread of the lognormal natural output length (shape of chat answer lengths)."""


class SimStream(RequestStream):
    """Events for one request. If the consumer lags, pending events merge into one (as vLLM's output
    collector does), so a slow client never makes the engine queue per-token objects."""

    def __init__(self, engine: SimEngine, request_id: str, timing: RequestTiming) -> None:
        self.request_id = request_id
        self.timing = timing
        self._engine = engine
        self._pending: OutputEvent | None = None
        self._ended = False
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    def _push(self, event: OutputEvent) -> None:
        pending = self._pending
        if pending is None:
            self._pending = event
        else:
            pending.text += event.text
            pending.new_tokens += event.new_tokens
            pending.output_tokens = event.output_tokens
            pending.finish_reason = event.finish_reason
            pending.stop_reason = event.stop_reason
        if event.finish_reason is not None:
            self._ended = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def __anext__(self) -> OutputEvent:
        while True:
            event = self._pending
            if event is not None:
                self._pending = None
                if event.finish_reason is not None:
                    self._closed = True
                return event
            if self._closed or self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def aclose(self) -> None:
        if not self._ended:
            self._engine._abort(self.request_id, notify=False)
        self._ended = self._closed = True
        self._pending = None


@dataclass(eq=False, slots=True)
class _Live:
    """Engine-side state of an admitted, unfinished request."""

    request: GenerationRequest
    sched: SchedRequest
    stream: SimStream
    rng: random.Random
    prompt_tokens: int
    target: int
    """Output tokens to produce unless a stop string ends the request first."""
    natural: bool
    """``target`` is the natural (EOS) length: finishing there is ``stop``, not ``length``."""
    stops: tuple[str, ...]
    hold: int
    """Characters held back while streaming so a stop string is never half-emitted."""
    pending: str = ""
    last_t: float = 0.0


@dataclass(eq=False, slots=True)
class _AdapterOp:
    adapter: Adapter
    enqueued: float
    done: asyncio.Future[None]


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
    ) -> None:
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

        k = Knobs(mean_natural_output_tokens=model.mean_natural_output_tokens, max_model_len=model.max_model_len)
        k = _profile_knobs(k, gpu.default_knobs, gpu.path)
        k = _profile_knobs(k, model.default_knobs, model.path)
        if knobs:
            k = merge(k, knobs)
        if k.max_model_len > model.max_model_len:
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"knob max_model_len: {k.max_model_len} exceeds the model's context length {model.max_model_len}",
                param="max_model_len",
            )
        available = roofline.kv_cache_bytes_available(
            model, gpu, k.gpu_memory_utilization, k.max_num_batched_tokens, k.max_num_seqs
        )
        if available <= 0:
            raise ProfileError(
                f"profile {model.path or model.name}: field 'dtype': {roofline.weight_bytes(model) / 2**30:.1f} GiB "
                f"of {model.dtype} weights leave no room for a KV cache on {gpu.name} "
                f"({gpu.memory_bytes / 2**30:.0f} GiB x gpu_memory_utilization {k.gpu_memory_utilization})"
            )
        self._override: int | None = k.num_gpu_blocks
        blocks = self._blocks_for(k, self._override, param="num_gpu_blocks" if k.num_gpu_blocks else "max_model_len")
        self._knobs = dataclasses.replace(k, num_gpu_blocks=blocks)

        self._sched = Scheduler(
            SchedulerConfig(
                max_num_seqs=k.max_num_seqs,
                max_num_batched_tokens=k.max_num_batched_tokens,
                enable_chunked_prefill=k.enable_chunked_prefill,
                policy=Policy(k.scheduling_policy),
                max_loras=k.max_loras,
                max_cpu_loras=k.effective_max_cpu_loras,
            ),
            blocks,
            enable_prefix_caching=k.enable_prefix_caching,
        )
        self._metrics = VllmMetrics(
            registry,
            model_name=self.served_model_name,
            max_model_len=k.max_model_len,
            cache_info=self._cache_info(),
            max_loras=k.max_loras,
        )
        self._device = SimulatedGPU(gpu, seed=seed)
        self._configure_device_memory()
        self._words = make_words(seed)
        self._jitter_rng = random.Random(stable_seed("jitter", seed))
        self._adapters: dict[str, Adapter] = {}
        self._loading: set[str] = set()
        self._live: dict[str, _Live] = {}
        self._ops: deque[_AdapterOp] = deque()
        self._current_op: _AdapterOp | None = None
        self._task: asyncio.Task[None] | None = None
        self._timer: DeadlineTimer | None = None
        self._idle: asyncio.Future[float] | None = None
        self._was_idle = True
        self._first_arrival: float | None = None
        self._window: asyncio.Future[float] | None = None
        self._cursor = time.monotonic()
        self._stopping = False
        self._crashed: BaseException | None = None
        self._counter = 0
        self._finish_times: deque[float] = deque(maxlen=64)
        self._lora_requests = 0

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._stopping = False
        self._cursor = time.monotonic()
        self._was_idle = True
        self._first_arrival = None
        self._timer = DeadlineTimer(asyncio.get_running_loop())
        self._task = asyncio.create_task(self._run(), name="loadlens-sim-engine")

    async def stop(self) -> None:
        self._stopping = True
        for request_id in list(self._live):
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
        return self._knobs.max_model_len

    def device_state(self, since_us: int = 0) -> Mapping[str, Any]:
        return device_state([self._device], since_us)

    # --- admission -----------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> RequestStream:
        if self._crashed is not None:
            raise EngineError(ErrorKind.INTERNAL, f"sim engine loop crashed: {self._crashed!r}")
        if self._task is None or self._stopping:
            raise EngineError(ErrorKind.UNAVAILABLE, "sim engine is not running")
        adapter = self._resolve_model(request)
        k = self._knobs
        sp = request.sampling
        field = "messages" if request.endpoint == "chat" else "prompt"
        if sp.max_tokens < 0:
            raise EngineError(ErrorKind.INVALID_REQUEST, f"max_tokens must be at least 1, got {sp.max_tokens}",
                              param="max_tokens")  # fmt: skip
        if request.priority != 0 and k.scheduling_policy != "priority":
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"Got priority {request.priority} but Priority scheduling is not enabled.",
                param="priority",
            )
        if request.image_count and not self.model.image_tokens_per_image:
            raise EngineError(ErrorKind.INVALID_REQUEST, f"model {self.served_model_name} does not accept images",
                              param=field)  # fmt: skip
        if request.request_id in self._live:
            raise EngineError(ErrorKind.INVALID_REQUEST, f"Request id {request.request_id} already running.")
        ids = encode(request.prompt, self.model.vocab)
        prompt_tokens = len(ids) + request.image_count * self.model.image_tokens_per_image
        if sp.max_tokens == 0:
            # No max_tokens (chat): as vLLM, generate up to what the context leaves.
            sp = dataclasses.replace(sp, max_tokens=max(1, k.max_model_len - prompt_tokens))
            request.sampling = sp
        if prompt_tokens + sp.max_tokens > k.max_model_len:
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"This model's maximum context length is {k.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + sp.max_tokens} tokens ({prompt_tokens} in the messages, {sp.max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
                param=field,
            )
        s = self._sched
        if s.num_waiting >= k.max_waiting:
            self._reject("max_num_queued_reqs", f"the waiting queue is full ({k.max_waiting} requests)")
        if k.max_waiting_tokens and s.waiting_tokens + prompt_tokens > k.max_waiting_tokens:
            self._reject("max_num_queued_tokens", f"the waiting queue is full ({k.max_waiting_tokens} prompt tokens)")

        now = time.monotonic()
        sched = SchedRequest(
            request_id=request.request_id,
            prompt_len=prompt_tokens,
            priority=request.priority,
            arrival=now,
            block_hashes=_block_hashes(ids, adapter.name if adapter else ""),
            lora=adapter,
            images=request.image_count,
            image_start=len(ids),
        )
        if sp.seed is not None:
            rng = random.Random(stable_seed(self.seed, "seed", sp.seed))
        elif sp.temperature == 0:
            rng = random.Random(stable_seed(self.seed, "prompt", request.prompt, request.image_count, request.model))
        else:
            rng = random.Random(stable_seed(self.seed, "request", self._counter))
        self._counter += 1
        target, natural = sp.max_tokens, False
        if not sp.ignore_eos:
            mean = k.mean_natural_output_tokens
            length = max(
                1, round(rng.lognormvariate(math.log(mean) - NATURAL_LENGTH_SIGMA**2 / 2, NATURAL_LENGTH_SIGMA))
            )
            if length < sp.max_tokens:
                target, natural = length, True
        stops = tuple(s for s in sp.stop if s)
        timing = RequestTiming(queued=now)
        stream = SimStream(self, request.request_id, timing)
        live = _Live(
            request=request,
            sched=sched,
            stream=stream,
            rng=rng,
            prompt_tokens=prompt_tokens,
            target=target,
            natural=natural,
            stops=stops,
            hold=max((len(x) for x in stops), default=1) - 1,
        )
        sched.owner = live
        self._live[request.request_id] = live
        if adapter is not None:
            self._lora_requests += 1
        s.add(sched)
        self._on_arrival(now)
        return stream

    def _resolve_model(self, request: GenerationRequest) -> Adapter | None:
        name = request.lora.lora_name if request.lora is not None else request.model
        if request.lora is None and name == self.served_model_name:
            return None
        adapter = self._adapters.get(name)
        if adapter is None:
            raise EngineError(ErrorKind.NOT_FOUND, f"The model `{name}` does not exist.", param="model")
        return adapter

    def _reject(self, reason: str, why: str) -> None:
        self._metrics.rejections[reason].inc()
        raise EngineError(
            ErrorKind.QUEUE_FULL, f"Server is overloaded: {why}; retry later.", retry_after_seconds=self._retry_after()
        )

    def _retry_after(self) -> float:
        """Seconds until a slot likely frees: the recent mean gap between completions, 1 s without history."""
        times = self._finish_times
        if len(times) < 2 or times[-1] <= times[0]:
            return 1.0
        gap = (times[-1] - times[0]) / (len(times) - 1)
        return min(max(gap, 0.05), 30.0)

    def _on_arrival(self, now: float) -> None:
        if self._was_idle and self._first_arrival is None:
            self._first_arrival = now
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(now)
            return
        window = self._window
        if window is not None and not window.done():
            s, k = self._sched, self._knobs
            if s.num_waiting >= k.max_num_seqs or s.waiting_tokens >= k.max_num_batched_tokens:
                window.set_result(now)

    # --- aborts --------------------------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        self._abort(request_id, notify=True)

    def _abort(self, request_id: str, *, notify: bool, reason: FinishReason = FinishReason.ABORT) -> None:
        live = self._live.pop(request_id, None)
        if live is None:
            return
        self._sched.abort(live.sched)
        if live.sched.lora is not None:
            self._lora_requests -= 1
        live.stream.timing.finished = time.monotonic()
        self._metrics.ended_early(reason)
        if notify:
            live.stream._push(OutputEvent("", 0, live.prompt_tokens, live.sched.num_output, finish_reason=reason))

    # --- the loop ------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._sched.has_work() and not self._ops:
                    self._sched.num_deferred = 0
                    self._publish()
                    self._was_idle = True
                    self._idle = loop.create_future()
                    await self._idle
                    self._idle = None
                if self._was_idle:
                    # First work after idleness: start at its arrival, after the batching window.
                    self._was_idle = False
                    first = self._first_arrival if self._first_arrival is not None else time.monotonic()
                    self._first_arrival = None
                    start = max(self._cursor, first)
                    window = self._knobs.batching_window_us * 1e-6 / self.speed
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
            for request_id in list(self._live):
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
        if when <= time.monotonic() or self._timer is None:
            await asyncio.sleep(0)  # behind schedule: still let clients run
            return
        await self._timer.sleep_until(when)

    def _advance_cursor(self, deadline: float) -> None:
        now = time.monotonic()
        late = now - deadline
        self._metrics.timing_error.observe(late if late > 0 else 0.0)
        if late > SLIP_SECONDS:
            self._metrics.slips.inc()
            self._cursor = now
        else:
            self._cursor = deadline

    async def _step(self) -> None:
        speed = self.speed
        t0 = self._cursor
        batch = self._sched.schedule(t0)
        if not batch:
            now = time.monotonic()
            if t0 < now:
                # Everything waiting arrived after this step's start: begin at the first such arrival.
                earliest = min((r.arrival for r in self._sched.waiting.unordered()), default=now)
                self._cursor = max(t0, min(earliest, now))
                return
            # Cannot happen with validated knobs (one request always fits); never spin if it does.
            log.warning("sim engine: work pending but nothing schedulable")
            await self._sleep_until(now + 0.001)
            self._cursor = time.monotonic()
            return
        m = self._metrics
        stall = 0.0
        for load in batch.adapter_loads:
            a = load.adapter
            seconds = roofline.adapter_activate_seconds(self.gpu, a.nbytes, from_disk=load.from_disk)
            stall += seconds
            m.adapter_loads["storage" if load.from_disk else "host"].observe(seconds / speed)
            modules = roofline.adapter_module_bytes(self.model, a.rank, a.target_modules)
            if not self._device.load_adapter(a.name, modules):
                self._fail_adapter(a)
        for a in batch.adapter_evictions:
            self._device.free_adapter(a.name)
        shape = batch.shape
        cost = roofline.step_cost(self.model, self.gpu, shape, stall_seconds=stall)
        factor = math.exp(self._jitter_rng.gauss(0.0, self.jitter)) if self.jitter else 1.0
        t1 = t0 + cost.total_seconds * factor / speed
        for req in batch.newly_scheduled:
            timing = req.owner.stream.timing
            timing.scheduled = max(t0, timing.queued)
        if batch.preempted:
            m.preemptions.inc(len(batch.preempted))
            for req in batch.preempted:
                req.owner.stream.timing.preemptions += 1
        if batch.prefix_queries:
            m.prefix_queries.inc(batch.prefix_queries)
            m.prefix_hits.inc(batch.prefix_hits)
        stall_end = t0 + stall * factor / speed
        busy_start = stall_end + cost.overhead_seconds * factor / speed
        slowest = max(cost.compute_seconds, cost.memory_seconds)
        self._device.record_busy(
            busy_start,
            t1,
            memory_fraction=min(1.0, cost.memory_seconds / cost.busy_seconds) if cost.busy_seconds else 0.0,
            intensity=roofline_intensity(cost.compute_seconds, slowest),
        )
        self._device.set_activations(roofline.activation_bytes(self.model, shape.num_tokens, shape.num_seqs))
        m.step_duration.observe(t1 - t0)
        m.batch_size.observe(shape.num_seqs)

        await self._sleep_until(t1)
        self._advance_cursor(t1)
        if stall:
            self._account_block(t0, stall_end)
        self._emit(self._sched.complete(batch), t1)
        self._publish()

    def _emit(self, sampled: list[SchedRequest], t: float) -> None:
        m = self._metrics
        words = self._words
        itl = m.itl.observe
        finished: list[SchedRequest] = []
        first_prompt = 0
        for req in sampled:
            live: _Live = req.owner
            n = req.num_output
            word = words[live.rng.getrandbits(WORD_BITS)]
            timing = live.stream.timing
            if n == 1:
                piece = word
                timing.first_token = t
                m.ttft.observe(t - live.request.arrival_time)
                first_prompt += req.prompt_len
            else:
                piece = " " + word
                itl(t - live.last_t)
            live.last_t = t
            finish: FinishReason | None = None
            stop_reason: str | None = None
            if live.stops:
                text, stop_reason = _check_stop(live, piece)
                if stop_reason is not None:
                    finish = FinishReason.STOP
            else:
                text = piece
            if finish is None and n >= live.target:
                finish = FinishReason.STOP if live.natural else FinishReason.LENGTH
                text += live.pending
                live.pending = ""
            live.stream._push(OutputEvent(text, 1, live.prompt_tokens, n, finish, stop_reason, req.num_cached_tokens))
            if finish is not None:
                finished.append(req)
                self._finished(live, finish, t)
        m.generation_tokens.inc(len(sampled))
        if first_prompt:
            m.prompt_tokens.inc(first_prompt)
        m.iteration_tokens.observe(first_prompt + len(sampled))
        if finished:
            self._sched.finish(finished)

    def _finished(self, live: _Live, reason: FinishReason, t: float) -> None:
        req = live.sched
        timing = live.stream.timing
        timing.finished = t
        del self._live[req.request_id]
        if req.lora is not None:
            self._lora_requests -= 1
        self._finish_times.append(t)
        queued = timing.queued if timing.queued is not None else t
        scheduled = timing.scheduled if timing.scheduled is not None else queued
        self._metrics.finished(
            reason,
            arrival=live.request.arrival_time,
            queued=queued,
            scheduled=scheduled,
            first_token=timing.first_token if timing.first_token is not None else t,
            last_token=t,
            prompt_tokens=live.prompt_tokens,
            output_tokens=req.num_output,
            max_tokens=live.request.sampling.max_tokens,
            preemptions=req.num_preemptions,
            computed_prompt_tokens=live.prompt_tokens - req.num_cached_tokens,
        )

    def _account_block(self, start: float, end: float) -> None:
        """Every request in the engine while the loop was blocked waits for it (guide 2.4)."""
        for live in self._live.values():
            timing = live.stream.timing
            queued = timing.queued if timing.queued is not None else start
            if queued < end:
                timing.lora_blocked_seconds += end - max(start, queued)

    def _publish(self) -> None:
        s = self._sched
        self._metrics.set_queue(len(s.running), s.num_waiting, s.num_deferred, s.pool.usage())
        running: tuple[str, ...] = ()
        waiting: tuple[str, ...] = ()
        if self._lora_requests:
            running = tuple(sorted({r.lora.name for r in s.running if r.lora is not None}))
            waiting = tuple(sorted({r.lora.name for r in s.waiting.unordered() if r.lora is not None}))
        if self._adapters or running or waiting:
            self._metrics.set_lora_info(self._knobs.max_loras, waiting, running)

    # --- adapters ------------------------------------------------------------------------------------------

    async def models(self) -> list[ModelCard]:
        cards = [ModelCard(id=self.served_model_name, max_model_len=self._knobs.max_model_len, root=self.model.hf_repo)]
        for a in sorted(self._adapters.values(), key=lambda a: a.int_id):
            cards.append(ModelCard(id=a.name, root=a.path, parent=self.served_model_name))
        return cards

    async def load_adapter(self, lora: LoRARequest) -> None:
        name = lora.lora_name
        if name in self._adapters or name in self._loading or name == self.served_model_name:
            raise EngineError(
                ErrorKind.INVALID_REQUEST, f"The lora adapter '{name}' has already been loaded.", param="lora_name"
            )
        adapter = self._read_adapter(lora)
        if adapter.rank > self._knobs.max_lora_rank:
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"LoRA rank {adapter.rank} is greater than max_lora_rank {self._knobs.max_lora_rank}.",
                param="lora_path",
            )
        if self._task is None or self._stopping:
            self._register(adapter)  # not serving yet: nothing to block
            return
        loop = asyncio.get_running_loop()
        op = _AdapterOp(adapter, time.monotonic(), loop.create_future())
        self._loading.add(name)
        self._ops.append(op)
        self._on_arrival(op.enqueued)
        try:
            await op.done
        finally:
            self._loading.discard(name)

    async def _adapter_op(self, op: _AdapterOp) -> None:
        """Read an adapter into the host cache. vLLM runs ``add_lora`` on the engine-core loop between steps,
        so every request waits for it: this is the guide-2.4 hot-swap blocking window."""
        t0 = max(self._cursor, op.enqueued)
        seconds = roofline.adapter_read_seconds(self.gpu, op.adapter.nbytes)
        t1 = t0 + seconds / self.speed
        self._metrics.adapter_loads["storage"].observe(t1 - t0)
        await self._sleep_until(t1)
        self._advance_cursor(t1)
        self._account_block(t0, t1)
        self._register(op.adapter)
        if not op.done.done():
            op.done.set_result(None)

    def _register(self, adapter: Adapter) -> None:
        self._adapters[adapter.name] = adapter
        self._sched.cache_adapter(adapter)
        self._publish()

    def _fail_adapter(self, adapter: Adapter) -> None:
        """The device could not allocate the adapter (OOM): its requests fail, its slot empties."""
        log.error("sim engine: out of device memory loading adapter %s", adapter.name)
        self._sched.gpu_adapters.pop(adapter.name, None)
        for request_id, live in list(self._live.items()):
            if live.sched.lora is adapter:
                self._abort(request_id, notify=True, reason=FinishReason.ERROR)

    async def unload_adapter(self, lora_name: str) -> None:
        adapter = self._adapters.pop(lora_name, None)
        if adapter is None:
            raise EngineError(
                ErrorKind.NOT_FOUND, f"The lora adapter '{lora_name}' cannot be found.", param="lora_name"
            )
        for freed in self._sched.forget_adapter(adapter):
            self._device.free_adapter(freed.name)
        self._publish()

    def _read_adapter(self, lora: LoRARequest) -> Adapter:
        name = lora.lora_name
        path = Path(lora.lora_path)
        config = path / "adapter_config.json"

        def bad(why: str) -> EngineError:
            return EngineError(ErrorKind.INVALID_REQUEST, f"Loading lora {name} failed: {why}", param="lora_path")

        if not config.is_file():
            raise bad(f"No adapter found for {path}")
        try:
            doc = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise bad(f"invalid adapter_config.json: {err}") from err
        if not isinstance(doc, dict):
            raise bad("adapter_config.json must hold a JSON object")
        rank = doc.get("r")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise bad(f"adapter_config.json field 'r' must be a positive integer, got {rank!r}")
        alpha = doc.get("lora_alpha", rank)
        if isinstance(alpha, bool) or not isinstance(alpha, int | float):
            raise bad(f"adapter_config.json field 'lora_alpha' must be a number, got {alpha!r}")
        modules = self._target_modules(doc.get("target_modules"), bad)
        params = roofline.adapter_params(self.model, rank, modules)
        return Adapter(
            name=name,
            int_id=lora.lora_int_id,
            path=str(path),
            rank=rank,
            alpha=float(alpha),
            target_modules=modules,
            params=params,
            nbytes=params * roofline.LORA_DTYPE_BYTES,
        )

    def _target_modules(self, raw: Any, bad: Callable[[str], EngineError]) -> tuple[str, ...]:
        if isinstance(raw, str):
            if raw == "all-linear":
                return LINEAR_MODULES
            try:
                pattern = re.compile(raw)
            except re.error as err:
                raise bad(f"target_modules is not a valid regular expression: {err}") from err
            full = {m: f"model.layers.0.{'self_attn' if m in _ATTENTION else 'mlp'}.{m}" for m in LINEAR_MODULES}
            found = tuple(m for m in LINEAR_MODULES if pattern.fullmatch(full[m]) or pattern.fullmatch(m))
        elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
            unknown = sorted({x for x in raw if x.rsplit(".", 1)[-1] not in LINEAR_MODULES})
            if unknown:
                raise bad(f"target module {unknown[0]!r} is not a linear layer of {self.model.name} "
                          f"(known: {', '.join(LINEAR_MODULES)})")  # fmt: skip
            wanted = {x.rsplit(".", 1)[-1] for x in raw}
            found = tuple(m for m in LINEAR_MODULES if m in wanted)
        else:
            raise bad(f"adapter_config.json field 'target_modules' must be a list of names or a string, got {raw!r}")
        if not found:
            raise bad(f"target_modules {raw!r} matches no linear layer of {self.model.name}")
        return found

    # --- knobs ---------------------------------------------------------------------------------------------

    def knobs(self) -> dict[str, Any]:
        return self._knobs.as_dict()

    async def set_knobs(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(changes, Mapping):
            raise EngineError(ErrorKind.INVALID_REQUEST, "knob changes must be a mapping of names to values")
        current = self._knobs
        for name in changes:
            if name in STARTUP_ONLY and coerce(name, changes[name]) != getattr(current, name):
                raise EngineError(
                    ErrorKind.INVALID_REQUEST,
                    f"knob {name}: start-up only; restart the server with --knob {name}=N",
                    param=name,
                )
        new = merge(dataclasses.replace(current, num_gpu_blocks=self._override), changes)
        # The KV cache is sized only when asked to (other knobs never resize it behind the user's back).
        override = self._override
        blocks = current.num_gpu_blocks or 0
        if "num_gpu_blocks" in changes:
            override = new.num_gpu_blocks
            blocks = self._blocks_for(new, override, param="num_gpu_blocks")
        elif "gpu_memory_utilization" in changes:
            override = None
            blocks = self._blocks_for(new, None, param="gpu_memory_utilization")
        ranks = [a.rank for a in self._adapters.values()]
        if ranks and new.max_lora_rank < max(ranks):
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"knob max_lora_rank: {new.max_lora_rank} is below the rank {max(ranks)} of a loaded adapter",
                param="max_lora_rank",
            )
        new = dataclasses.replace(new, num_gpu_blocks=blocks)
        # Validated: apply everything; nothing below may fail.
        self._knobs, self._override = new, override
        s = self._sched
        cfg = s.config
        cfg.max_num_seqs = new.max_num_seqs
        cfg.max_num_batched_tokens = new.max_num_batched_tokens
        cfg.enable_chunked_prefill = new.enable_chunked_prefill
        cfg.max_loras = new.max_loras
        cfg.max_cpu_loras = new.effective_max_cpu_loras
        s.set_policy(Policy(new.scheduling_policy))
        if new.enable_prefix_caching != s.pool.enable_caching:
            s.pool.reset_cache(new.enable_prefix_caching)
        if blocks != s.pool.num_blocks:
            preempted = s.resize(blocks)
            if preempted:
                self._metrics.preemptions.inc(len(preempted))
                for req in preempted:
                    req.owner.stream.timing.preemptions += 1
        for a in s.shrink_gpu_slots():
            self._device.free_adapter(a.name)
        while len(s.cpu_adapters) > cfg.max_cpu_loras:
            s.cpu_adapters.popitem(last=False)
        self._configure_device_memory()
        self._metrics.set_cache_info(self._cache_info())
        self._publish()
        return self.knobs()

    def _blocks_for(self, k: Knobs, override: int | None, *, param: str) -> int:
        model, gpu = self.model, self.gpu
        if override is not None:
            most = roofline.num_gpu_blocks(model, gpu, 1.0, k.max_num_batched_tokens, k.max_num_seqs)
            if override > most:
                raise EngineError(
                    ErrorKind.INVALID_REQUEST,
                    f"knob num_gpu_blocks: {override} blocks of {roofline.kv_block_bytes(model)} bytes do not fit on "
                    f"{gpu.name} next to the weights and activations (at most {most})",
                    param="num_gpu_blocks",
                )
            blocks = override
        else:
            blocks = roofline.num_gpu_blocks(
                model, gpu, k.gpu_memory_utilization, k.max_num_batched_tokens, k.max_num_seqs
            )
        needed = cdiv(k.max_model_len, BLOCK_SIZE)
        if blocks < needed:
            raise EngineError(
                ErrorKind.INVALID_REQUEST,
                f"knob {param}: the model's max seq len ({k.max_model_len}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({max(blocks, 0) * BLOCK_SIZE}). Try increasing "
                "gpu_memory_utilization or decreasing max_model_len.",
                param=param,
            )
        return blocks

    def _cache_info(self) -> dict[str, str]:
        """vLLM's CacheConfig.metrics_info() keys that mean something here (a subset; values as strings)."""
        k = self._knobs
        return {
            "block_size": str(BLOCK_SIZE),
            "cache_dtype": "auto",
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": str(k.enable_prefix_caching),
            "gpu_memory_utilization": str(k.gpu_memory_utilization),
            "is_attention_free": "False",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(k.num_gpu_blocks),
            "num_gpu_blocks_override": str(self._override),
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
            "swap_space": "4",
        }

    def _configure_device_memory(self) -> None:
        k = self._knobs
        blocks = k.num_gpu_blocks or 0
        self._device.configure_memory(
            weights=roofline.weight_bytes(self.model),
            kv_cache=blocks * roofline.kv_block_bytes(self.model),
            activation_peak=roofline.activation_bytes(self.model, k.max_num_batched_tokens, k.max_num_seqs),
            weight_segments=self.model.layers + 2,
            kv_segments=self.model.layers,
        )


def roofline_intensity(compute_seconds: float, slowest: float) -> float:
    """Power intensity of a step: 0.55 memory-bound ... 1.0 compute-bound."""
    if slowest <= 0:
        return 0.0
    return 0.55 + 0.45 * compute_seconds / slowest


def _check_stop(live: _Live, piece: str) -> tuple[str, str | None]:
    """Text to emit now and the stop string that ended the request, if any. The last ``hold`` characters are
    held back so a stop string split across tokens is never partly sent."""
    buf = live.pending + piece
    best = -1
    which: str | None = None
    for stop in live.stops:
        i = buf.find(stop)
        if i != -1 and (best == -1 or i < best):
            best, which = i, stop
    if which is not None:
        live.pending = ""
        return buf[:best], which
    cut = len(buf) - live.hold
    if cut > 0:
        live.pending = buf[cut:]
        return buf[:cut], None
    live.pending = buf
    return "", None


def _block_hashes(ids: tuple[int, ...], salt: str) -> tuple[int, ...]:
    """Chained hashes of the full 16-token blocks (each covers its whole prefix, like vLLM's)."""
    out: list[int] = []
    parent = hash(salt)
    for start in range(0, len(ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = hash((parent, ids[start : start + BLOCK_SIZE]))
        out.append(parent)
    return tuple(out)


def _profile_knobs(k: Knobs, defaults: Mapping[str, Any], path: str) -> Knobs:
    if not defaults:
        return k
    try:
        return merge(k, defaults)
    except EngineError as err:
        raise ProfileError(f"profile {path}: field 'default_knobs.{err.param}': {err.message}") from err
