"""Fault-injection specs for the sim backend (``--sim-faults``).

A spec is a comma-separated list; times are seconds since the backend was created::

    lost:1@5            GPU 1 raises GpuIsLost from t=5 s on
    lost:1@5-20         ... and recovers at t=20 s
    unsupported:power   every GPU raises NotSupported for that field
    unsupported:ecc:0   only GPU 0
    init-fail:2         the first 2 nvmlInit calls raise DriverNotLoaded, then init succeeds
    process-churn:0     GPU 0's process list alternates between all and half of its processes, and the
                        last listed process exits before its name is looked up (NotFound)
    xid:0:79@3          GPU 0 reports XID 79 ("fallen off the bus") at t=3 s

>>> parse_faults("lost:1@5-20,unsupported:power")
Faults(lost=(LostWindow(gpu=1, start=5.0, end=20.0),), unsupported=frozenset({('power', None)}), \
init_failures=0, churn=frozenset(), xids=())
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Field name -> the NVML calls that raise NotSupported when it is listed (see docs/gpu-exporter.md).
UNSUPPORTABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "memory": ("nvmlDeviceGetMemoryInfo",),
    "memory-v2": ("nvmlDeviceGetMemoryInfo_v2",),  # FunctionNotFound, as drivers < 515 answer
    "utilization": ("nvmlDeviceGetUtilizationRates",),
    "samples": ("nvmlDeviceGetSamples",),
    "processes": ("nvmlDeviceGetComputeRunningProcesses",),
    "power": ("nvmlDeviceGetPowerUsage",),
    "power-limit": ("nvmlDeviceGetEnforcedPowerLimit",),
    "energy": ("nvmlDeviceGetTotalEnergyConsumption",),
    "temperature": ("nvmlDeviceGetTemperature",),
    "memory-temperature": ("nvmlDeviceGetFieldValues",),
    "clocks": ("nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo"),
    "clock-events": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetSupportedClocksEventReasons"),
    "xid": ("nvmlDeviceRegisterEvents",),
    "pci": ("nvmlDeviceGetPciInfo",),
    "gpm": ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet"),
    "memory-owners": ("loadlensSimMemoryByOwner",),
    "allocator": ("loadlensSimAllocatorState",),
}


class FaultSpecError(ValueError):
    """A malformed ``--sim-faults`` entry; the message names the entry."""


@dataclass(frozen=True)
class LostWindow:
    gpu: int
    start: float
    end: float = math.inf

    def active(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class XidFault:
    gpu: int
    xid: int
    at: float


@dataclass(frozen=True)
class Faults:
    lost: tuple[LostWindow, ...] = ()
    unsupported: frozenset[tuple[str, int | None]] = field(default_factory=frozenset)
    init_failures: int = 0
    churn: frozenset[int | None] = field(default_factory=frozenset)
    xids: tuple[XidFault, ...] = ()

    def is_lost(self, gpu: int, t: float) -> bool:
        return any(w.gpu == gpu and w.active(t) for w in self.lost)

    def unsupported_calls(self, gpu: int) -> frozenset[str]:
        calls: set[str] = set()
        for name, target in self.unsupported:
            if target is None or target == gpu:
                calls.update(UNSUPPORTABLE_FIELDS[name])
        return frozenset(calls)

    def churns(self, gpu: int) -> bool:
        return None in self.churn or gpu in self.churn


def _seconds(text: str, entry: str) -> float:
    raw = text.strip().removesuffix("s")
    try:
        value = float(raw)
    except ValueError as err:
        raise FaultSpecError(f"{entry!r}: not a time in seconds: {text!r}") from err
    if not math.isfinite(value) or value < 0:
        raise FaultSpecError(f"{entry!r}: time must be >= 0 seconds: {text!r}")
    return value


def _index(text: str, entry: str, what: str = "GPU index") -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise FaultSpecError(f"{entry!r}: {what} must be an integer, got {text!r}") from err
    if value < 0:
        raise FaultSpecError(f"{entry!r}: {what} must be >= 0, got {value}")
    return value


def parse_faults(spec: str) -> Faults:
    """Parse a ``--sim-faults`` spec; raises :class:`FaultSpecError` naming the bad entry."""
    lost: list[LostWindow] = []
    unsupported: set[tuple[str, int | None]] = set()
    init_failures = 0
    churn: set[int | None] = set()
    xids: list[XidFault] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        kind, _, rest = entry.partition(":")
        if kind == "lost":
            gpu, at, when = rest.partition("@")
            if not at:
                raise FaultSpecError(f"{entry!r}: expected lost:<gpu>@<start>[-<end>]")
            start, dash, end = when.partition("-")
            window = LostWindow(_index(gpu, entry), _seconds(start, entry))
            if dash:
                window = LostWindow(window.gpu, window.start, _seconds(end, entry))
                if window.end <= window.start:
                    raise FaultSpecError(f"{entry!r}: end must be after start")
            lost.append(window)
        elif kind == "unsupported":
            name, _, gpu = rest.partition(":")
            if name not in UNSUPPORTABLE_FIELDS:
                raise FaultSpecError(
                    f"{entry!r}: unknown field {name!r}; choose from {', '.join(UNSUPPORTABLE_FIELDS)}"
                )
            unsupported.add((name, _index(gpu, entry) if gpu else None))
        elif kind == "init-fail":
            init_failures = _index(rest, entry, "count")
        elif kind == "process-churn":
            churn.add(_index(rest, entry) if rest else None)
        elif kind == "xid":
            target, at, when = rest.partition("@")
            gpu, _, code = target.partition(":")
            if not at or not code:
                raise FaultSpecError(f"{entry!r}: expected xid:<gpu>:<code>@<time>")
            xids.append(XidFault(_index(gpu, entry), _index(code, entry, "XID code"), _seconds(when, entry)))
        else:
            raise FaultSpecError(
                f"{entry!r}: unknown fault {kind!r}; choose from lost, unsupported, init-fail, process-churn, xid"
            )
    return Faults(
        lost=tuple(lost),
        unsupported=frozenset(unsupported),
        init_failures=init_failures,
        churn=frozenset(churn),
        xids=tuple(sorted(xids, key=lambda x: x.at)),
    )
