"""Request execution with a scripted transport: admission, headers, recording, back-off, Locust's events."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from loadgen.dispatch import Slot, StageDispatch
from loadgen.execute import RETRY_AFTER_CAP_S, Recorder, RequestExecutor, RequestFailed
from loadgen.metrics import bucket_bounds
from loadgen.profile import Profile, parse_profile
from loadgen.prompts import PreparedRequest
from loadgen.record import RequestRecord
from loadgen.store import Store
from loadlens.contracts.slo import load_slos

PROFILE = parse_profile(
    {
        "version": 1,
        "name": "t",
        "request_timeout_s": 7,
        "traffic": [{"name": "chat", "prompt": {"tokens": 8}, "output_tokens": 4}],
        "stages": [
            {"name": "warm", "warmup": True, "users": 1, "until_requests": 2},
            {"name": "closed", "users": 2, "duration": 5},
            {"name": "open", "rate": 10, "duration": 5},
        ],
    }
)
OK = RequestRecord(ttft=0.05, e2e=0.08, output_tokens=4, prompt_tokens=8)


class FakeUser:
    def __init__(self) -> None:
        self.slot: Slot | None = None
        self.backoff = 0.0
        self.http = object()
        self.reconnects = 0

    def reconnect(self) -> None:
        self.reconnects += 1


class Harness:
    def __init__(self, outcome: Callable[[], tuple[RequestRecord, bool, float | None]], model: str = "m") -> None:
        slos = load_slos(None)
        self.profile: Profile = PROFILE
        self.recorder = Recorder(Store(bucket_bounds(slos)), "warm")
        self.dispatch = StageDispatch(PROFILE.stages, 1, lock=threading.Lock(), new_event=threading.Event)
        self.sent: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.resolved = 0
        self.outcome = outcome
        self.in_flight_seen = -1

        def send(
            http: Any,
            target: Any,
            request: PreparedRequest,
            headers: dict[str, str],
            intended: float,
            on_tokens: Callable[[int], None],
            timeout: float,
        ) -> tuple[RequestRecord, bool, float | None]:
            self.sent.append({"request": request, "headers": headers, "intended": intended, "timeout": timeout})
            self.in_flight_seen = self.recorder.in_flight
            on_tokens(3)
            return self.outcome()

        def resolve() -> str:
            self.resolved += 1
            return "probed"

        self.executor = RequestExecutor(
            profile=PROFILE,
            seed=1,
            classes={"chat": slos.class_for_priority(0)},
            recorder=self.recorder,
            dispatch=self.dispatch,
            target="T",
            target_url="http://t:1",
            auth={"Authorization": "Bearer k"},
            user_agent="ua/1",
            send=send,
            new_traceparent=lambda: "00-tp",
            fire=lambda **kw: self.events.append(kw),
            resolve_model=resolve,
            process_index=lambda: 0,
            model=model,
        )


def test_a_closed_loop_request_is_recorded_under_its_stage_class_and_model() -> None:
    h = Harness(lambda: (RequestRecord(**vars_of(OK)), True, None))
    user = FakeUser()
    assert h.executor.run(user) is True
    (sent,) = h.sent
    assert sent["headers"] == {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "User-Agent": "ua/1",
        "traceparent": "00-tp",
        "Authorization": "Bearer k",
    }
    assert sent["timeout"] == 7.0 and sent["request"].model == "m"
    assert h.in_flight_seen == 1 and h.recorder.in_flight == 0
    store = h.recorder.store
    assert list(store.series) == [("warm", "interactive", "m")]
    assert store.finished("warm") == 1 and h.recorder.finished_by_stage == {"warm": 1}
    assert store.window_tokens == {"warm": 3}
    assert store.series[("warm", "interactive", "m")].dists["dispatch_lag"].count == 0  # closed loop: no lag
    assert user.reconnects == 0 and user.backoff == 0.0
    assert [e["request_type"] for e in h.events] == ["E2E", "TTFT", "TPOT"]
    e2e, ttft, tpot = h.events
    assert e2e["response_time"] == pytest.approx(80.0) and e2e["response_length"] == 4 and e2e["exception"] is None
    assert e2e["context"] == {"stage": "warm", "priority_class": "interactive"} and e2e["url"] == "http://t:1"
    assert ttft["response_time"] == pytest.approx(50.0)
    assert tpot["response_time"] == pytest.approx(10.0)


def vars_of(record: RequestRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in ("ttft", "e2e", "output_tokens", "prompt_tokens")}


def test_the_model_is_probed_once_when_none_was_given() -> None:
    h = Harness(lambda: (RequestRecord(**vars_of(OK)), True, None), model="")
    h.executor.run(FakeUser())
    h.executor.run(FakeUser())
    assert h.resolved == 1 and [s["request"].model for s in h.sent] == ["probed", "probed"]


def test_a_closed_loop_429_backs_off_for_retry_after_capped() -> None:
    limited = RequestRecord(outcome="rate_limited", reason="HTTP 429 RateLimitError", status=429, e2e=0.01)
    for retry_after, backoff in [(0.25, 0.25), (30.0, RETRY_AFTER_CAP_S), (None, RETRY_AFTER_CAP_S)]:
        h = Harness(lambda ra=retry_after: (limited, False, ra))  # type: ignore[misc]
        user = FakeUser()
        h.executor.run(user)
        assert (user.backoff, user.reconnects) == (backoff, 1)
        (e2e,) = h.events  # a failure: no TTFT or TPOT
        assert isinstance(e2e["exception"], RequestFailed) and str(e2e["exception"]) == "HTTP 429 RateLimitError"


def test_a_request_killed_mid_stream_is_cancelled_and_not_counted() -> None:
    def killed() -> tuple[RequestRecord, bool, float | None]:
        raise KeyboardInterrupt  # stands in for GreenletExit

    h = Harness(killed)
    user = FakeUser()
    with pytest.raises(KeyboardInterrupt):
        h.executor.run(user)
    series = h.recorder.store.series[("warm", "interactive", "m")]
    assert series.outcomes["cancelled"] == 1 and h.recorder.store.finished("warm") == 0
    assert h.recorder.finished_by_stage == {} and h.recorder.in_flight == 0
    assert user.reconnects == 1 and h.events == []


def test_open_loop_needs_a_slot_and_measures_from_it() -> None:
    h = Harness(lambda: (RequestRecord(**vars_of(OK)), True, None))
    h.dispatch.apply(2, start_wall=0.0)
    user = FakeUser()
    assert h.executor.run(user) is False and h.sent == []
    user.slot = Slot(h.dispatch.started_perf, "open", h.dispatch.gen)
    assert h.executor.run(user) is True
    assert user.slot is None and h.sent[0]["intended"] == h.dispatch.started_perf
    lag = h.recorder.store.series[("open", "interactive", "m")].dists["dispatch_lag"]
    assert lag.count == 1
    limited = RequestRecord(outcome="rate_limited", status=429)
    h.outcome = lambda: (limited, True, 0.5)
    user.slot = Slot(h.dispatch.started_perf, "open", h.dispatch.gen)
    h.executor.run(user)
    assert user.backoff == 0.0  # open loop keeps its schedule: no back-off


def test_a_warmup_request_finishing_after_the_warmup_stays_out_of_locusts_tables() -> None:
    h = Harness(lambda: (RequestRecord(**vars_of(OK)), True, None))
    h.executor.fire_locust_events("chat", "warm", "interactive", OK)
    assert len(h.events) == 3  # still in the warmup: counted
    h.dispatch.apply(1, start_wall=0.0)
    h.events.clear()
    h.executor.fire_locust_events("chat", "warm", "interactive", OK)
    assert h.events == []
    h.executor.fire_locust_events("chat", "closed", "interactive", OK)
    assert len(h.events) == 3
