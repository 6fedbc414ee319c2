"""The time outside vLLM the replay adds: ``fixed + per_user × users`` where the stages show a growth, else
their mean, with the reason."""

from __future__ import annotations

import pytest

from exporters.serving.calibrate.client_overhead import fit_client_overhead, stage_gap
from exporters.serving.calibrate.observations import Stage


def stage(name: str, users: int, gap_s: float, server_e2e_s: float = 0.1) -> Stage:
    """A stage whose client mean E2E exceeds vLLM's (``server_e2e_s`` over 10 requests) by ``gap_s``."""
    counters = {"vllm:e2e_request_latency_seconds_sum": server_e2e_s * 10, "vllm:e2e_request_latency_seconds_count": 10}
    return Stage(name, users, 100.0, 10.0, 10.0, 50, {"mean_e2el_ms": (server_e2e_s + gap_s) * 1000}, counters)


def test_a_growth_with_users_is_fitted() -> None:
    stages = [stage(f"c{u}", u, 0.004 + 0.015 * u) for u in (1, 2, 4, 8)]
    got = fit_client_overhead(stages)
    assert got is not None
    assert (got.fixed_s, got.per_user_s) == (pytest.approx(0.004), pytest.approx(0.015))
    assert got.at(4) == pytest.approx(0.064)
    assert got.note.startswith("4 ms + 15 ms per user (± ") and got.note.endswith("), fitted over the stages")
    assert got.gaps["c8"] == (8, pytest.approx(0.124))


def test_a_constant_where_the_data_show_no_growth() -> None:
    flat = [stage("a", 1, 0.03), stage("b", 2, 0.01), stage("c", 4, 0.02)]
    got = fit_client_overhead(flat)
    assert got is not None and got.per_user_s == 0.0 and got.fixed_s == pytest.approx(0.02)
    assert got.note == "constant, the mean over the fitted stages: no growth with users in the data (-2.14 ms per user)"
    two = fit_client_overhead(flat[:2])
    assert two is not None
    assert two.note.endswith("2 stages, 2 numbers of users (a growth needs 3 and 2)")
    same = fit_client_overhead([stage("a", 2, 0.01), stage("b", 2, 0.02), stage("c", 2, 0.03)])
    assert same is not None and same.note.endswith("3 stages, 1 numbers of users (a growth needs 3 and 2)")
    noisy = fit_client_overhead([stage("a", 1, 0.01), stage("b", 2, 0.05), stage("c", 3, 0.0), stage("d", 4, 0.04)])
    assert noisy is not None and "its growth with users not determined (" in noisy.note
    asked = fit_client_overhead([stage(f"c{u}", u, 0.015 * u) for u in (1, 2, 4)], constant=True)
    assert asked is not None and asked.note.endswith(": --constant-client-overhead")
    assert asked.at(100) == pytest.approx(0.035)


def test_never_below_zero_and_none_without_data() -> None:
    got = fit_client_overhead([stage(f"c{u}", u, -0.01 + 0.01 * u) for u in (1, 2, 3)])
    assert got is not None and got.at(0) == 0.0 and got.at(1) == pytest.approx(0.0, abs=1e-12)
    bare = Stage("x", 1, 100.0, 10.0, 10.0, 50)
    assert stage_gap(bare) is None and fit_client_overhead([bare]) is None
