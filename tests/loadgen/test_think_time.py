"""A traffic entry's ``think_time_s``: a closed-loop user's wait after each answer before its next request
(docs/loadgen.md, *Traffic*), drawn per request from (seed, process, request number); open loop ignores it."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from loadgen.execute import Recorder
from loadgen.metrics import bucket_bounds
from loadgen.profile import Profile, ProfileError, parse_profile
from loadgen.profile_fields import SecondsDist
from loadgen.prompts import PromptFactory
from loadgen.record import RequestRecord
from loadgen.store import Store
from loadgen.workload import Workload, WorkloadStats
from loadlens.contracts.slo import load_slos
from tests.loadgen.one_executor import FakeUser, executor

BOUNDS = bucket_bounds(load_slos(None))
ENTRY = {"name": "q", "prompt": {"tokens": 6}, "output_tokens": 4}


def profile(**entry: Any) -> Profile:
    return parse_profile(
        {
            "version": 1,
            "name": "t",
            "traffic": [{**ENTRY, **entry}],
            "stages": [{"name": "s", "users": 1, "duration": 1}],
        }
    )


class Owner:
    """A closed-loop user (only its identity matters to the workload)."""


def finish_many(p: Profile, n: int, owner: object | None, seed: int = 3) -> list[float]:
    w, stats = Workload(p, PromptFactory(p, seed=seed), seed=seed, process_index=0), WorkloadStats(BOUNDS["ttft"])
    out = []
    for _ in range(n):
        turn = w.next(owner=owner, now=0.0, default_model="m", stage="s", stats=stats)
        out.append(w.finish(turn, RequestRecord(ttft=0.01, e2e=0.02), now=0.0, stage="s", stats=stats))
    return out


def test_the_entry_records_its_think_time_as_a_clamped_normal() -> None:
    assert profile().traffic[0].think_time_s is None
    assert profile(think_time_s=0.5).traffic[0].think_time_s == SecondsDist(0.5)
    assert profile(think_time_s={"mean": 0.1, "stdev": 0.1}).traffic[0].think_time_s == SecondsDist(
        0.1, 0.1, 0.0, 3600.0
    )


def test_a_closed_loop_user_draws_one_per_request_and_repeats_with_the_seed() -> None:
    p = profile(think_time_s={"mean": 0.1, "stdev": 0.1})
    draws = finish_many(p, 2000, Owner())
    assert draws == finish_many(p, 2000, Owner())  # seeded by (seed, process, request number)
    assert draws != finish_many(p, 2000, Owner(), seed=4)
    assert min(draws) == 0.0  # clamped at min 0: about 16 % of normal(0.1, 0.1) falls below it
    assert 0.12 < sum(d == 0.0 for d in draws) / len(draws) < 0.20
    # The clamped normal's mean is 0.1 * Phi(1) + 0.1 * phi(1) = 0.1083; 2000 draws: standard error 0.0019.
    assert statistics.fmean(draws) == pytest.approx(0.1083, abs=0.008)
    assert finish_many(profile(think_time_s=0.25), 3, Owner()) == [0.25, 0.25, 0.25]


def test_no_think_time_without_the_field_or_in_an_open_loop() -> None:
    assert finish_many(profile(), 5, Owner()) == [0.0] * 5
    assert finish_many(profile(think_time_s=0.25), 5, None) == [0.0] * 5  # arrivals keep the stage's rate


def test_the_executor_makes_the_user_wait_it() -> None:
    def send(*args: Any) -> tuple[RequestRecord, bool, float | None]:
        return RequestRecord(ttft=0.01, e2e=0.02, output_tokens=4, prompt_tokens=6), True, None

    user = FakeUser()
    assert executor(profile(think_time_s=0.75), Recorder(Store(BOUNDS), "s"), send, entry="q").run(user)
    assert user.backoff == 0.75


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"think_time_s": -1}, "traffic[0].think_time_s.mean: must be"),
        ({"think_time_s": {"mean": 5, "max": 2}}, "traffic[0].think_time_s.mean: 5 is outside [min 0, max 2]"),
        ({"think_time_s": {"mean": 1, "pause": 1}}, "traffic[0].think_time_s.pause: unknown field"),
        (
            {"think_time_s": 1, "conversation": {"turns": 2}},
            "traffic[0].think_time_s: a conversation has its own (conversation.think_time_s, between its turns)",
        ),
    ],
)
def test_bad_think_times_are_refused_with_their_path(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        profile(**entry)
    assert str(err.value).startswith(message), str(err.value)
