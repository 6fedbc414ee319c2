"""The probe collector and its directory reader: fresh, stale, corrupt, pid-gone, pid-reused and many documents;
atomic writes under a concurrent reader; the scrape never fails; series joined to the GPU by UUID."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.gpu.collectors import probe as probe_collector
from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from exporters.probe.writer import atomic_write, document_name
from loadlens.contracts.probe_document import (
    LoraLoad,
    PoolSegments,
    ProbeDevice,
    ProbeDocument,
    ProbeEvents,
)
from loadlens.util.probe_directory import DROP_REASONS, ProbeReader
from loadlens.util.procstat import pid_namespace, start_time_ticks
from tests.gpu.helpers import default_state

NOW = 1_800_000_000.0
MIB = 2**20
OWN_NS = pid_namespace()


def device(uuid: str, index: int = 0, **kw: Any) -> ProbeDevice:
    base: dict[str, Any] = dict(
        cuda_index=index,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        reserved_bytes=22 * MIB,
        allocated_bytes=9 * MIB,
        active_bytes=9 * MIB,
        inactive_split_bytes=13 * MIB,
        requested_bytes=6 * MIB,
        rounding_overhead_bytes=3 * MIB,
        segments=2,
        alloc_retries=1,
        ooms=0,
        largest_free_block_bytes=8 * MIB,
        total_free_bytes=13 * MIB,
        fragmentation_ratio=1 - 8 / 13,
        pools=[PoolSegments(pool="large", size_class="le_20mib", segments=1, reserved_bytes=20 * MIB)],
        stats_at=NOW - 1,
        snapshot_at=NOW - 10,
    )
    base.update(kw)
    return ProbeDevice(**base)


def document(pid: int = 0, **kw: Any) -> ProbeDocument:
    pid = pid or os.getpid()
    base: dict[str, Any] = dict(
        version=1,
        pid=pid,
        start_time_ticks=start_time_ticks(pid),
        pid_namespace=OWN_NS,
        role="vllm-worker",
        hostname="node-a",
        written_at=NOW - 1,
        interval_seconds=5.0,
        snapshot_interval_seconds=30.0,
        snapshot_duration_seconds=0.012,
        stats_duration_seconds=0.0001,
        torch_version="2.13.0",
        allocator_backend="native",
        allocator_config={"expandable_segments": "True", "Bad Key": "x"},
        devices=[],
        events=ProbeEvents(
            lora_loads=[LoraLoad(adapter="sql", rank=16, start=NOW - 5, end=NOW - 4.75, on_demand=True)],
            lora_loads_total=3,
            lora_on_demand_loads_total=1,
            lora_load_seconds_total=1.25,
            lora_on_demand_load_seconds_total=0.25,
            cuda_graph_capture_seconds=4.5,
        ),
    )
    base.update(kw)
    return ProbeDocument(**base)


def write(directory: Path, doc: ProbeDocument, name: str | None = None) -> Path:
    path = directory / (name or document_name(doc.hostname, doc.pid))
    atomic_write(path, doc.model_dump_json().encode())
    return path


def reader(directory: Path, **kw: Any) -> ProbeReader:
    return ProbeReader(directory, clock=lambda: NOW, **kw)


def dead_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def test_a_fresh_document_is_kept(tmp_path: Path) -> None:
    write(tmp_path, document())
    got = reader(tmp_path).read()
    assert [d.pid for d in got.documents] == [os.getpid()]
    assert sum(got.dropped.values()) == 0


def test_drops_each_bad_document_with_its_reason(tmp_path: Path) -> None:
    write(tmp_path, document(hostname="stale", written_at=NOW - 21))  # 3 x 5 s + 5 s grace: stale after 20 s
    write(tmp_path, document(hostname="edge", written_at=NOW - 20))  # not yet stale
    write(tmp_path, document(pid=dead_pid(), start_time_ticks=1, hostname="gone"))
    write(tmp_path, document(hostname="reused", start_time_ticks=(start_time_ticks(os.getpid()) or 0) + 1))
    (tmp_path / "probe-corrupt-1.json").write_bytes(b'{"version": 1, "pid": ')
    (tmp_path / "probe-notdict-1.json").write_text("[1, 2]")
    (tmp_path / "probe-binary-1.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "probe-invalid-1.json").write_text(document().model_dump_json().replace('"vllm-worker"', '"BAD ROLE"'))
    (tmp_path / "probe-future-1.json").write_text('{"version": 2}')
    (tmp_path / "probe-huge-1.json").write_bytes(b" " * (1024 * 1024 + 1))
    (tmp_path / ".probe-node-a-1.json.abc.tmp").write_text("{partial")  # a writer's temporary: ignored
    (tmp_path / "notes.txt").write_text("ignored")
    got = reader(tmp_path).read()
    assert [d.hostname for d in got.documents] == ["edge"]
    assert dict(got.dropped) == {
        "stale": 1,
        "pid_gone": 1,
        "pid_reused": 1,
        "corrupt": 4,
        "version": 1,
        "too_large": 1,
    }


def test_pid_check_is_skipped_in_another_pid_namespace(tmp_path: Path) -> None:
    """From another namespace the pid means nothing here: only staleness retires the document."""
    write(tmp_path, document(pid=dead_pid(), pid_namespace="pid:[1]", hostname="container"))
    write(tmp_path, document(pid=dead_pid(), pid_namespace=None, hostname="unknown-ns"))
    assert len(reader(tmp_path).read().documents) == 2
    write(tmp_path, document(pid=dead_pid(), hostname="here"))
    assert len(reader(tmp_path, proc_root=None).read().documents) == 3  # no /proc at all: check off


def test_the_same_process_twice_keeps_the_newest(tmp_path: Path) -> None:
    write(tmp_path, document(written_at=NOW - 3), name="probe-copy-1.json")
    write(tmp_path, document(written_at=NOW - 1))
    got = reader(tmp_path).read()
    assert [d.written_at for d in got.documents] == [NOW - 1] and dict(got.dropped) == {"duplicate": 1}


def test_dropped_total_counts_each_version_of_a_file_once(tmp_path: Path) -> None:
    bad = tmp_path / "probe-bad-1.json"
    bad.write_text("nope")
    r = reader(tmp_path)
    for _ in range(3):
        assert r.read().dropped["corrupt"] == 1
    assert r.dropped_total["corrupt"] == 1
    bad.write_text("still nope, and longer")
    r.read()
    assert r.dropped_total["corrupt"] == 2
    bad.unlink()
    assert r.read().dropped == {} and r.dropped_total["corrupt"] == 2


def test_many_processes_and_the_cap(tmp_path: Path) -> None:
    for i in range(60):
        write(tmp_path, document(pid_namespace="pid:[7]", pid=1000 + i, hostname=f"pod-{i:02d}"))
    assert len(reader(tmp_path).read().documents) == 60
    got = reader(tmp_path, max_documents=50).read()
    assert len(got.documents) == 50 and got.dropped["too_many"] == 10


def test_missing_directory_is_no_error(tmp_path: Path) -> None:
    got = reader(tmp_path / "absent").read()
    assert got.documents == [] and got.listed


def test_a_reader_never_sees_a_partial_document(tmp_path: Path) -> None:
    big = document(devices=[device(f"GPU-{i}", i) for i in range(8)])
    small = document(devices=[])
    stop = threading.Event()
    path = tmp_path / document_name("node-a", os.getpid())
    bodies = (big.model_dump_json().encode(), small.model_dump_json().encode())

    def writer() -> None:
        n = 0
        while not stop.is_set():
            atomic_write(path, bodies[n % 2])
            n += 1

    atomic_write(path, bodies[0])
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        r = reader(tmp_path)
        for _ in range(300):
            got = r.read()
            assert sum(got.dropped.values()) == 0 and len(got.documents) == 1
            assert len(got.documents[0].devices) in (0, 8)
    finally:
        stop.set()
        thread.join()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporaries left behind


def test_drop_reasons_agree() -> None:
    assert probe_collector.DROP_REASONS == DROP_REASONS


def exporter(directory: Path, collectors: list[str]) -> tuple[GpuExporter, list[str]]:
    state = default_state()
    nvml = Nvml(SimNvml(StaticSource(state), max_age=0.0, clock=lambda: 0.0))
    exp = GpuExporter(
        nvml, backend="sim", collectors=collectors, proc_root=None, probe_dir=str(directory), clock=lambda: NOW
    )
    return exp, [d.uuid for d in state.devices]


def scrape(exp: GpuExporter) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    exp.sample_now()  # the sampler's pass reads the directory; the scrape serves it
    text = exp.scrape().decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names)), "a family repeats: Prometheus would reject the scrape"
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_collector_series_joined_by_uuid(tmp_path: Path) -> None:
    exp, uuids = exporter(tmp_path, ["allocator", "probe"])
    write(tmp_path, document(devices=[device(uuids[0]), device("GPU-not-on-this-node", 1)]))
    (tmp_path / "probe-garbage-9.json").write_text("{")
    got = scrape(exp)
    proc = {"pid": str(os.getpid()), "role": "vllm-worker"}
    joined = frozenset({"gpu": "0", "uuid": uuids[0], "model": "NVIDIA H100 80GB HBM3", **proc}.items())
    other = frozenset({"gpu": "", "uuid": "GPU-not-on-this-node", "model": "NVIDIA H100 80GB HBM3", **proc}.items())
    assert got["loadlens_gpu_allocator_reserved_bytes", joined] == 22 * MIB
    assert got["loadlens_gpu_allocator_reserved_bytes", other] == 22 * MIB
    assert got["loadlens_gpu_allocator_rounding_overhead_bytes", joined] == 3 * MIB
    assert got["loadlens_gpu_allocator_fragmentation_ratio", joined] == pytest.approx(1 - 8 / 13)
    assert got["loadlens_gpu_allocator_alloc_retries_total", joined] == 1
    # The sim allocator's own series stay as they were, in the same (merged) family.
    sim = [k for k in got if k[0] == "loadlens_gpu_allocator_reserved_bytes" and "pid" not in dict(k[1])]
    assert len(sim) == len(uuids)
    pool = joined | {("pool", "large"), ("size_class", "le_20mib")}
    assert got["loadlens_gpu_allocator_pool_segments", frozenset(pool)] == 1
    assert got["loadlens_gpu_allocator_pool_reserved_bytes", frozenset(pool)] == 20 * MIB
    assert got["loadlens_gpu_probe_snapshot_age_seconds", joined] == 10.0
    p = frozenset(proc.items())
    assert got["loadlens_gpu_allocator_config_info", p | {("option", "expandable_segments"), ("value", "True")}] == 1
    assert not [k for k in got if k[0] == "loadlens_gpu_allocator_config_info" and ("option", "Bad Key") in k[1]]
    info = p | {("hostname", "node-a"), ("torch_version", "2.13.0"), ("allocator_backend", "native")}
    assert got["loadlens_gpu_probe_info", frozenset(info)] == 1
    assert got["loadlens_gpu_probe_document_age_seconds", p] == 1.0
    assert got["loadlens_gpu_probe_snapshot_duration_seconds", p] == 0.012
    assert got["loadlens_gpu_probe_snapshot_interval_seconds", p] == 30.0
    assert got["loadlens_gpu_probe_lora_loads_total", p | {("trigger", "on_demand")}] == 1
    assert got["loadlens_gpu_probe_lora_loads_total", p | {("trigger", "preload")}] == 2
    assert got["loadlens_gpu_probe_lora_load_seconds_total", p | {("trigger", "on_demand")}] == 0.25
    assert got["loadlens_gpu_probe_lora_load_seconds_total", p | {("trigger", "preload")}] == 1.0
    assert got["loadlens_gpu_probe_lora_last_load_duration_seconds", p] == 0.25
    assert got["loadlens_gpu_probe_lora_last_load_timestamp_seconds", p] == NOW - 4.75
    assert got["loadlens_gpu_probe_cuda_graph_capture_seconds", p] == 4.5
    assert got["loadlens_gpu_probe_documents", frozenset()] == 1
    for reason in DROP_REASONS:
        want = 1.0 if reason == "corrupt" else 0.0
        assert got["loadlens_gpu_probe_documents_dropped", frozenset({("reason", reason)})] == want
        assert got["loadlens_gpu_probe_documents_dropped_total", frozenset({("reason", reason)})] == want
    assert got["loadlens_gpu_collector_success", frozenset({("collector", "probe")})] == 1


def test_a_process_without_cuda_exports_its_events_and_no_device_series(tmp_path: Path) -> None:
    """vLLM's CPU worker: no devices, no stats or snapshot figures (null), so none of their series."""
    exp, _ = exporter(tmp_path, ["probe"])
    doc = document(
        snapshot_interval_seconds=None,
        snapshot_duration_seconds=None,
        stats_duration_seconds=None,
        allocator_backend="",
        allocator_config={},
        torch_version="2.13.0+cpu",
    )
    write(
        tmp_path, doc.model_copy(update={"events": doc.events.model_copy(update={"cuda_graph_capture_seconds": None})})
    )
    got = scrape(exp)
    p = frozenset({"pid": str(os.getpid()), "role": "vllm-worker"}.items())
    assert {k[0] for k in got if "pid" in dict(k[1])} == {
        "loadlens_gpu_probe_info",
        "loadlens_gpu_probe_document_age_seconds",
        "loadlens_gpu_probe_lora_loads_total",
        "loadlens_gpu_probe_lora_load_seconds_total",
        "loadlens_gpu_probe_lora_last_load_duration_seconds",
        "loadlens_gpu_probe_lora_last_load_timestamp_seconds",
    }
    assert got["loadlens_gpu_probe_lora_loads_total", p | {("trigger", "on_demand")}] == 1
    assert got["loadlens_gpu_probe_lora_last_load_timestamp_seconds", p] == NOW - 4.75
    info = p | {("hostname", "node-a"), ("torch_version", "2.13.0+cpu"), ("allocator_backend", "")}
    assert got["loadlens_gpu_probe_info", frozenset(info)] == 1


def test_unlistable_directory_fails_only_the_collector(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    exp, _ = exporter(blocker, ["memory", "probe"])  # a file, not a directory: listing raises NotADirectoryError
    got = scrape(exp)
    assert got["loadlens_gpu_collector_success", frozenset({("collector", "probe")})] == 0
    assert got["loadlens_gpu_collector_success", frozenset({("collector", "memory")})] == 1


def test_probe_alone_without_documents(tmp_path: Path) -> None:
    exp, _ = exporter(tmp_path, ["probe"])
    got = scrape(exp)
    assert got["loadlens_gpu_probe_documents", frozenset()] == 0
    assert not [k for k in got if k[0] == "loadlens_gpu_allocator_reserved_bytes"]


def test_probe_dir_adds_the_collector_and_probe_needs_a_dir() -> None:
    from exporters.gpu.cli import parse_collectors
    from exporters.gpu.collectors import DEFAULT_COLLECTORS
    from loadlens.util.cliutil import UsageError

    assert parse_collectors("default", False, probe_dir="/run/p") == [*DEFAULT_COLLECTORS, "probe"]
    assert parse_collectors("memory,probe", False, probe_dir="/run/p") == ["memory", "probe"]
    assert "probe" not in parse_collectors("default", False)
    with pytest.raises(UsageError, match="the probe collector needs --probe-dir"):
        parse_collectors("memory,probe", False)


def test_probe_dir_flag_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from exporters.gpu import cli

    monkeypatch.setenv("LOADLENS_GPU_EXPORTER_PROBE_DIR", "/run/loadlens/probes")
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    assert parser.parse_args(["gpu-exporter"]).probe_dir == "/run/loadlens/probes"
    assert parser.parse_args(["gpu-exporter", "--probe-dir", "/x"]).probe_dir == "/x"
