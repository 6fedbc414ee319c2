"""The ``async_scheduling`` knob (vLLM's async scheduling: each step planned while the one before it runs), on
virtual time. A request that arrives during a step enters the batch at the step after next with it, at the next
one without; a request that finds no step in flight is planned at once either way."""

from __future__ import annotations

import asyncio

import pytest

from exporters.serving.engine import EngineError
from exporters.serving.engines.sim import load_gpu_profile
from exporters.serving.engines.sim.roofline import BatchShape, step_cost
from exporters.serving.engines.sim.virtual_time import run_virtual
from loadlens.contracts.model_profile import load_model_profile
from tests.sim.helpers import make_engine, now, prompt_of, request
from tests.sim.roofline_shapes import decode_shape, prefill_shape

SPEED = 2.0
MODEL, GPU = load_model_profile("tiny"), load_gpu_profile("h100-sxm")


def seconds(shape: BatchShape) -> float:
    return step_cost(MODEL, GPU, shape).total_seconds / SPEED


def arrival_mid_step(async_on: bool) -> tuple[float, float, list[float]]:
    """A runs alone (100-token prompt, 12 tokens); B (100 tokens, 2 tokens) arrives halfway through A's first
    decode step. Returns B's arrival and its scheduled instant, and A's token instants, all from A's arrival."""
    out: dict[str, object] = {}

    async def body() -> None:
        engine, _ = make_engine(speed=SPEED, async_scheduling=async_on)
        await engine.start()
        start = now()
        a = await engine.generate(request("a", prompt_of(100), max_tokens=12))
        a_times: list[float] = []

        async def read_a() -> None:
            async for _ in a:
                a_times.append(now() - start)

        reader = asyncio.create_task(read_a())
        await asyncio.sleep(seconds(prefill_shape(100)) + seconds(decode_shape(1, 100)) / 2)
        b_arrival = now() - start
        b = await engine.generate(request("b", prompt_of(100, salt=1), max_tokens=2))
        async for _ in b:
            pass
        await reader
        await engine.stop()
        assert b.timing.scheduled is not None
        out.update(b_arrival=b_arrival, b_scheduled=b.timing.scheduled - start, a_times=a_times)

    run_virtual(body())
    return out["b_arrival"], out["b_scheduled"], out["a_times"]  # type: ignore[return-value]


def test_an_arrival_during_a_step_waits_for_the_step_already_planned() -> None:
    b_arrival, sync_at, a_sync = arrival_mid_step(False)
    b_arrival_async, async_at, a_async = arrival_mid_step(True)
    assert b_arrival_async == pytest.approx(b_arrival, abs=1e-12)
    # Planning between steps: B joins the step that starts when A's first decode ends (A's 2nd token).
    assert sync_at == pytest.approx(a_sync[1], abs=1e-9)
    # Planned one ahead: the step after A's first decode was planned when that decode started, before B came;
    # B joins the one after it (A's 3rd token), one decode step of A alone later.
    assert async_at == pytest.approx(a_async[2], abs=1e-9)
    assert async_at - sync_at == pytest.approx(a_async[2] - a_async[1], abs=1e-9)
    assert a_async[:2] == pytest.approx(a_sync[:2], abs=1e-12)  # the running request's first steps are the same


def test_a_request_into_an_idle_engine_is_planned_at_once() -> None:
    def first_token(async_on: bool) -> float:
        got: list[float] = []

        async def body() -> None:
            engine, _ = make_engine(speed=SPEED, async_scheduling=async_on)
            await engine.start()
            start = now()
            stream = await engine.generate(request("a", prompt_of(100), max_tokens=2))
            async for _ in stream:
                got.append(now() - start)
            await engine.stop()

        run_virtual(body())
        return got[0]

    assert first_token(True) == pytest.approx(first_token(False), abs=1e-12)


def test_the_knob_is_a_boolean() -> None:
    async def body() -> None:
        engine, _ = make_engine(speed=SPEED)
        await engine.start()
        assert engine.knobs()["async_scheduling"] is False
        with pytest.raises(EngineError) as err:
            await engine.set_knobs({"async_scheduling": "yes"})
        assert err.value.param == "async_scheduling"
        assert (await engine.set_knobs({"async_scheduling": True}))["async_scheduling"] is True
        await engine.stop()

    run_virtual(body())
