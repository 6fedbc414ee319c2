"""The admission window and the insertion overhead (guide 4.1's U-curve mechanism; docs/sim-engine.md §1).

`batching_window_mode=admission` holds waiting requests out of the running batch until the window has passed
since the later of the oldest waiting arrival and the last admission; `insertion_overhead_us` is host time
added to a step that admits. Both default off, and then the engine behaves as before (the rest of tests/sim).
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics

import pytest

from exporters.serving.engine import EngineError
from exporters.serving.engines.sim import load_gpu_profile, load_model_profile, roofline
from exporters.serving.engines.sim.admission_window import window_close
from exporters.serving.engines.sim.knobs import Knobs, merge
from exporters.serving.engines.sim.sched_types import SchedRequest, SchedulerConfig
from exporters.serving.engines.sim.scheduler import Scheduler
from exporters.serving.engines.sim.step_pricing import price_step
from exporters.serving.engines.sim.virtual_time import run_virtual
from loadlens.experiment.analysis.fits import fit_u_curve
from tests.sim.helpers import collect, make_engine, prompt_of, request
from tests.sim.roofline_shapes import decode_shape

EXACT = 1e-9  # float error of differences of clock readings


def test_defaults_keep_the_window_idle_only_and_no_insertion_overhead() -> None:
    k = Knobs()
    assert (k.batching_window_mode, k.insertion_overhead_us) == ("idle", 0.0)
    on = merge(k, {"batching_window_mode": "admission", "insertion_overhead_us": 12000})
    assert (on.batching_window_mode, on.insertion_overhead_us) == ("admission", 12000.0)


@pytest.mark.parametrize(
    ("changes", "param", "message"),
    [
        ({"batching_window_mode": "always"}, "batching_window_mode", "must be one of idle, admission, got 'always'"),
        ({"insertion_overhead_us": -1}, "insertion_overhead_us", "must be in [0.0, 1000000.0], got -1"),
        ({"insertion_overhead_us": "12ms"}, "insertion_overhead_us", "must be a finite number, got '12ms'"),
    ],
)
def test_bad_values_name_the_knob(changes: dict[str, object], param: str, message: str) -> None:
    with pytest.raises(EngineError) as err:
        merge(Knobs(), changes)
    assert err.value.param == param and message in err.value.message


def test_schedule_without_admission_runs_only_the_running_requests_and_counts_admissions() -> None:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=512), 1000)
    a, b, c = (SchedRequest(request_id=n, prompt_len=32) for n in "abc")
    s.add(a)
    first = s.schedule()
    assert first.num_admitted == 1
    s.complete(first)
    s.add(b)
    s.add(c)
    held = s.schedule(admit=False)
    assert [r.request_id for r in held.reqs] == ["a"] and held.num_new == [1] and held.num_admitted == 0
    s.complete(held)
    both = s.schedule()
    assert [r.request_id for r in both.reqs] == ["a", "b", "c"] and both.num_admitted == 2


def test_insertion_overhead_is_host_time_of_admitting_steps_only() -> None:
    model, gpu = load_model_profile("deepseek-r1-distill-llama-8b"), load_gpu_profile("h200")
    s = Scheduler(SchedulerConfig(), 1000)
    s.add(SchedRequest(request_id="a", prompt_len=64))
    admitting = s.schedule()
    priced = price_step(model, gpu, admitting, start=0.0, speed=1.0, factor=1.0, insertion_overhead=0.012)
    plain = roofline.step_cost(model, gpu, admitting.shape)
    assert priced.cost.overhead_seconds == pytest.approx(plain.overhead_seconds + 0.012, abs=1e-12)
    assert priced.cost.busy_seconds == pytest.approx(plain.busy_seconds, abs=1e-12)  # the GPU idles meanwhile
    assert priced.end == pytest.approx(plain.total_seconds + 0.012, abs=1e-12)
    s.complete(admitting)
    decoding = s.schedule()
    assert decoding.num_admitted == 0
    again = price_step(model, gpu, decoding, start=0.0, speed=1.0, factor=1.0, insertion_overhead=0.012)
    assert again.end == pytest.approx(roofline.step_cost(model, gpu, decoding.shape).total_seconds, abs=1e-12)


def test_admission_window_gathers_arrivals_while_the_batch_runs() -> None:
    """A long request is decoding (Llama-8B steps: ~0.4 ms at speed 20); two more arrive 5 ms apart. In
    `admission` mode both wait for the window (0.5 s modeled = 25 ms at speed 20) and join in one step; in
    `idle` mode each joins at the next step after its arrival, so the first before the second arrives. Virtual
    time (engines/sim/virtual_time.py): the 5 ms are exact and the loop keeps time, so the bounds are a step."""
    model = "deepseek-r1-distill-llama-8b"
    # A waiting request joins at the first step boundary after it may: within one decode step of ``long``,
    # the longest of which is its last (context 16 + 1000 tokens).
    step = roofline.step_cost(load_model_profile(model), load_gpu_profile("h100-sxm"), decode_shape(1, 1016))
    step_s = step.total_seconds / 20.0

    async def body(mode: str) -> tuple[float, float, float]:
        engine, _ = make_engine(model, speed=20.0, batching_window_us=500_000, batching_window_mode=mode)
        await engine.start()
        long = await engine.generate(request("long", prompt_of(16), model=model, max_tokens=1000))
        async for _ in long:  # it runs (and its admission is behind us) once it has a token
            break
        b = await engine.generate(request("b", prompt_of(16, 1), model=model, max_tokens=2))
        await asyncio.sleep(0.005)
        c = await engine.generate(request("c", prompt_of(16, 2), model=model, max_tokens=2))
        await asyncio.gather(collect(b), collect(c))
        await long.aclose()
        await engine.stop()
        tb, tc = b.timing, c.timing
        assert tb.scheduled is not None and tc.scheduled is not None and tb.queued is not None
        return tb.scheduled - tb.queued, tc.scheduled - tb.scheduled, tc.scheduled

    waited, apart, _ = run_virtual(body("admission"))
    assert 0.025 <= waited < 0.025 + step_s  # the window runs from b's arrival (after long's admission)
    assert apart == 0.0  # one step took both
    waited_idle, apart_idle, _ = run_virtual(body("idle"))
    assert waited_idle < step_s and 0.005 - step_s < apart_idle < 0.005 + step_s


def test_an_admitting_step_pays_the_insertion_overhead_and_decode_steps_do_not() -> None:
    model, gpu = load_model_profile("tiny"), load_gpu_profile("h100-sxm")
    speed, overhead_us = 10.0, 100_000.0  # 100 ms modeled = 10 ms wall per admitting step

    async def body() -> tuple[float, float]:
        engine, _ = make_engine(speed=speed, insertion_overhead_us=overhead_us)
        await engine.start()
        stream = await engine.generate(request("a", prompt_of(32), max_tokens=4))
        await collect(stream)
        await engine.stop()
        t = stream.timing
        assert t.queued is not None and t.first_token is not None and t.finished is not None
        return t.first_token - t.queued, t.finished - t.first_token

    ttft, decode = run_virtual(body())  # virtual time: the marks are the modeled instants
    prefill = roofline.step_cost(model, gpu, roofline.BatchShape(32, 1, 1, roofline.attn_pairs(32, 0), 0))
    floor = (prefill.total_seconds + overhead_us * 1e-6) / speed
    assert ttft == pytest.approx(floor, abs=EXACT)
    assert decode < overhead_us * 1e-6 / speed  # three decode steps of ~0.7 ms modeled each, no overhead
    steps = sum(roofline.step_cost(model, gpu, decode_shape(1, 32 + i)).total_seconds for i in range(3))
    assert decode == pytest.approx(steps / speed, abs=EXACT)


def replay(window_us: float, *, rate: float = 40.0, seconds: float = 20.0, seed: int = 1) -> list[float]:
    """The engine's loop replayed in modeled time (no wall clock, so no machine noise): Poisson arrivals of
    64-token prompts asking 64 tokens, on the batching-window experiment's sim (Llama-8B on an H200,
    admission window, 12 ms insertion overhead). The same scheduler, window rule and step prices as the
    engine; returns each request's E2E (modeled s)."""
    model, gpu = load_model_profile("deepseek-r1-distill-llama-8b"), load_gpu_profile("h200")
    k = merge(Knobs(), {"batching_window_mode": "admission", "insertion_overhead_us": 12000,
                        "batching_window_us": window_us})  # fmt: skip
    s = Scheduler(SchedulerConfig(max_num_seqs=k.max_num_seqs, max_num_batched_tokens=k.max_num_batched_tokens), 10**5)
    rng = random.Random(seed)
    arrivals: list[float] = []
    t = rng.expovariate(rate)
    while t < seconds:
        arrivals.append(t)
        t += rng.expovariate(rate)
    e2e: list[float] = []
    now, nxt, last_admission = 0.0, 0, -math.inf
    while nxt < len(arrivals) or s.has_work():
        while nxt < len(arrivals) and arrivals[nxt] <= now:
            s.add(SchedRequest(request_id=str(nxt), prompt_len=64, arrival=arrivals[nxt]))
            nxt += 1
        upcoming = arrivals[nxt] if nxt < len(arrivals) else math.inf
        if not s.has_work():
            now = upcoming
            continue
        close = window_close(k, s, last_admission, 1e-6)
        if close is not None and close > now and not s.running:
            now = min(close, upcoming)  # the engine's window wait (an arrival may fill the batch)
            continue
        batch = s.schedule(now, admit=close is None or close <= now)
        step = price_step(model, gpu, batch, start=now, speed=1.0, factor=1.0,
                          insertion_overhead=k.insertion_overhead_us * 1e-6)  # fmt: skip
        if batch.num_admitted:
            last_admission = now
        now = step.end
        done = [r for r in s.complete(batch) if r.num_output == 64]
        e2e.extend(now - r.arrival for r in done)
        s.finish(done)
    return e2e


def test_the_experiments_sim_has_a_u_shaped_e2e_in_modeled_time() -> None:
    """Guide 4.1's U on the packaged batching-window sim, free of wall-clock noise: a 3 ms window inserts at
    nearly every step (each 6-7 ms decode step of ~25 running requests pays the 12 ms overhead about half the
    time), 100 ms inserts once per ~15 steps for a wait of up to 100 ms, 1 s makes every request wait up to
    a second. The numbers docs/experiments.md quotes as modeled."""
    windows = [3000.0, 10000.0, 30000.0, 100000.0, 300000.0, 1000000.0]
    medians = [statistics.median(replay(w)) * 1000 for w in windows]
    assert [round(m) for m in medians] == [588, 555, 499, 493, 584, 987]
    fit = fit_u_curve(windows, medians)
    assert fit.r2 > 0.99 and fit.interior and 30000 < fit.optimum_x < 100000 and fit.dip_ratio > 0.15
