"""Runs the sim engine over a stage's load in virtual time: ``users`` closed-loop users, each sending requests
of ``prompt`` tokens asking ``output`` tokens (ignore_eos; with ``output_stdev`` a length drawn per request) one
after another (with ``think_time`` a drawn wait between), for ``duration`` modeled seconds after a warmup (the
stage's lead-in where the run recorded one: its users, then the users added at once at the stage's start, as
the load generator spawns them). Every request sent inside the stage is measured to its end. No
HTTP and no wall clock: the loop's clock jumps to the engine's next deadline whenever nothing is ready, so the
figures are the model's, whatever the machine's load, and a 20 s stage replays in a fraction of a second
(docs/calibration.md, *Prediction*).

The figures have the sweep's names: client-side TTFT, ITL (a step carrying k tokens after a gap g gives k
samples of g/k, as loadgen counts them), E2E (medians and P99s, ms), output throughput (the measured requests'
tokens over the stage's seconds, as loadgen counts it); and the server's figures from the sim's own ``vllm:``
series over the window (as long as the sampler's was, ``server_span_s``), computed as calibrate computes them
from the real server's (observations.server_figures: histogram means, output tokens
per second, Little's law's mean running requests). ``client_overhead_s`` is waited between a request's sending
and its arrival at the engine, so it is in the request's client TTFT and E2E (the time outside vLLM that the
real client saw); ``turnaround_s`` is waited after each answer before the user's next request, in no latency
but in the cycle (calibrate/client_overhead.py); ``delivery_noise_s`` is the mean of an exponential delay
drawn for each token event between the engine and the client (calibrate/delivery_noise.py).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest

from exporters.serving.calibrate.observations import Stage, server_figures
from exporters.serving.calibrate.user_draws import NO_THINK, Clamped, output_length
from exporters.serving.engine import GenerationRequest, SamplingParams
from exporters.serving.engines.sim import SimEngine
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.stats import StatLogger
from exporters.serving.engines.sim.virtual_time import LoopTimer, VirtualTimeLoop
from loadlens.contracts.engine_counters import SPAN, counter_increases, parse_engine_counters
from loadlens.contracts.kv_capacity import KvCapacity, parse_kv_capacity
from loadlens.contracts.model_profile import ModelProfile

Loggers = Callable[[Callable[[], float]], Sequence[StatLogger]]
"""Given the replay's virtual clock, stat loggers for its engine beside its Prometheus one."""
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_WORDS = tuple(a + b + c for a in _LETTERS for b in _LETTERS for c in _LETTERS)
"""Every three-letter word, in order: word i is letters (i // 676, i // 26, i) mod 26."""


def prompt_text(tokens: int, salt: int) -> str:
    """Text the sim's tokenizer counts as ``tokens`` tokens (three-letter words), different per salt so that
    prompts share no prefix-cache block (the sweep's prompts are random text)."""
    words: list[str] = []
    pos = salt * 7919 % len(_WORDS)
    while len(words) < tokens:  # slices of the table, wrapping round: a replay builds thousands of prompts
        words.extend(_WORDS[pos : pos + tokens - len(words)])
        pos = 0
    return " ".join(words)


WARMUP_S = 2.0
"""The replay's warmup (modeled seconds) where the stage's own lead-in is not known."""
LEAD_IN_CAP_S = 60.0
"""The longest a lead-in that ends on a count of answers runs in the replay (modeled seconds)."""


@dataclass(frozen=True, slots=True)
class StageLoad:
    users: int
    prompt: int
    output: int
    duration_s: float
    warmup_s: float = WARMUP_S
    output_stdev: float = 0.0
    """The spread of the output lengths (tokens): each request's drawn as the load generator draws it, a normal
    of mean ``output`` rounded and never below 1; 0: every request asks exactly ``output``."""
    think_time: Clamped = NO_THINK
    """The user's think time after each answer (seconds), drawn as the load generator draws it."""
    lead_in_users: int | None = None
    """The users of the stage before the measured one (the warmup), which runs ``warmup_s`` (or, with
    ``lead_in_requests``, until that many of its requests are answered); at its end the users added start at
    once and those dropped send no more, as the load generator does. None: all ``users`` start together at 0."""
    lead_in_requests: int | None = None
    """The lead-in ends when this many of its requests are answered (a warmup ``until_requests``: the load
    generator polls for it and ends the stage within about 20 ms), ``warmup_s`` at the latest; None: it runs
    ``warmup_s``."""
    server_span_s: float | None = None
    """The seconds the server's counters covered per run where the sampler's first and last reading inside the
    stage were that far apart (``SPAN`` per run); the replay reads its own counters over a window that long,
    placed at a drawn offset inside the stage as the sampler's phase placed it. None: the whole stage."""


def stage_load(stage: Stage) -> StageLoad:
    """The load of a measured stage: its users, the tokens the server counted, its duration, the spread of its
    output lengths, its users' think time, the load before it and the span of its server counters."""
    span = stage.counters.get(SPAN)
    lead = stage.lead_in
    return StageLoad(stage.users, round(stage.prompt_tokens), round(stage.output_tokens), stage.duration_s,
                     warmup_s=(LEAD_IN_CAP_S if lead.requests else lead.duration_s) if lead else WARMUP_S,
                     output_stdev=stage.output_stdev, think_time=stage.think_time,
                     lead_in_users=lead.users if lead else None, lead_in_requests=lead.requests if lead else None,
                     server_span_s=span / stage.runs if span is not None and stage.runs else None)  # fmt: skip


def _quantile(values: list[float], q: float) -> float | None:
    """Linear interpolation between order statistics (numpy's default), None when empty."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _counters(registry: CollectorRegistry, now: float) -> tuple[float, dict[str, float]]:
    return now, parse_engine_counters(generate_latest(registry).decode())


@dataclass(frozen=True, slots=True)
class Replayed:
    figures: dict[str, float | None]
    """Client-side and server-side figures, by the sweep's keys."""
    counters: dict[str, float]
    """The sim's engine counter increases over the window (vLLM's names)."""
    kv_capacity: KvCapacity | None = None
    """The KV capacity the sim states in its ``vllm:cache_config_info`` at the window's end."""
    samples: dict[str, list[float]] = field(default_factory=dict)
    """The client samples behind the percentiles, ms: ``ttft`` and ``e2el`` per request, ``itl`` per token
    interval (calibrate/ranks.py places the real percentiles in them)."""


async def _replay(
    model: ModelProfile,
    gpu: GPUProfile,
    load: StageLoad,
    knobs: dict[str, object],
    overhead_s: float,
    turnaround_s: float,
    delivery_s: float = 0.0,
    seed: int = 0,
    loggers: Loggers | None = None,
) -> Replayed:
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry()
    engine = SimEngine(model, gpu, registry=registry, served_model_name="tiny-replay", speed=1.0, seed=0,
                       jitter=0.0, knobs=knobs, clock=loop.time, timer=LoopTimer,
                       stat_loggers=loggers(loop.time) if loggers else ())  # fmt: skip
    await engine.start()
    base = loop.time()
    ttft: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    tokens_measured = 0
    counter = 0
    answered = 0  # the lead-in's requests answered
    rng = random.Random(3 * seed)
    lengths = random.Random(3 * seed + 1)  # streams of their own: a spread or a think time leaves the rest as it was
    thinking = random.Random(3 * seed + 2)
    started = loop.create_future()  # the stage's start (its t0), set when the lead-in ends

    def draw(mean: float) -> float:
        return rng.expovariate(1 / mean) if mean > 0 else 0.0

    def start_stage() -> None:
        if not started.done():
            started.set_result(loop.time())

    def in_stage(t: float) -> bool:
        return started.done() and started.result() <= t < started.result() + load.duration_s

    async def user(first_at: float | None, dropped: bool) -> None:
        """One closed-loop user: its first request at ``first_at`` (None: at the stage's start, plus its place
        among the users the stage adds); a lead-in user the stage ``dropped`` sends nothing once the stage began;
        none is sent after the stage. Every request sent inside the stage is measured to its end, as the load
        generator measures it."""
        nonlocal tokens_measured, counter, answered
        if first_at is None:
            first_at = await started + added.pop(0)
        await asyncio.sleep(max(0.0, first_at - loop.time()))
        while True:
            now = loop.time()
            if started.done() and (now >= started.result() + load.duration_s or dropped):
                return
            counter += 1
            rid = counter
            sent = now
            measured = in_stage(sent)
            await asyncio.sleep(draw(overhead_s))  # the time outside the engine, before arrival
            req = GenerationRequest(
                request_id=f"r{rid}", endpoint="completions", model="tiny-replay",
                prompt=prompt_text(load.prompt, rid), image_count=0,
                sampling=SamplingParams(max_tokens=output_length(load.output, load.output_stdev, lengths),
                                        temperature=0.0, ignore_eos=True),
                arrival_time=loop.time(),
            )  # fmt: skip
            stream = await engine.generate(req)
            last = None
            first = None
            tokens = 0
            gaps: list[float] = []
            async for event in stream:
                # When the client sees it: after the host's delivery delay, never before the previous event.
                now = loop.time() + draw(delivery_s)
                if last is not None:
                    now = max(now, last)
                tokens += event.new_tokens
                if first is None:
                    first = now
                elif last is not None and event.new_tokens:
                    gaps += [(now - last) / event.new_tokens] * event.new_tokens
                last = now
            if measured and first is not None and last is not None:
                ttft.append(first - sent)
                e2e.append(last - sent)
                itl.extend(gaps)
                tokens_measured += tokens
            if last is not None and last > loop.time():
                await asyncio.sleep(last - loop.time())  # the answer is complete when the client has it
            if not started.done():
                answered += 1
                if load.lead_in_requests is not None and answered >= load.lead_in_requests:
                    start_stage()
            await asyncio.sleep(draw(turnaround_s))  # the load generator's own time before the next request
            await asyncio.sleep(load.think_time.draw(thinking))  # and the user's think time

    async def lead_in_clock() -> None:
        await asyncio.sleep(load.warmup_s)
        start_stage()

    # Users start 0.1 ms apart: their first requests do not land on one instant. With a lead-in its users run
    # from 0 and, at the stage's start, the users it lacks start at once and those it has over stop sending.
    lead = load.lead_in_users if load.lead_in_users is not None else load.users
    added = [k * 1e-4 for k in range(max(0, load.users - lead))]
    tasks = [asyncio.create_task(user(base + i * 1e-4, i >= load.users)) for i in range(lead)]
    tasks += [asyncio.create_task(user(None, False)) for _ in range(lead, load.users)]
    clock = asyncio.create_task(lead_in_clock())
    t0 = await started
    clock.cancel()
    t1 = t0 + load.duration_s
    span = load.server_span_s
    if span is not None and 0 < span < load.duration_s:
        w0 = t0 + random.Random(-1 - seed).uniform(0.0, load.duration_s - span)
        w1 = w0 + span
    else:
        w0, w1 = t0, t1
    await asyncio.sleep(max(0.0, w0 - loop.time()))
    before = _counters(registry, w0)
    await asyncio.sleep(max(0.0, w1 - loop.time()))
    after = _counters(registry, w1)
    capacity = parse_kv_capacity(generate_latest(registry).decode())
    await asyncio.gather(*tasks)
    await engine.stop()

    def ms(value: float | None) -> float | None:
        return None if value is None else value * 1000

    figures: dict[str, float | None] = {
        "mean_ttft_ms": ms(sum(ttft) / len(ttft)) if ttft else None,
        "mean_e2el_ms": ms(sum(e2e) / len(e2e)) if e2e else None,
        "median_ttft_ms": ms(_quantile(ttft, 0.5)),
        "p99_ttft_ms": ms(_quantile(ttft, 0.99)),
        "median_itl_ms": ms(_quantile(itl, 0.5)),
        "p99_itl_ms": ms(_quantile(itl, 0.99)),
        "median_e2el_ms": ms(_quantile(e2e, 0.5)),
        "p99_e2el_ms": ms(_quantile(e2e, 0.99)),
        "output_throughput": tokens_measured / load.duration_s,
        "completed": float(len(e2e)),
    }
    counters = counter_increases([before, after], [(w0, w1)])
    figures.update(server_figures(counters, counters.get(SPAN, load.duration_s)))
    samples = {"ttft": [v * 1000 for v in ttft], "itl": [v * 1000 for v in itl], "e2el": [v * 1000 for v in e2e]}
    return Replayed(figures, counters, capacity, samples)


def replay(
    model: ModelProfile,
    gpu: GPUProfile,
    load: StageLoad,
    knobs: dict[str, object] | None = None,
    client_overhead_s: float = 0.0,
    turnaround_s: float = 0.0,
    delivery_noise_s: float = 0.0,
    seed: int = 0,
    loggers: Loggers | None = None,
) -> Replayed:
    """The stage's figures from the sim (a fresh engine on a fresh virtual-time loop); ``seed`` picks the draws
    (time outside the engine, lengths, think times, delivery delays); ``loggers``, given the loop's virtual
    clock, makes more stat loggers for the engine (a test's view of its steps)."""
    done: list[Replayed] = []

    async def run() -> None:
        # The result leaves through ``done``, not as the task's: on the main thread the runner's SIGINT handler
        # holds the task, and Python's signal module formats that handler (the result's thousands of samples
        # with it) each time it reads it back.
        done.append(await _replay(model, gpu, load, dict(knobs or {}), client_overhead_s, turnaround_s,
                                  delivery_noise_s, seed, loggers))  # fmt: skip

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(run())
    return done[0]


def replay_runs(
    model: ModelProfile,
    gpu: GPUProfile,
    load: StageLoad,
    runs: int,
    knobs: dict[str, object] | None = None,
    client_overhead_s: float = 0.0,
    turnaround_s: float = 0.0,
    delivery_noise_s: float = 0.0,
) -> Replayed:
    """``runs`` replays of the stage, each with draws of its own, read as calibrate reads a trial run that many
    times: each client figure the mean of the runs' (a percentile of a short run is a noisy estimate, and the
    real stage's is that same mean), the server's figures over the summed counters, the samples pooled, the
    completed requests summed."""
    done = [
        replay(model, gpu, load, knobs, client_overhead_s, turnaround_s, delivery_noise_s, seed=i)
        for i in range(max(1, runs))
    ]
    if len(done) == 1:
        return done[0]
    figures: dict[str, float | None] = {}
    for key in done[0].figures:
        values = [v for r in done if (v := r.figures.get(key)) is not None]
        figures[key] = sum(values) / len(values) if values else None
    figures["completed"] = sum(r.figures.get("completed") or 0.0 for r in done)
    counters: dict[str, float] = {}
    for r in done:
        for name, value in r.counters.items():
            counters[name] = counters.get(name, 0.0) + value
    figures.update(server_figures(counters, counters.get(SPAN, load.duration_s * len(done))))
    samples = {key: [v for r in done for v in r.samples.get(key, [])] for key in done[0].samples}
    return Replayed(figures, counters, done[-1].kv_capacity, samples)
