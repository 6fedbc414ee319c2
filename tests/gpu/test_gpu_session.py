"""NVML lifecycle: init failures with backoff, zero GPUs, lost GPUs, mid-run loss of NVML itself."""

from __future__ import annotations

import pynvml

from exporters.gpu.nvml import NvmlError
from loadlens.contracts.device_state import DeviceState
from tests.gpu.helpers import MakeRig, SimRig, default_state


def test_first_use_initialises_and_enumerates(rig: SimRig) -> None:
    devices = rig.session.devices()
    assert [(d.index, d.uuid, d.model, d.pci_bus_id) for d in devices] == [
        (0, "GPU-5e1f0000-0000-4000-8000-000000000000", "NVIDIA H100 80GB HBM3", "00000000:10:00.0"),
        (1, "GPU-5e1f0000-0000-4000-8000-000000000001", "NVIDIA H100 80GB HBM3", "00000000:11:00.0"),
    ]
    s = rig.session
    assert s.up
    assert (s.driver_version, s.cuda_driver_version, s.generation) == ("550.54.15", "12.4", 1)
    assert devices[0].labels == ("0", "GPU-5e1f0000-0000-4000-8000-000000000000", "NVIDIA H100 80GB HBM3")


def test_init_failure_then_recovery_with_backoff(make_rig: MakeRig) -> None:
    rig = make_rig(faults="init-fail:2")
    s = rig.session
    assert s.devices() == []
    assert (s.up, s.init_failures_total, s.last_init_error) == (False, 1, "DriverNotLoaded")
    rig.clock.advance(0.5)
    assert s.devices() == []  # backoff (1 s) not over: no new attempt
    assert rig.sim.init_calls == 1
    rig.clock.advance(0.5)
    assert s.devices() == []  # second attempt fails; backoff doubles to 2 s
    assert s.init_failures_total == 2
    rig.clock.advance(1.9)
    s.devices()
    assert rig.sim.init_calls == 2
    rig.clock.advance(0.1)
    assert len(s.devices()) == 2
    assert (s.up, s.last_init_error, rig.sim.init_calls) == (True, "", 3)


def test_zero_gpus_is_down(make_rig: MakeRig) -> None:
    rig = make_rig(default_state().model_copy(update={"devices": []}))
    s = rig.session
    assert s.devices() == []
    assert not s.up
    assert s.last_init_error == "NoDevices"
    # GPUs appear later (a device mount fixed): the retry finds them.
    rig.set_state(default_state())
    rig.clock.advance(1)
    assert len(s.devices()) == 2
    assert s.up


def test_lost_gpu_is_down_alone_and_recovers(make_rig: MakeRig) -> None:
    rig = make_rig(faults="lost:1@5-8")
    s = rig.session
    devices = s.devices()
    rig.clock.advance(5)
    try:
        rig.nvml.power_watts(devices[1].handle)
    except NvmlError as err:
        s.mark_lost(devices[1], err)
    assert [d.index for d in s.devices()] == [0]
    assert [(d.index, up) for d, up in s.all_devices()] == [(0, True), (1, False)]
    assert s.up  # NVML itself is fine
    rig.clock.advance(1)  # backoff over, GPU 1 still lost: re-init keeps it down with its identity
    assert [d.index for d in s.devices()] == [0]
    lost = [d for d, up in s.all_devices() if not up]
    assert [(d.index, d.uuid, d.handle) for d in lost] == [(1, "GPU-5e1f0000-0000-4000-8000-000000000001", None)]
    assert s.reinits_total == 1
    rig.clock.advance(2)  # t=8: recovered; next retry (backoff 2 s) brings it back
    assert [d.index for d in s.devices()] == [0, 1]
    assert s.reinits_total == 2


def test_nvml_down_mid_run_reinitialises(rig: SimRig) -> None:
    s = rig.session
    assert len(s.devices()) == 2
    s.mark_down(NvmlError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "nvmlDeviceGetCount"))
    assert not s.up
    assert s.devices() == []  # not before the backoff
    rig.clock.advance(1)
    assert len(s.devices()) == 2
    assert s.generation == 2


def test_unreachable_engine_then_back(rig: SimRig) -> None:
    s = rig.session
    s.devices()
    rig.source.fail = OSError("refused")
    try:
        rig.nvml.device_count()
    except NvmlError as err:
        s.mark_down(err)
    assert not s.up
    rig.source.fail = None
    rig.clock.advance(1)
    assert len(s.devices()) == 2


def test_close_shuts_nvml_down(rig: SimRig) -> None:
    rig.session.devices()
    rig.session.close()
    assert not rig.session.up
    rig.session.close()  # idempotent


def test_state_with_one_device(make_rig: MakeRig) -> None:
    state: DeviceState = default_state(n_gpus=1)
    rig = make_rig(state)
    assert [d.index for d in rig.session.devices()] == [0]
