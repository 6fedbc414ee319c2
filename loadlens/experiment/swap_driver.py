"""Scheduled adapter swaps during a run (guide 2.4): a thread that loads an adapter through the target's
``POST /v1/load_lora_adapter`` every ``every`` seconds and unloads it ``every`` seconds later, taking the
trial's ``swaps.adapters`` in turn, while the load generator's requests keep going. Through the proxy the
calls are forwarded, so the proxy sees each as a swap window; on the sim each load blocks the step loop for
its read (docs/sim-engine.md §4).

The driver runs from the start of the run to its end (warmup included); only the calls inside the measured
stages count (``driver_loads``). An adapter it loaded is unloaded when the run ends. A refused call is
recorded (``driver_errors``, the first five) and the schedule goes on.

Usage::

    with SwapDriver(url, trial.swaps, book, token) as driver:
        ...  # the run
    driver.loads_inside(windows)
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from loadlens.experiment.adapters import AdapterBook, AdapterLoadError
from loadlens.experiment.models import PlannedSwaps


class SwapDriver:
    def __init__(self, url: str, swaps: PlannedSwaps | None, book: AdapterBook | None, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.swaps = swaps
        self.book = book
        self.token = token
        self.loads: list[float] = []
        """Unix time of each successful load call's answer."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="swap-driver", daemon=True)

    def __enter__(self) -> SwapDriver:
        if self.swaps is not None and self.book is not None:
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=130)

    def _call(self, op: str, name: str) -> bool:
        assert self.book is not None
        try:
            if op == "load":
                self.book.load(self.url, (name,), self.token)
            else:
                self.book.unload(self.url, (name,), self.token)
        except AdapterLoadError as err:
            if len(self.errors) < 5:
                self.errors.append(f"{op} {name}: {err}")
            return False
        return True

    def _loop(self) -> None:
        assert self.swaps is not None
        turn = 0
        while not self._stop.wait(self.swaps.every):
            name = self.swaps.adapters[turn % len(self.swaps.adapters)]
            turn += 1
            if self._call("load", name):
                self.loads.append(time.time())
            else:
                continue
            stopped = self._stop.wait(self.swaps.every)
            self._call("unload", name)
            if stopped:
                return

    def loads_inside(self, windows: list[tuple[float, float]]) -> int | None:
        """Loads answered inside ``windows``; ``None`` for a trial without a schedule."""
        if self.swaps is None:
            return None
        return sum(1 for t in self.loads if any(lo <= t <= hi for lo, hi in windows))
