"""Helpers shared by the GPU exporter tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from exporters.gpu.nvml import Nvml
from exporters.gpu.session import Session
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from loadlens.contracts.device_state import DeviceState
from tests.gpu.sim_example import example_state

# 0.1 s is exact in microseconds, so expected window values are exact too.
SAMPLE_INTERVAL = 0.1


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class SimRig:
    source: StaticSource
    sim: SimNvml
    nvml: Nvml
    session: Session
    clock: FakeClock

    def set_state(self, state: DeviceState) -> None:
        self.source.state = state


def default_state(n_gpus: int = 2, n_processes: int = 3) -> DeviceState:
    return example_state(n_gpus, n_processes, sample_interval=SAMPLE_INTERVAL)


MakeRig = Callable[..., SimRig]


class Scraped:
    """One collection of a registry, queried like ``registry.get_sample_value`` without collecting again.

    ``get_sample_value`` runs a fresh collection per call; exporter counters (errors, scrape histogram) would
    move between assertions.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.names: set[str] = set()
        for family in registry.collect():
            self.names.add(family.name)
            for s in family.samples:
                self.values[(s.name, frozenset(s.labels.items()))] = s.value

    def get(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.values.get((name, frozenset((labels or {}).items())))

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: v for (n, labels), v in self.values.items() if n == name}
