from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.memory import MemoryCollector
from exporters.gpu.sampler import Sampler
from tests.gpu.helpers import MakeRig, Scraped, SimRig
from tests.gpu.sim_example import GIB, MIB

L0 = {"gpu": "0", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000000", "model": "NVIDIA H100 80GB HBM3"}
# example_device: weights 14 GiB + kv 54 GiB + activations 2 GiB + adapters 3*64*2 MiB + slack 640 MiB + other 1 GiB
USED = 71 * GIB + 384 * MIB + 640 * MIB
RESERVED = 512 * MIB
TOTAL = 80 * GIB


def test_memory_v2(rig: SimRig, registry: CollectorRegistry) -> None:
    MemoryCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_memory_total_bytes", L0) == TOTAL
    assert got.get("loadlens_gpu_memory_used_bytes", L0) == USED
    assert got.get("loadlens_gpu_memory_reserved_bytes", L0) == RESERVED
    assert got.get("loadlens_gpu_memory_free_bytes", L0) == TOTAL - USED - RESERVED
    owners = {
        dict(k)["owner"]: v for k, v in got.series("loadlens_gpu_memory_owner_bytes").items() if ("gpu", "0") in k
    }
    assert owners == {
        "weights": 14 * GIB,
        "kv_cache": 54 * GIB,
        "activations": 2 * GIB,
        "adapters": 384 * MIB,
        "allocator_slack": 640 * MIB,
        "other": 1 * GIB,
    }
    assert sum(owners.values()) == USED
    # No sampler: no window series at all.
    assert got.series("loadlens_gpu_memory_fluctuation_ratio") == {}


def test_v1_fallback_has_no_reserved_series(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:memory-v2")
    MemoryCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_memory_used_bytes", L0) == USED + RESERVED  # v1 counts the reservation
    assert got.series("loadlens_gpu_memory_reserved_bytes") == {}
    assert got.get("loadlens_gpu_collector_success", {"collector": "memory"}) == 1


def test_window_series_from_sampler(rig: SimRig, registry: CollectorRegistry) -> None:
    sampler = Sampler(rig.session, clock=rig.clock)
    base = rig.source.state
    for used in (USED, USED + 128 * MIB, USED + 128 * MIB):
        devices = [base.devices[0].model_copy(update={"memory_used_bytes": used}), base.devices[1]]
        rig.set_state(base.model_copy(update={"devices": devices}))
        sampler.tick()
    MemoryCollector(rig.session, sampler=sampler, registry=registry)
    got = Scraped(registry)
    assert got.get("loadlens_gpu_memory_used_window_min_bytes", L0) == USED
    assert got.get("loadlens_gpu_memory_used_window_max_bytes", L0) == USED + 128 * MIB
    mean = (3 * USED + 2 * 128 * MIB) / 3
    assert got.get("loadlens_gpu_memory_fluctuation_ratio", L0) == 128 * MIB / mean
    assert got.get("loadlens_gpu_memory_step_increases_total", L0) == 1
    assert got.get("loadlens_gpu_memory_step_increase_bytes_total", L0) == 128 * MIB


def test_memory_owners_absent_when_unsupported(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:memory-owners")
    MemoryCollector(rig.session, registry=registry)
    got = Scraped(registry)
    assert got.series("loadlens_gpu_memory_owner_bytes") == {}
    assert got.get("loadlens_gpu_memory_used_bytes", L0) == USED


def test_memory_not_supported_on_one_gpu_keeps_v2_on_the_other(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:memory:0")
    MemoryCollector(rig.session, registry=registry)
    got = Scraped(registry)
    l1 = {**L0, "gpu": "1", "uuid": "GPU-5e1f0000-0000-4000-8000-000000000001"}
    assert got.get("loadlens_gpu_memory_used_bytes", L0) is None
    assert got.get("loadlens_gpu_memory_used_bytes", l1) == USED
    assert got.get("loadlens_gpu_memory_reserved_bytes", l1) == RESERVED
