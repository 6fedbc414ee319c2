"""NVML lifecycle shared by the collectors and the sampler: init, enumeration, lost devices, re-init.

Collectors keep no state between scrapes (style R1); what must outlive a scrape - whether NVML is up,
which GPUs exist, which are lost, error counters - lives here. Lifecycle errors (driver not loaded,
library missing, version mismatch, uninitialised) mark NVML down; a lost GPU is marked down alone. Both
schedule a re-initialisation on a later cycle with exponential backoff (1 s doubling to 30 s), and zero
visible GPUs counts as down, never as an idle healthy machine.

NVML calls run in a shared section (:meth:`Session.calls`, held by every collector run and sampler poll);
a re-initialisation (nvmlShutdown, nvmlInit, new handles) needs the section to itself and only *tries* to
take it: with a call in flight it waits for a later cycle instead of blocking. So a call that hangs holds up
neither the other collectors nor the sampler's polls, and a re-initialisation never swaps handles under a
call in flight. :attr:`Session.lock` guards the session's state and is only held briefly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from exporters.gpu.nvml import ErrorKind, Nvml, NvmlError

log = logging.getLogger(__name__)

DEVICE_LABELS: tuple[str, str, str] = ("gpu", "uuid", "model")


class CallLock:
    """Shared for NVML calls, exclusive for a re-initialisation, which never waits for it.

    Shared sections nest and may be held by many threads; :meth:`try_exclusive` succeeds only when no thread
    holds a shared section (the caller's own included), and while it is held new shared sections wait.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    def try_exclusive(self) -> bool:
        with self._cond:
            if self._exclusive or self._shared:
                return False
            self._exclusive = True
            return True

    def release_exclusive(self) -> None:
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class Device:
    """One enumerated GPU. ``handle`` is only valid for the session generation that produced it."""

    index: int
    handle: Any
    uuid: str
    model: str
    pci_bus_id: str
    labels: tuple[str, str, str] = field(init=False)  # values for DEVICE_LABELS, built once

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", (str(self.index), self.uuid, self.model))


class Session:
    def __init__(
        self,
        nvml: Nvml,
        *,
        backend: str = "nvml",
        clock: Callable[[], float] = time.monotonic,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
    ) -> None:
        self.nvml = nvml
        self.backend = backend
        self.lock = threading.RLock()
        self._calls = CallLock()
        self._clock = clock
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._backoff = backoff_initial
        self._next_attempt = -float("inf")
        self._open = False  # nvmlInit succeeded and shutdown is owed
        self._up = False
        self._reinit_requested = False
        self._devices: list[Device] = []
        self._lost: set[int] = set()
        self._identity: dict[int, tuple[str, str, str]] = {}
        self.generation = 0
        self.driver_version = ""
        self.cuda_driver_version = ""
        self.init_failures_total = 0
        self.reinits_total = 0
        self.last_init_error = ""
        self.last_init_detail = ""  # the cause behind last_init_error where the backend knows it (sim: URL, status)
        self.errors_total: Counter[tuple[str, str]] = Counter()
        self.last_success: dict[str, float] = {}

    # --- state for health series ---

    @property
    def up(self) -> bool:
        """NVML initialised and at least one GPU visible."""
        return self._up and bool(self._devices)

    def all_devices(self) -> list[tuple[Device, bool]]:
        """Every enumerated GPU with whether it is up (lost ones keep their last known identity)."""
        with self.lock:
            return [(d, d.index not in self._lost) for d in self._devices] if self._up else []

    def record_error(self, collector: str, err: NvmlError) -> None:
        with self.lock:
            self.errors_total[(collector, err.name)] += 1

    def record_success(self, collector: str, wall_time: float) -> None:
        with self.lock:
            self.last_success[collector] = wall_time

    # --- lifecycle ---

    def devices(self) -> list[Device]:
        """The GPUs that are up, initialising NVML first if it is down and the backoff has passed."""
        with self.lock:
            self.ensure()
            if not self._up:
                return []
            return [d for d in self._devices if d.index not in self._lost]

    def calls(self) -> Any:
        """The shared section every NVML call runs in (a context manager)."""
        return self._calls.shared()

    def ensure(self) -> bool:
        with self.lock:
            if self._up and not self._reinit_requested:
                return True
            # Not while a call is in flight (this thread's included): the next cycle tries again.
            if self._clock() >= self._next_attempt and self._calls.try_exclusive():
                try:
                    self._reinit()
                finally:
                    self._calls.release_exclusive()
            return self._up

    def mark_lost(self, device: Device, err: NvmlError) -> None:
        with self.lock:
            if device.index not in self._lost:
                log.error("GPU %d (%s) is lost: %s; retrying with backoff", device.index, device.uuid, err)
                self._lost.add(device.index)
                self._request_reinit()

    def mark_down(self, err: NvmlError) -> None:
        """NVML itself failed mid-run: stop using it and re-initialise on a later cycle."""
        with self.lock:
            if self._up:
                log.error("%s%s; re-initialising with backoff", "" if err.from_backend else "NVML is down: ", err)
            self._up = False
            self.last_init_error = err.name
            self.last_init_detail = err.detail or ""
            self._request_reinit()

    def _request_reinit(self) -> None:
        if not self._reinit_requested:
            self._reinit_requested = True
            self._next_attempt = self._clock() + self._backoff

    def _schedule_retry(self) -> None:
        self._reinit_requested = True
        self._next_attempt = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, self._backoff_max)

    def _reinit(self) -> None:
        if self._open:
            try:
                self.nvml.shutdown()
            except NvmlError as err:
                log.debug("nvmlShutdown before re-init: %s", err)
            self._open = False
            self.reinits_total += 1
        self._up = False
        self.generation += 1
        try:
            self.nvml.init()
            self._open = True
            self.driver_version = self._optional(self.nvml.driver_version)
            self.cuda_driver_version = self._optional(self.nvml.cuda_driver_version)
            devices, lost = self._enumerate()
        except NvmlError as err:
            self.init_failures_total += 1
            self.last_init_error = err.name
            self.last_init_detail = err.detail or ""
            # A backend's own failure (the sim's document) carries its own wording: never "NVML init failed".
            log.error("%s%s; next try in %.0f s", "" if err.from_backend else "NVML init failed: ", err, self._backoff)
            self._schedule_retry()
            return
        self._devices, self._lost, self._up = devices, lost, True
        if not devices:
            self.last_init_error = "NoDevices"
            self.last_init_detail = ""
            log.error("NVML sees no GPUs; next try in %.0f s", self._backoff)
            self._schedule_retry()
        elif lost:
            self._schedule_retry()
        else:
            self._reinit_requested = False
            self._backoff = self._backoff_initial
            self.last_init_error = ""
            self.last_init_detail = ""
            log.info("NVML up (%s backend): %d GPU(s), driver %s", self.backend, len(devices), self.driver_version)

    @staticmethod
    def _optional(fn: Callable[[], str]) -> str:
        try:
            return fn()
        except NvmlError as err:
            if err.kind is ErrorKind.LIFECYCLE:
                raise
            return ""

    def _enumerate(self) -> tuple[list[Device], set[int]]:
        devices: list[Device] = []
        lost: set[int] = set()
        for i in range(self.nvml.device_count()):
            try:
                handle = self.nvml.handle(i)
                uuid, model = self.nvml.uuid(handle), self.nvml.name(handle)
                try:
                    pci = self.nvml.pci_bus_id(handle)
                except NvmlError as err:
                    if err.kind is not ErrorKind.UNSUPPORTED:
                        raise
                    pci = ""
            except NvmlError as err:
                if err.kind is ErrorKind.LIFECYCLE:
                    raise
                log.error("GPU %d is down: %s", i, err)
                uuid, model, pci = self._identity.get(i, ("", "", ""))
                devices.append(Device(i, None, uuid, model, pci))
                lost.add(i)
                continue
            self._identity[i] = (uuid, model, pci)
            devices.append(Device(i, handle, uuid, model, pci))
        return devices, lost

    def close(self) -> None:
        with self.lock:
            if self._open:
                try:
                    self.nvml.shutdown()
                except NvmlError as err:
                    log.debug("nvmlShutdown: %s", err)
            self._open = False
            self._up = False
