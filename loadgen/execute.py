"""One user's request, start to end: admit it, build it, stream it, record it, tell Locust.

The transport (``client.stream``), the trace id and Locust's event hook are passed in, so this runs without
gevent in tests. Measurements go to a :class:`Recorder`, shared with the process's role.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from loadgen.dispatch import Slot, StageDispatch
from loadgen.profile import Profile
from loadgen.prompts import PreparedRequest, PromptFactory
from loadgen.record import SUCCESS, RequestRecord
from loadgen.store import Store
from loadgen.workload import Turn, Workload
from loadlens.contracts.slo import PriorityClass

RETRY_AFTER_CAP_S = 1.0
"""A closed-loop user that got 429 waits Retry-After, at most this long, before its next request."""

Send = Callable[
    [Any, Any, PreparedRequest, dict[str, str], float, Callable[[int], None], float],
    tuple[RequestRecord, bool, float | None],
]
"""``client.stream(http, target, request, headers, intended_start, on_tokens, timeout)``."""


class RequestFailed(Exception):
    """What Locust's failure table shows for a failed request (the reason is bounded: status and error type)."""


class User(Protocol):
    """What the executor needs of a Locust user (``LLMUser``)."""

    slot: Slot | None
    backoff: float
    http: Any

    def reconnect(self) -> None: ...


class Recorder:
    """Where this process's measurements go.

    ``store`` is replaced at every new run and emptied at every worker report, so it is always read through
    here; ``window`` is where arriving tokens (and CPU time) are charged: the current stage, or the drain.
    """

    def __init__(self, store: Store, window: str) -> None:
        self.store = store
        self.window = window
        self.in_flight = 0
        self.finished_by_stage: collections.Counter[str] = collections.Counter()
        """Requests finished (not cancelled) per stage on this process, cumulative (workers report it)."""

    def on_tokens(self, n: int) -> None:
        store = self.store  # re-read each time: a worker swaps its store at every report
        store.window_tokens[self.window] += n
        store.tokens_by_second[int(time.time())] += n


class RequestExecutor:
    def __init__(
        self,
        *,
        profile: Profile,
        seed: int,
        classes: Mapping[str, PriorityClass],
        recorder: Recorder,
        dispatch: StageDispatch,
        target: Any,
        target_url: str,
        auth: Mapping[str, str],
        user_agent: str,
        send: Send,
        new_traceparent: Callable[[], str],
        fire: Callable[..., Any],
        resolve_model: Callable[[], str],
        process_index: Callable[[], int],
        model: str = "",
    ) -> None:
        self.profile = profile
        self.seed = seed
        self.classes = classes
        self.recorder = recorder
        self.dispatch = dispatch
        self.target = target
        self.target_url = target_url
        self.auth = dict(auth)
        self.user_agent = user_agent
        self.send = send
        self.new_traceparent = new_traceparent
        self.fire = fire
        self.resolve_model = resolve_model
        self.process_index = process_index
        self.model = model
        self.prompts: PromptFactory | None = None
        self.workload: Workload | None = None

    def run(self, user: User) -> bool:
        """Send the user's next request. False: not now (no or a void open-loop slot); claim a slot first."""
        slot = user.slot
        user.slot = None
        if not self.dispatch.admits(slot):
            return False
        now = time.perf_counter()
        if slot is not None:
            intended, stage_name, lag = slot.at, slot.stage, max(0.0, now - slot.at)
        else:
            intended, stage_name, lag = now, self.dispatch.stage.name, None
        if not self.model:
            self.model = self.resolve_model()
        if self.prompts is None or self.workload is None:  # the worker index is known once the worker has joined
            index = max(0, self.process_index())
            self.prompts = PromptFactory(self.profile, seed=self.seed, process_index=index)
            self.workload = Workload(self.profile, self.prompts, seed=self.seed, process_index=index)
        workload = self.workload
        if slot is not None and slot.row is not None:
            # A trace row decides the request (no conversation to continue); its shared tokens are the blocks
            # of hash ids an earlier row of this process began with.
            request = self.prompts.next(self.model, row=slot.row)
            turn = Turn(request, None, None, self.prompts.trace_text.shared(request.model, slot.row))
        else:
            # Closed loop: the user continues its own conversation; open loop: an arrival takes a ready one.
            turn = workload.next(
                owner=user if slot is None else None, now=now, default_model=self.model, stage=stage_name,
                stats=self.recorder.store.workload,
            )  # fmt: skip
        request = turn.request
        cls = self.classes[request.traffic.name]
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": self.user_agent,
            "traceparent": self.new_traceparent(),
            **self.auth,
        }
        recorder = self.recorder
        recorder.in_flight += 1
        record: RequestRecord | None = None
        reusable = False
        retry_after = None
        try:
            record, reusable, retry_after = self.send(
                user.http, self.target, request, headers, intended, recorder.on_tokens, self.profile.request_timeout_s
            )
        finally:
            recorder.in_flight -= 1
            if record is None:  # killed mid-request (Locust stopped the user): the server sees a disconnect
                record = RequestRecord(outcome="cancelled", reason="stopped by the load generator")
            record.dispatch_lag = lag
            recorder.store.record(record, (stage_name, cls.name, request.model), cls)
            think = workload.finish(
                turn, record, now=time.perf_counter(), stage=stage_name, stats=recorder.store.workload
            )
            if record.outcome != "cancelled":
                recorder.finished_by_stage[stage_name] += 1
            if not reusable:
                user.reconnect()
        if record.outcome == "rate_limited" and slot is None:
            user.backoff = min(RETRY_AFTER_CAP_S, retry_after or RETRY_AFTER_CAP_S)
        if think > 0 and slot is None:
            user.backoff = max(user.backoff, think)  # the think time (a conversation's or the entry's)
        self.fire_locust_events(request.traffic.name, stage_name, cls.name, record)
        return True

    def fire_locust_events(self, name: str, stage_name: str, cls: str, record: RequestRecord) -> None:
        """Locust's tables: E2E for every finished request, TTFT and TPOT for successful ones."""
        if record.outcome == "cancelled":
            return
        current = self.dispatch.stage
        if (
            stage_name != current.name
            and not current.warmup
            and any(s.name == stage_name and s.warmup for s in self.dispatch.stages)
        ):
            return  # a warmup request finishing after the warmup: Locust's tables were reset without it
        fire = self.fire
        ctx = {"stage": stage_name, "priority_class": cls}
        exc = None if record.ok else RequestFailed(record.reason or record.outcome)
        e2e_ms = (record.e2e or 0.0) * 1e3
        fire(
            request_type="E2E",
            name=name,
            response_time=e2e_ms,
            response_length=record.output_tokens,
            exception=exc,
            context=ctx,
            response=None,
            start_time=time.time() - (record.e2e or 0.0),
            url=self.target_url,
        )
        if record.outcome != SUCCESS:
            return
        if record.ttft is not None:
            fire(
                request_type="TTFT",
                name=name,
                response_time=record.ttft * 1e3,
                response_length=0,
                exception=None,
                context=ctx,
            )
        tpot = record.tpot
        if tpot is not None:
            fire(
                request_type="TPOT", name=name, response_time=tpot * 1e3, response_length=0, exception=None, context=ctx
            )
