"""The parts of benchmarks/gpu_probe_check.py that need no GPU: the allocator maths (caching_allocator.py), the
bookkeeping and the rig (gpu_probe_rig.py), the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import caching_allocator as ca
from benchmarks import gpu_probe_check as gpc
from benchmarks import gpu_probe_rig as gpr
from tests.probe.fakes import FakeCuda, fake_torch, stats, synthetic_snapshot

MIB = 2**20


def test_block_rules() -> None:
    assert [ca.round_size(n) for n in (1, 512, 513, 1_200_000)] == [512, 512, 1024, 1_200_128]
    assert ca.pool_of(MIB) == "small" and ca.pool_of(MIB + 512) == "large"
    assert ca.segment_size(4096) == 2 * MIB
    assert ca.segment_size(MIB + 512) == ca.segment_size(10 * MIB - 512) == 20 * MIB
    assert ca.segment_size(10 * MIB) == 10 * MIB and ca.segment_size(11 * MIB) == 12 * MIB


def test_guide_pattern_grows_in_20_mib_steps_with_an_unsplit_tail() -> None:
    # 1.2 MB asks are large-pool blocks of 1 200 128 B: 16 fit a 20 MiB segment, the 17th takes the whole
    # 1.69 MiB tail (its rest, 0.54 MiB, is not > 1 MiB so the block is not split).
    reserved = [ca.simulate([ca.GUIDE_REQUEST] * n).reserved for n in (8, 16, 24)]
    assert reserved == [20 * MIB, 20 * MIB, 40 * MIB]
    s = ca.simulate([ca.GUIDE_REQUEST] * 24)
    tail = 20 * MIB - 16 * 1_200_128
    assert s.allocated == 23 * 1_200_128 + tail and s.requested == 24 * 1_200_000
    assert s.rounding_overhead == 23 * 128 + tail - 1_200_000 == 572_416
    assert s.segments == {"small": 0, "large": 2}


def test_small_requests_share_one_2_mib_segment() -> None:
    s = ca.simulate([32768] * 64)  # 2 MiB of 32 KiB tensors: exactly one segment, no rounding
    assert (s.reserved, s.allocated, s.rounding_overhead, s.segments["small"]) == (2 * MIB, 2 * MIB, 0, 1)
    s = ca.simulate([32768] * 65)
    assert s.reserved == 4 * MIB and s.segments["small"] == 2
    # a large-pool rest of <= 1 MiB stays with the block: allocated counts it, requested does not
    s = ca.simulate([19 * MIB + 100])
    assert (s.reserved, s.allocated, s.requested) == (20 * MIB, 20 * MIB, 19 * MIB + 100)


def test_expected_lora_bytes_default_shape() -> None:
    shape = ca.ModelShape()  # hidden 1024, 16 heads of 64, 8 KV heads, rank 8, fp32
    assert ca.lora_module_bytes(shape) == {"q_proj": 8 * (1024 + 1024) * 4, "v_proj": 8 * (1024 + 512) * 4}
    want = ca.expected_adapter(shape)
    assert want["tensors"] == 16  # A and B of q and v in 4 layers
    assert want["requested_bytes"] == 4 * (65536 + 49152) == 458_752
    # multiples of 512 B: LoRA tensors of realistic shapes add no rounding overhead of their own
    assert want["allocated_bytes_min"] == want["requested_bytes"] and want["rounding_overhead_bytes"] == 0
    assert want["allocated_bytes_max"] == want["allocated_bytes_min"]  # all small-pool: split or exact


def test_expected_lora_bytes_with_rounding() -> None:
    shape = ca.ModelShape(hidden=1040, dtype_bytes=2)  # head_dim 65, bf16: 16 * 1040 B is 256 B past 512
    per_layer = 256 + 256 + 256 + (512 - 8 * 520 * 2 % 512)
    assert ca.expected_adapter(shape)["rounding_overhead_bytes"] == 4 * per_layer == 4608


def test_failing_step_is_recorded_and_the_next_runs() -> None:
    lines: list[str] = []
    report = gpr.Report(lines.append)
    with report.step("first") as v:
        v["x"] = 1
        report.check("fine", True, 1)
        raise ValueError("boom")
    with report.step("second"):
        report.check("still runs", True, 2)
    doc = report.as_json()
    assert not report.ok and (doc["passed"], doc["failed"]) == (2, 1)
    first = doc["steps"][0]
    assert first["error"] == "ValueError: boom" and "Traceback" in first["traceback"] and first["values"] == {"x": 1}
    assert "FAIL step 1 ran to the end: ValueError: boom" in lines
    assert lines[-1] == "PASS still runs: 2"
    json.dumps(doc)


def test_no_checks_is_not_ok() -> None:
    assert not gpr.Report(lambda _: None).ok


def test_parse_args() -> None:
    args = gpc.parse_args(["--out", "x"])
    assert (args.out, args.hidden, args.layers, args.steps, args.fragments) == (Path("x"), 1024, 4, 10, 20000)
    with pytest.raises(SystemExit) as err:
        gpc.parse_args(["--hidden", "1000"])
    assert err.value.code == 2


def test_exits_2_with_one_line_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpc.main(["--out", str(tmp_path / "out")]) == 2  # this machine's torch is the CPU build
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu_probe_check: CUDA is not available (torch ")
    assert not (tmp_path / "out").exists()


def test_reason_when_torch_is_missing() -> None:
    def missing() -> None:
        raise ImportError("No module named 'torch'")

    reason = gpr.cuda_missing(missing)
    assert reason is not None and reason.startswith("torch cannot be imported (ImportError")


def test_rig_scrapes_a_probe_through_the_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake torch and no NVML on this machine: the probe collector still reads the document (gpu="").
    # step_rig sets the probe's intervals in this process's environment, as the GPU run wants; monkeypatch puts
    # back what was there, so a later test in this worker does not start its probe with them.
    monkeypatch.setenv("LOADLENS_PROBE_INTERVAL", "1")
    monkeypatch.setenv("LOADLENS_PROBE_SNAPSHOT_INTERVAL", "0.05")
    cuda = FakeCuda({0: stats(4 * MIB, 3 * MIB, 3 * MIB - 1000, **{"segment.all.current": 2})}, synthetic_snapshot(2))
    rig = gpr.Rig(tmp_path, tmp_path / "probe", fake_torch(cuda))
    report = gpr.Report(lambda _: None)
    with report.step("rig"):
        gpc.step_rig(report, rig)
    try:
        assert report.ok, report.as_json()
        fig = rig.scrape("t", fresh_snapshot=False)
    finally:
        rig.probe.stop()
        rig.exporter.stop()
    assert (fig["reserved"], fig["allocated"], fig["rounding_overhead"], fig["segments"]) == (4 * MIB, 3 * MIB, 1000, 2)
    assert fig["gpu_label"] == "" and fig["pools"] and fig["fragmentation_ratio"] is not None
    assert (tmp_path / "probe-t.prom").is_file()
