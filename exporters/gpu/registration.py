"""Self-registration of the exporter's sub-collectors: each module in ``exporters/gpu/collectors/`` names itself,
says whether it runs by default and how to build it, so adding a collector touches only its own module::

    def _build(ctx: BuildContext) -> PowerCollector:
        return PowerCollector(ctx.session, timer=ctx.timer, clock=ctx.clock)

    register_collector(PowerCollector.name, default=True, factory=_build)

:data:`COLLECTORS` holds the registrations in the order they were made, which is the order
``exporters/gpu/collectors/__init__.py`` imports the modules in: the ``--collectors`` help and error
messages, the ``default`` set and every family order derived from them follow it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporters.gpu.collector import GpuCollector
    from exporters.gpu.sampler import Sampler
    from exporters.gpu.session import Session

__all__ = ["COLLECTORS", "BuildContext", "CollectorRegistrations", "Factory", "Registration", "register_collector"]


@dataclass(frozen=True)
class BuildContext:
    """Everything a factory may need; each collector takes only what it uses."""

    session: Session
    sampler: Sampler
    max_processes: int = 128
    proc_root: str | None = "/proc"
    hostname: str | None = None
    probe_dir: str | None = None  # where the in-process probes write (collectors/probe.py)
    dcgm_compat: bool = False  # --dcgm-compat: collectors with DCGM equivalents also export DCGM_FI_* aliases
    timer: Callable[[], float] = field(default=time.perf_counter)
    clock: Callable[[], float] = field(default=time.time)
    monotonic: Callable[[], float] = field(default=time.monotonic)  # intervals between passes (gpm)


Factory = Callable[[BuildContext], "GpuCollector"]


@dataclass(frozen=True)
class Registration:
    name: str
    default: bool
    factory: Factory


class CollectorRegistrations:
    """Collector name -> registration, in registration order. Iterating yields the names."""

    def __init__(self) -> None:
        self._by_name: dict[str, Registration] = {}

    def register(self, name: str, *, default: bool, factory: Factory) -> None:
        # A second registration would silently replace the first collector: refuse it.
        if name in self._by_name:
            raise ValueError(f"collector {name!r} is already registered")
        if not name or name == "default" or "," in name:
            raise ValueError(f"invalid collector name {name!r}")  # it could not be selected with --collectors
        self._by_name[name] = Registration(name, default, factory)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def defaults(self) -> tuple[str, ...]:
        """What ``--collectors default`` selects."""
        return tuple(r.name for r in self._by_name.values() if r.default)

    def build(self, name: str, ctx: BuildContext) -> GpuCollector:
        collector = self._by_name[name].factory(ctx)
        if collector.name != name:
            # Health series are labelled with collector.name; a mismatch would report under the wrong name.
            raise ValueError(f"collector registered as {name!r} calls itself {collector.name!r}")
        return collector


COLLECTORS = CollectorRegistrations()


def register_collector(name: str, *, default: bool, factory: Factory) -> None:
    """Register a sub-collector with the exporter (call it at import time of the collector's module)."""
    COLLECTORS.register(name, default=default, factory=factory)
