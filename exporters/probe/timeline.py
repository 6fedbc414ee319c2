"""The busy timeline: when this process's device was running its work, at sub-millisecond resolution (issue 24
item 3; docs/probe-documents.md, "Busy timeline").

One class, two clocks:

- with CUDA, :meth:`BusyTimeline.begin` / :meth:`BusyTimeline.end` record a timing ``torch.cuda.Event`` on the
  current stream: the interval is when the *device* ran the work between them, however far ahead of it the
  host is. Nothing on the hot path waits for the device: finished pairs are resolved later with
  ``Event.query()`` (never blocks) and ``elapsed_time`` against a reference event, at the next ``end`` and in
  :meth:`BusyTimeline.intervals` (the probe's thread). The one wait is at construction, off the hot path:
  the reference event's ``synchronize()``, which pins the device clock to the host's;
- without CUDA (a CPU build, vLLM's CPU worker) they read ``time.perf_counter``: a CPU forward runs on the
  calling thread, so the host span is when the work ran.

Times come out as Unix seconds. The hot path only records and appends; the figures
(``loadlens.contracts.busy_math``) are computed by whoever reads the timeline.

:func:`hook_module` puts ``begin``/``end`` around every forward of a ``torch.nn.Module``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from loadlens.contracts.busy_math import Interval

DEFAULT_CAPACITY = 65_536
"""Resolved intervals kept (the oldest are dropped first): 65 536 steps of 1 ms cover a minute."""
MAX_PENDING = 4_096
"""CUDA event pairs awaiting the device; beyond it the oldest pair is dropped (counted), never waited for."""

CLOCK_CUDA = "cuda_event"
CLOCK_HOST = "perf_counter"


class BusyTimeline:
    """Busy intervals of one device (``torch.cuda.current_device()`` at construction) or of the CPU."""

    def __init__(
        self,
        torch: Any,
        *,
        source: str,
        capacity: int = DEFAULT_CAPACITY,
        timer: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self._timer = timer
        cuda = getattr(torch, "cuda", None)
        self._cuda: Any = cuda if cuda is not None and cuda.is_available() else None
        self.clock = CLOCK_CUDA if self._cuda is not None else CLOCK_HOST
        self.cuda_index: int | None = None
        self._done: collections.deque[Interval] = collections.deque(maxlen=capacity)
        self._pending: collections.deque[tuple[Any, Any]] = collections.deque()
        self._lock = threading.Lock()
        self.recorded_total = 0
        self.dropped_total = 0
        self.busy_seconds_total = 0.0
        # Host perf_counter -> Unix: one offset, read once.
        self._offset = wall() - timer()
        self._ref: Any = None
        self._ref_unix = 0.0
        if self._cuda is not None:
            self.cuda_index = int(self._cuda.current_device())
            self._ref = self._cuda.Event(enable_timing=True)
            self._ref.record(self._cuda.current_stream())
            self._ref.synchronize()  # set-up only: the device time of the reference, read on the host
            self._ref_unix = self._offset + timer()

    # --- hot path ---

    def begin(self) -> Any:
        """Mark the start of work; the token goes to :meth:`end`."""
        if self._cuda is None:
            return self._timer()
        event = self._cuda.Event(enable_timing=True)
        event.record(self._cuda.current_stream())
        return event

    def end(self, token: Any) -> None:
        """Mark the end of the work :meth:`begin` started."""
        if self._cuda is None:
            now = self._timer()
            self._add(self._offset + token, self._offset + now)
            return
        event = self._cuda.Event(enable_timing=True)
        event.record(self._cuda.current_stream())
        self._pending.append((token, event))
        if len(self._pending) > MAX_PENDING:
            self._pending.popleft()
            self.dropped_total += 1
        self.resolve(blocking=False)

    # --- off the hot path ---

    def _add(self, start: float, end: float) -> None:
        self._done.append((start, end))
        self.recorded_total += 1
        self.busy_seconds_total += max(0.0, end - start)

    def resolve(self, *, blocking: bool = True) -> None:
        """Turn the event pairs the device has finished into intervals, oldest first; stops at the first pair
        still running (one stream runs them in order). ``query()`` never waits."""
        if self._cuda is None or not self._pending:
            return
        if not self._lock.acquire(blocking=blocking):
            return  # the reader is resolving: the hot path never waits for it
        try:
            while self._pending:
                start, end = self._pending[0]
                if not end.query():
                    break
                self._pending.popleft()
                base = self._ref_unix
                self._add(base + self._ref.elapsed_time(start) / 1e3, base + self._ref.elapsed_time(end) / 1e3)
        finally:
            self._lock.release()

    def intervals(self, since: float = float("-inf")) -> list[Interval]:
        """The resolved intervals ending after ``since`` (Unix seconds), oldest first."""
        self.resolve()
        return [iv for iv in list(self._done) if iv[1] > since]

    @property
    def pending(self) -> int:
        return len(self._pending)


class ModuleHook:
    """``begin`` before and ``end`` after every outermost forward of a module (forward pre/post hooks)."""

    def __init__(self, module: Any, timeline: BusyTimeline) -> None:
        self.timeline = timeline
        self._local = threading.local()
        self._handles = [
            module.register_forward_pre_hook(self._pre),
            module.register_forward_hook(self._post, always_call=True),  # after a raising forward too
        ]

    def _pre(self, module: Any, args: Any) -> None:
        stack: list[Any] = getattr(self._local, "stack", None) or []
        self._local.stack = stack
        stack.append(self.timeline.begin() if not stack else None)  # a re-entrant call is inside the outer one

    def _post(self, module: Any, args: Any, output: Any) -> None:
        stack: list[Any] = getattr(self._local, "stack", [])
        if not stack:
            return
        token = stack.pop()
        if not stack:
            self.timeline.end(token)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def hook_module(module: Any, torch: Any, *, timeline: BusyTimeline | None = None) -> ModuleHook:
    """Time every forward of ``module`` (any ``torch.nn.Module``) into ``timeline`` (a new one, source
    ``module_forward``, by default): CUDA events on a GPU, ``perf_counter`` on the CPU."""
    return ModuleHook(module, timeline or BusyTimeline(torch, source="module_forward"))
