"""A step's instants and its noise (exporters/serving/engines/sim/step_pricing.py): the profile's measured
``step_spread_seconds`` added to the modeled step, the ``--jitter`` lognormal multiplied, each from a seeded
stream of its own; its ``decode_step_offsets_seconds`` added to a decode-only step of their batch."""

from __future__ import annotations

import pytest

from exporters.serving.engines.sim import load_gpu_profile, load_model_profile
from exporters.serving.engines.sim import roofline as rl
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.sched_types import SchedRequest, ScheduledBatch
from exporters.serving.engines.sim.step_pricing import StepNoise, price_step
from tests.sim.roofline_shapes import decode_shape

MODEL = load_model_profile("qwen2.5-7b")
GPU = load_gpu_profile("h100-sxm")


def _batch(batch: int = 4, context: int = 200) -> ScheduledBatch:
    return ScheduledBatch([], [], decode_shape(batch, context), [], [], [], [], 0, 0)


def test_the_spread_is_added_to_the_modeled_step_and_scaled_by_speed_like_it() -> None:
    cost = rl.step_cost(MODEL, GPU, _batch().shape)
    plain = price_step(MODEL, GPU, _batch(), start=10.0, speed=2.0, factor=1.5)
    assert plain.end == pytest.approx(10.0 + cost.total_seconds * 1.5 / 2.0, rel=1e-12)
    later = price_step(MODEL, GPU, _batch(), start=10.0, speed=2.0, factor=1.5, spread_seconds=0.004)
    assert later.end == pytest.approx(plain.end + 0.002, rel=1e-12)
    # The host overhead and the kernels' start are the model's: the spread moves only the end.
    assert (later.busy_start, later.stall_end, later.cost) == (plain.busy_start, plain.stall_end, plain.cost)


def test_a_step_never_ends_before_its_host_overhead_does() -> None:
    cost = rl.step_cost(MODEL, GPU, _batch().shape)
    short = price_step(MODEL, GPU, _batch(), start=0.0, speed=1.0, factor=1.0, spread_seconds=-10.0)
    assert short.end == short.busy_start == pytest.approx(cost.overhead_seconds, rel=1e-12)  # a run of no time
    busy = cost.total_seconds - cost.overhead_seconds
    cut = price_step(MODEL, GPU, _batch(), start=0.0, speed=1.0, factor=1.0, spread_seconds=-busy / 2)
    assert cut.end - cut.busy_start == pytest.approx(busy / 2, rel=1e-9)


def test_the_noise_draws_the_profiles_values_from_a_seeded_stream_of_its_own() -> None:
    spread = (-0.002, -0.001, 0.0, 0.003)
    noise = StepNoise(0.0, spread, seed=7)
    got = [noise.draw() for _ in range(400)]
    assert {factor for factor, _ in got} == {1.0}
    assert {added for _, added in got} == set(spread)  # each value drawn, nothing else
    again = StepNoise(0.0, spread, seed=7)
    assert [again.draw() for _ in range(400)] == got
    other = StepNoise(0.0, spread, seed=8)
    assert [other.draw() for _ in range(400)] != got


def test_a_spread_leaves_the_jitters_draws_as_they_were() -> None:
    alone, both = StepNoise(0.3, (), seed=3), StepNoise(0.3, (-0.001, 0.001), seed=3)
    factors = [alone.draw() for _ in range(50)]
    assert [f for f, _ in factors] == [f for f, _ in (both.draw() for _ in range(50))]
    assert {added for _, added in factors} == {0.0}
    assert all(f != 1.0 for f, _ in factors)
    assert StepNoise(0.0, (), seed=3).draw() == (1.0, 0.0)


def _requests(decodes: int, prefills: int = 0) -> ScheduledBatch:
    """``decodes`` requests with output tokens (one new token each) and ``prefills`` in their context phase."""
    reqs = [SchedRequest(f"d{i}", 200, num_output=5) for i in range(decodes)]
    reqs += [SchedRequest(f"p{i}", 200) for i in range(prefills)]
    shape = decode_shape(decodes + prefills, 200)
    return ScheduledBatch(reqs, [1] * decodes + [200] * prefills, shape, [], [], [], [], 0, 0)


def _with_offsets(*offsets: float) -> GPUProfile:
    return GPU.model_copy(update={"decode_step_offsets_seconds": offsets})


def test_a_decode_only_steps_offset_is_its_batchs_and_scaled_like_the_model() -> None:
    gpu = _with_offsets(0.0, 0.003, -0.002)
    for batch, offset in ((1, 0.0), (2, 0.003), (3, -0.002), (4, 0.0)):  # past the list: none
        plain = price_step(MODEL, GPU, _requests(batch), start=5.0, speed=2.0, factor=1.5)
        moved = price_step(MODEL, gpu, _requests(batch), start=5.0, speed=2.0, factor=1.5, spread_seconds=0.001)
        assert moved.end == pytest.approx(plain.end + (offset * 1.5 + 0.001) / 2.0, rel=1e-12), batch
        assert (moved.busy_start, moved.cost) == (plain.busy_start, plain.cost)


def test_a_step_with_a_request_in_its_context_phase_takes_no_offset() -> None:
    gpu = _with_offsets(0.004, 0.004, 0.004)
    plain = price_step(MODEL, GPU, _requests(2, prefills=1), start=0.0, speed=1.0, factor=1.0)
    assert price_step(MODEL, gpu, _requests(2, prefills=1), start=0.0, speed=1.0, factor=1.0).end == plain.end


def test_a_negative_offset_never_ends_a_step_before_its_host_overhead() -> None:
    short = price_step(MODEL, _with_offsets(-10.0), _requests(1), start=0.0, speed=1.0, factor=1.0)
    assert short.end == short.busy_start
