"""The telemetry maths against hand-computed values."""

from __future__ import annotations

import pytest

from exporters.training.maths import CheckpointPolicy, Ema, Window, jump_ratio, pearson
from loadlens.contracts.slo import load_slos


def test_ema_seeds_with_the_first_value_then_recurses() -> None:
    ema = Ema(0.9)
    assert ema.update(1.0) == 1.0
    assert ema.update(2.0) == pytest.approx(0.9 * 1.0 + 0.1 * 2.0)  # 1.1
    assert ema.update(10.0) == pytest.approx(0.9 * 1.1 + 0.1 * 10.0)  # 1.99


def test_jump_ratio_uses_the_ema_before_the_step() -> None:
    assert jump_ratio(4.0, None) is None
    assert jump_ratio(4.0, 0.0) is None
    assert jump_ratio(4.0, 1.25) == pytest.approx(3.2)
    # Had the EMA included the spike (0.9 * 1 + 0.1 * 4 = 1.3), 4 / 1.3 = 3.08 would barely pass 3.
    ema = Ema(0.9)
    for x in (1.0, 1.0, 1.0):
        ema.update(x)
    assert jump_ratio(3.5, ema.value) == pytest.approx(3.5)


def test_window_variance_and_fluctuation() -> None:
    w = Window(4)
    w.add(1.0)
    assert w.variance() is None and w.fluctuation() is None
    for x in (2.0, 3.0, 4.0, 5.0):  # the 1.0 falls out
        w.add(x)
    assert list(w.values) == [2.0, 3.0, 4.0, 5.0] and w.full
    assert w.variance() == pytest.approx(1.25)  # mean 3.5; (2.25 + 0.25 + 0.25 + 2.25) / 4
    assert w.fluctuation() == pytest.approx((5 - 2) / 3.5)


def test_pearson_known_answers() -> None:
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # sxy 4, sxx = syy = 5
    assert pearson([1, 1, 1], [1, 2, 3]) is None


def test_checkpoint_policy_decides_every_fourth_step_on_a_full_window() -> None:
    policy = CheckpointPolicy.from_slos(load_slos())
    assert (policy.variance_threshold, policy.window_steps, policy.every) == (0.025, 8, 4)
    calm = [1.0, 1.1] * 4  # variance 0.0025
    decisions = [policy.observe(step, n) for step, n in enumerate(calm, start=1)]
    assert [d.step for d in decisions if d] == [4, 8]
    assert decisions[3] is not None and not decisions[3].save and decisions[3].variance is None  # window not full
    assert decisions[7] is not None and not decisions[7].save
    assert decisions[7].variance == pytest.approx(0.0025)
    # Steps 9..12 add 1.0, 1.5, 1.0, 1.5: window [1, 1.1, 1, 1.1, 1, 1.5, 1, 1.5], mean 1.15, var 0.0425.
    later = [policy.observe(step, n) for step, n in zip(range(9, 13), (1.0, 1.5, 1.0, 1.5), strict=True)]
    assert later[:3] == [None, None, None]
    assert later[3] is not None and later[3].save and later[3].variance == pytest.approx(0.0425)
