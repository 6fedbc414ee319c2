"""An executor of one process with a fake sender, and a fake closed-loop user, for tests that drive
:class:`loadgen.execute.RequestExecutor` one request at a time (conversations, think times)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from loadgen.dispatch import Slot, StageDispatch
from loadgen.execute import Recorder, RequestExecutor
from loadgen.profile import Profile
from loadgen.record import RequestRecord
from loadlens.contracts.slo import load_slos

Send = Callable[..., tuple[RequestRecord, bool, float | None]]


class FakeUser:
    """A closed-loop user: its think time and back-off end up in ``backoff``."""

    def __init__(self) -> None:
        self.slot: Slot | None = None
        self.backoff = 0.0
        self.http = object()

    def reconnect(self) -> None:
        pass


def executor(p: Profile, recorder: Recorder, send: Send, *, entry: str) -> RequestExecutor:
    """One process's executor of ``p``, ``entry`` in the default SLO class, requests handed to ``send``."""
    fire: Callable[..., None] = lambda **kw: None  # noqa: E731
    return RequestExecutor(
        profile=p, seed=1, classes={entry: load_slos(None).class_for_priority(0)}, recorder=recorder,
        dispatch=StageDispatch(p.stages, 1, lock=threading.Lock(), new_event=threading.Event),
        target=None, target_url="http://x", auth={}, user_agent="t", send=send, new_traceparent=lambda: "tp",
        fire=fire, resolve_model=lambda: "m", process_index=lambda: 0,
    )  # fmt: skip
