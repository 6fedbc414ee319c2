"""Shared fixtures for the GPU exporter tests: a fake clock and a sim backend over an in-memory document."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporters.gpu.faults import parse_faults
from exporters.gpu.nvml import Nvml
from exporters.gpu.session import Session
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from loadlens.contracts.device_state import DeviceState
from tests.gpu.helpers import FakeClock, MakeRig, SimRig, default_state


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_rig(clock: FakeClock) -> MakeRig:
    def make(state: DeviceState | None = None, faults: str = "") -> SimRig:
        source = StaticSource(state if state is not None else default_state())
        # max_age=0: every call sees the current document, so tests can swap it between calls.
        sim = SimNvml(source, faults=parse_faults(faults), max_age=0.0, clock=clock)
        nvml = Nvml(sim)
        session = Session(nvml, backend="sim", clock=clock)
        return SimRig(source, sim, nvml, session, clock)

    return make


@pytest.fixture
def rig(make_rig: MakeRig) -> SimRig:
    return make_rig()
