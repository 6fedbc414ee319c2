from __future__ import annotations

from typing import Any

import pynvml
from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.errors import ErrorsCollector
from exporters.gpu.sampler import Sampler
from tests.gpu.helpers import MakeRig, Scraped, SimRig

L0 = {"gpu": "0", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000000", "model": "NVIDIA H100 80GB HBM3"}
L1 = {"gpu": "1", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000001", "model": "NVIDIA H100 80GB HBM3"}


def test_xid_counts(rig: SimRig, registry: CollectorRegistry) -> None:
    sampler = Sampler(rig.session, clock=rig.clock, wall=lambda: 1_700_000_123.0)
    sampler.tick()
    rig.sim.inject_xid(1, 79)
    rig.sim.inject_xid(1, 48)
    rig.sim.inject_xid(1, 79)
    sampler.tick()
    ErrorsCollector(rig.session, sampler=sampler, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_xid_events_total", L0) == 0  # registered, nothing happened: a real 0
    assert got.get("loadlens_gpu_xid_events_total", L1) == 3
    assert got.get("loadlens_gpu_xid_errors_total", {**L1, "xid": "79"}) == 2
    assert got.get("loadlens_gpu_xid_errors_total", {**L1, "xid": "48"}) == 1
    assert got.get("loadlens_gpu_xid_last_timestamp_seconds", L1) == 1_700_000_123.0
    assert got.get("loadlens_gpu_xid_last_timestamp_seconds", L0) is None
    # The sim has no ECC or row-remap data: absent, like a GeForce.
    for name in ("ecc_errors_total", "remapped_rows", "row_remap_pending", "row_remap_failed"):
        assert got.series(f"loadlens_gpu_{name}") == {}
    assert got.get("loadlens_gpu_collector_success", {"collector": "errors"}) == 1


def test_scheduled_xid_fault(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="xid:0:79@2")
    sampler = Sampler(rig.session, clock=rig.clock, wall=lambda: 5.0)
    ErrorsCollector(rig.session, sampler=sampler, registry=registry)
    sampler.tick()
    assert Scraped(registry).get("loadlens_gpu_xid_events_total", L0) == 0
    rig.clock.advance(2)
    sampler.tick()
    assert Scraped(registry).get("loadlens_gpu_xid_errors_total", {**L0, "xid": "79"}) == 1


def test_xid_unsupported_is_absent(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:xid")
    sampler = Sampler(rig.session, clock=rig.clock)
    sampler.tick()
    ErrorsCollector(rig.session, sampler=sampler, registry=registry)
    assert Scraped(registry).series("loadlens_gpu_xid_events_total") == {}


class WithEcc:
    """The sim backend plus ECC and remapped rows, as an H100 reports them."""

    def __init__(self, sim: Any) -> None:
        self._sim = sim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sim, name)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        self._sim.nvmlDeviceGetUUID(handle)  # lost-GPU faults still apply
        return 5 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return (3, 1, 0, 1) if handle.index == 1 else (0, 0, 0, 0)


def test_ecc_and_remapped_rows(rig: SimRig, registry: CollectorRegistry) -> None:
    rig.nvml._api = WithEcc(rig.sim)
    ErrorsCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_ecc_errors_total", {**L0, "type": "corrected"}) == 5
    assert got.get("loadlens_gpu_ecc_errors_total", {**L0, "type": "uncorrected"}) == 0
    assert got.get("loadlens_gpu_remapped_rows", {**L1, "type": "correctable"}) == 3
    assert got.get("loadlens_gpu_remapped_rows", {**L1, "type": "uncorrectable"}) == 1
    assert got.get("loadlens_gpu_row_remap_pending", L1) == 0
    assert got.get("loadlens_gpu_row_remap_failed", L1) == 1
    assert got.series("loadlens_gpu_xid_events_total") == {}  # no sampler
