from __future__ import annotations

import math

import pytest

from exporters.gpu.faults import Faults, FaultSpecError, LostWindow, XidFault, parse_faults


def test_empty_spec_is_no_faults() -> None:
    assert parse_faults("") == Faults()
    assert parse_faults(" , ") == Faults()


def test_full_spec() -> None:
    f = parse_faults(
        "lost:1@5-20, lost:0@2s, unsupported:power, unsupported:temperature:0, init-fail:2, process-churn:1, "
        "xid:0:79@3, xid:1:48@1"
    )
    assert f.lost == (LostWindow(1, 5.0, 20.0), LostWindow(0, 2.0, math.inf))
    assert f.unsupported == frozenset({("power", None), ("temperature", 0)})
    assert f.init_failures == 2
    assert f.churn == frozenset({1})
    assert f.xids == (XidFault(1, 48, 1.0), XidFault(0, 79, 3.0))  # sorted by time


def test_lost_window_is_half_open() -> None:
    f = parse_faults("lost:1@5-20")
    assert [f.is_lost(1, t) for t in (4.99, 5.0, 19.99, 20.0)] == [False, True, True, False]
    assert not f.is_lost(0, 10.0)


def test_unsupported_calls_per_gpu() -> None:
    f = parse_faults("unsupported:power,unsupported:clocks:1")
    assert f.unsupported_calls(0) == frozenset({"nvmlDeviceGetPowerUsage"})
    assert f.unsupported_calls(1) == frozenset(
        {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo"}
    )


def test_churn_everywhere() -> None:
    f = parse_faults("process-churn")
    assert f.churns(0) and f.churns(7)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("explode:1", "unknown fault 'explode'"),
        ("lost:1", "expected lost:<gpu>@<start>"),
        ("lost:x@1", "GPU index must be an integer"),
        ("xid:0:79@-1", "time must be >= 0"),
        ("lost:1@abc", "not a time in seconds"),
        ("lost:1@5-2", "end must be after start"),
        ("unsupported:fan", "unknown field 'fan'"),
        ("init-fail:-1", "count must be >= 0"),
        ("xid:0@3", "expected xid:<gpu>:<code>@<time>"),
        ("xid:0:abc@3", "XID code must be an integer"),
    ],
)
def test_bad_specs_name_the_entry(spec: str, message: str) -> None:
    with pytest.raises(FaultSpecError, match=message) as info:
        parse_faults(f"init-fail:1,{spec}")
    assert repr(spec) in str(info.value)
