"""The probe's public API and sampler against a fake torch: documents, events, back-off, never raising."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import pytest

from exporters.probe import Probe, start_probe
from exporters.probe.probe import EARLY_WRITE_GAP_S, alloc_conf
from loadlens.contracts.probe_document import PROBE_DOCUMENT_VERSION, ProbeDocument
from loadlens.util.procstat import start_time_ticks
from tests.probe.fakes import MIB, FakeCuda, fake_torch, segment, stats, uuid


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cuda_two_devices() -> FakeCuda:
    snapshot = [
        segment(0, [(2 * MIB, 1_258_291, "active_allocated"), (4 * MIB, 0, "inactive"), (8 * MIB, 0, "inactive")]),
        segment(0, [(MIB, 1_000_000, "active_awaiting_free"), (MIB, 0, "inactive")], address=0x7F1000000000),
        segment(1, [(20 * MIB, 0, "inactive")], address=0x7F2000000000),
    ]
    return FakeCuda(
        {
            0: stats(16 * MIB, 2 * MIB, 1_258_291, **{"segment.all.current": 2, "num_alloc_retries": 3}),
            1: stats(20 * MIB, 0, 0, **{"segment.all.current": 1, "num_ooms": 1}),
            2: {},  # never used by this process: no entry
        },
        snapshot,
    )


def read(probe: Probe) -> ProbeDocument:
    return ProbeDocument.model_validate_json(probe.path.read_bytes())


def make(
    tmp_path: Path, cuda: FakeCuda, clock: Clock | None = None, interval: float = 5.0, snapshot_interval: float = 30.0
) -> Probe:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512"}
    return Probe(
        "vllm-worker",
        tmp_path,
        fake_torch(cuda),
        env=env,
        hostname="node-a",
        clock=clock or Clock(),
        interval=interval,
        snapshot_interval=snapshot_interval,
    )


def test_document_fields(tmp_path: Path) -> None:
    cuda = cuda_two_devices()
    probe = make(tmp_path, cuda)
    probe.write_now()
    doc = read(probe)
    assert probe.path == tmp_path / f"probe-node-a-{os.getpid()}.json"
    assert (doc.version, doc.pid, doc.role, doc.hostname) == (
        PROBE_DOCUMENT_VERSION,
        os.getpid(),
        "vllm-worker",
        "node-a",
    )
    assert doc.start_time_ticks == start_time_ticks(os.getpid())
    assert doc.written_at == 1_800_000_000.0
    assert doc.allocator_config == {"expandable_segments": "True", "max_split_size_mb": "512"}
    assert doc.allocator_backend == "native"
    assert doc.torch_version == "2.13.0+fake"
    assert [d.cuda_index for d in doc.devices] == [0, 1]
    d0, d1 = doc.devices
    assert (d0.uuid, d0.name) == (uuid(0), "NVIDIA H100 80GB HBM3")
    assert (d0.reserved_bytes, d0.allocated_bytes, d0.requested_bytes) == (16 * MIB, 2 * MIB, 1_258_291)
    assert d0.rounding_overhead_bytes == 2 * MIB - 1_258_291
    assert (d0.segments, d0.alloc_retries, d1.ooms) == (2, 3, 1)
    # Free: 4 + 8 MiB in the large segment, 1 MiB in the small one; awaiting-free is not free.
    assert (d0.largest_free_block_bytes, d0.total_free_bytes) == (8 * MIB, 13 * MIB)
    assert d0.fragmentation_ratio == pytest.approx(1 - 8 / 13)
    assert [(p.pool, p.size_class, p.segments, p.reserved_bytes) for p in d0.pools] == [
        ("small", "le_2mib", 1, 2 * MIB),
        ("large", "le_20mib", 1, 14 * MIB),
    ]
    assert (d1.largest_free_block_bytes, d1.total_free_bytes, d1.fragmentation_ratio) == (20 * MIB, 20 * MIB, 0.0)
    assert d0.snapshot_at == d0.stats_at == 1_800_000_000.0
    assert doc.snapshot_duration_seconds is not None
    assert cuda.calls.count("memory_snapshot{'include_traces': False}") == 1


def test_snapshot_at_its_own_rate_and_no_synchronise(tmp_path: Path) -> None:
    cuda, clock = cuda_two_devices(), Clock()
    probe = make(tmp_path, cuda, clock, interval=5.0, snapshot_interval=30.0)
    for _ in range(7):  # 0, 5, ..., 30 s
        probe.write_now()
        clock.now += 5.0
    assert sum(c.startswith("memory_snapshot") for c in cuda.calls) == 2  # at 0 s and 30 s
    assert cuda.calls.count("memory_stats") == 7 * 3
    doc = read(probe)
    assert doc.devices[0].snapshot_at == 1_800_000_030.0
    assert doc.devices[0].stats_at == 1_800_000_030.0


def test_backs_off_when_a_snapshot_is_expensive(tmp_path: Path) -> None:
    cuda, clock = cuda_two_devices(), Clock()
    ticks = iter([0.0, 0.001, 0.001, 0.801] + [1.0] * 100)  # stats 1 ms, snapshot 0.8 s, then cheap
    probe = Probe("trainer", tmp_path, fake_torch(cuda), clock=clock, timer=lambda: next(ticks), env={})
    probe.write_now()
    assert probe.snapshot_duration == pytest.approx(0.8)
    assert probe.snapshot_interval == pytest.approx(80.0)  # 0.8 s / 1 % budget
    assert read(probe).snapshot_interval_seconds == pytest.approx(80.0)
    clock.now += 79.0
    probe.write_now()
    assert sum(c.startswith("memory_snapshot") for c in cuda.calls) == 1
    clock.now += 1.0
    probe.write_now()  # cheap this time (timer stuck at 1.0): back to the base interval
    assert sum(c.startswith("memory_snapshot") for c in cuda.calls) == 2
    assert probe.snapshot_interval == 30.0


def test_back_off_is_capped(tmp_path: Path) -> None:
    ticks = iter([0.0, 0.0, 0.0, 50.0] + [50.0] * 10)
    probe = Probe("trainer", tmp_path, fake_torch(cuda_two_devices()), timer=lambda: next(ticks), env={})
    probe.write_now()
    assert probe.snapshot_interval == 600.0


def test_cuda_not_initialised_publishes_no_devices_and_reads_nothing(tmp_path: Path) -> None:
    cuda = cuda_two_devices()
    cuda.initialized = False
    probe = make(tmp_path, cuda)
    probe.write_now()
    doc = read(probe)
    assert doc.devices == [] and doc.allocator_backend == ""
    assert cuda.calls == []


def test_torch_without_include_traces(tmp_path: Path) -> None:
    cuda = cuda_two_devices()
    cuda.traces_kwarg = False
    make(tmp_path, cuda).write_now()
    assert "memory_snapshot{}" in cuda.calls


def test_lora_and_cuda_graph_events(tmp_path: Path) -> None:
    probe = make(tmp_path, cuda_two_devices())
    probe.record_lora_load("sql-lora", 16, 100.0, 100.25, on_demand=True)
    probe.record_lora_load("chat-lora", None, 101.0, 101.5, on_demand=False)
    for i in range(40):
        probe.record_lora_load(f"a{i}", 8, 200.0 + i, 200.125 + i, on_demand=True)
    probe.record_lora_load("bad", -1, 1.0, 2.0, on_demand=True)  # invalid rank: dropped, no exception
    probe.record_cuda_graph_capture(3.5)
    probe.record_cuda_graph_capture(0.5)
    probe.record_cuda_graph_capture(float("nan"))
    probe.write_now()
    ev = read(probe).events
    assert len(ev.lora_loads) == 32
    assert ev.lora_loads[-1].adapter == "a39" and ev.lora_loads[0].adapter == "a8"
    assert (ev.lora_loads_total, ev.lora_on_demand_loads_total) == (42, 41)
    assert ev.lora_load_seconds_total == pytest.approx(0.25 + 0.5 + 40 * 0.125)
    assert ev.lora_on_demand_load_seconds_total == pytest.approx(0.25 + 40 * 0.125)
    assert ev.cuda_graph_capture_seconds == 4.0


def _wait_for_loads(probe: Probe, total: int) -> None:
    """Until the document shows ``total`` loads. The deadline is a third of the test's 60 s interval: reaching
    it means the loads waited for the interval write; a loaded machine is far inside it."""
    deadline = time.monotonic() + 20.0
    while read(probe).events.lora_loads_total != total:
        assert time.monotonic() < deadline, "the load was not published early"
        time.sleep(0.01)


def test_a_lora_load_is_published_before_the_interval(tmp_path: Path) -> None:
    # The proxy's swap feed attributes stalls to the window only once it can read it: a load must not wait
    # for the next 5 s (here 60 s) write. The thread writes it within the early-write gap, not the interval.
    builds: list[float] = []  # when each document was built: the clock is read once per write, before it

    def clock() -> float:
        builds.append(time.monotonic())
        return time.time()

    probe = Probe("vllm-worker", tmp_path, fake_torch(cuda_two_devices()), hostname="node-a", interval=60.0,
                  clock=clock)  # fmt: skip
    probe.start()
    try:
        assert read(probe).events.lora_loads_total == 0
        probe.record_lora_load("sql-lora", 8, 100.0, 100.5, on_demand=True)
        _wait_for_loads(probe, 1)
        assert [e.adapter for e in read(probe).events.lora_loads] == ["sql-lora"]
        assert len(builds) == 2  # the start's write and one early write; nothing else is due for 60 s
        started = time.monotonic()
        for i in range(20):  # a burst over ~0.1 s: a few early writes, not one per load
            probe.record_lora_load(f"a{i}", 8, 101.0 + i, 101.25 + i, on_demand=False)
            time.sleep(0.005)  # spread, so unlimited writing would show (one per load); the bound holds anyway
        _wait_for_loads(probe, 21)
        writes, elapsed = len(builds) - 2, time.monotonic() - started
        # The thread waits EARLY_WRITE_GAP_S after each early write, so their builds are at least that far
        # apart and `elapsed` holds at most elapsed / gap + 1 of them: a rate limit that holds however slow the
        # machine is. One write per load breaks it whenever the burst is published in under a second.
        assert 1 <= writes <= elapsed / EARLY_WRITE_GAP_S + 1, (writes, elapsed)
    finally:
        probe.stop()


def test_a_failing_allocator_read_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cuda = cuda_two_devices()
    probe = make(tmp_path, cuda)
    probe.write_now()
    before = probe.path.read_bytes()
    cuda.fail_stats = True
    with caplog.at_level(logging.WARNING):
        probe.write_now()
        probe.write_now()
    assert probe.errors_total == 2
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1  # logged once
    assert probe.path.read_bytes() == before  # the last good document stays


def test_start_probe_runs_the_thread_and_stop_removes_the_document(tmp_path: Path) -> None:
    probe = start_probe("trainer", directory=tmp_path / "sub", torch=fake_torch(cuda_two_devices()))
    assert probe is not None
    try:
        doc = json.loads(probe.path.read_text())  # the first document is written before start returns
        assert doc["role"] == "trainer" and len(doc["devices"]) == 2
    finally:
        probe.stop()
    assert not probe.path.exists()
    probe.stop()  # idempotent
    probe.write_now()  # after stop: writes nothing
    assert list((tmp_path / "sub").iterdir()) == []


def test_start_probe_reads_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADLENS_PROBE_DIR", str(tmp_path))
    monkeypatch.setenv("LOADLENS_PROBE_INTERVAL", "0.5")
    monkeypatch.setenv("LOADLENS_PROBE_SNAPSHOT_INTERVAL", "bogus")
    probe = start_probe("vllm-worker", torch=fake_torch(cuda_two_devices()))
    assert probe is not None
    try:
        assert probe.directory == tmp_path
        assert (probe.interval, probe.snapshot_interval) == (0.5, 30.0)
    finally:
        probe.stop()


@pytest.mark.parametrize(
    ("role", "directory", "cuda", "message"),
    [
        ("trainer", None, FakeCuda({}, []), "disabled (LOADLENS_PROBE_DIR is not set)"),
        ("Not A Slug!", "x", FakeCuda({}, []), "must match"),
    ],
)
def test_start_probe_returns_none_with_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    role: str,
    directory: str | None,
    cuda: FakeCuda,
    message: str,
) -> None:
    monkeypatch.delenv("LOADLENS_PROBE_DIR", raising=False)
    with caplog.at_level(logging.INFO, logger="exporters.probe"):
        got = start_probe(role, directory=None if directory is None else tmp_path / directory, torch=fake_torch(cuda))
    assert got is None
    assert len(caplog.records) == 1 and message in caplog.records[0].getMessage()


def test_without_cuda_the_document_has_events_and_no_devices(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's CPU worker: nothing of torch.cuda is read, fields with nothing behind them are absent (null)."""
    monkeypatch.delenv("LOADLENS_PROBE_INTERVAL", raising=False)  # the default interval, whatever ran before
    cuda = FakeCuda({0: stats(2**30, 2**29, 2**29)}, [], available=False)
    with caplog.at_level(logging.INFO, logger="exporters.probe"):
        probe = start_probe("vllm-worker", directory=tmp_path, torch=fake_torch(cuda))
    assert probe is not None
    try:
        assert [r.getMessage() for r in caplog.records] == [
            f"loadlens probe: role vllm-worker writing {probe.path} every 5 s (no CUDA: events only, no devices)"
        ]
        probe.record_lora_load("r8", 8, 100.0, 100.25, on_demand=True, source="cpu_cache")
        probe.write_now()
        doc = json.loads(probe.path.read_text())
    finally:
        probe.stop()
    assert cuda.calls == []  # no memory_stats(), no memory_snapshot()
    assert doc["devices"] == [] and doc["allocator_backend"] == ""
    assert doc["stats_duration_seconds"] is None and doc["snapshot_interval_seconds"] is None
    assert doc["snapshot_duration_seconds"] is None
    assert doc["events"] == {
        "lora_loads": [
            {"adapter": "r8", "rank": 8, "start": 100.0, "end": 100.25, "on_demand": True, "source": "cpu_cache"}
        ],
        "lora_loads_total": 1,
        "lora_on_demand_loads_total": 1,
        "lora_load_seconds_total": 0.25,
        "lora_on_demand_load_seconds_total": 0.25,
        "cuda_graph_capture_seconds": None,
    }
    ProbeDocument.model_validate(doc)


def test_start_probe_without_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_torch(name: str, *args: object, **kwargs: object) -> object:
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_torch)
    monkeypatch.setitem(sys.modules, "torch", None)  # also where another test imported it: the import fails
    assert start_probe("trainer", directory=tmp_path) is None
    assert not list(tmp_path.iterdir())


def test_start_probe_never_raises_on_an_unwritable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert start_probe("trainer", directory=blocker / "sub", torch=fake_torch(cuda_two_devices())) is None


def test_alloc_conf_prefers_the_new_variable() -> None:
    assert alloc_conf({"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync", "PYTORCH_CUDA_ALLOC_CONF": "x:1"}) == {
        "backend": "cudaMallocAsync"
    }
    assert alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == {"expandable_segments": "True"}
    assert alloc_conf({}) == {}
