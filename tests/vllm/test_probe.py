"""loadlens's plugin and probe inside the real vLLM's CPU worker (issue 22, item 3): every hook applies to vLLM
0.32 and says so at start-up; the worker, without CUDA, publishes a probe document without devices; LoRA loads
(explicit and on demand, from storage and from vLLM's CPU cache) are recorded as vLLM did them, by adapter, and
reach the GPU exporter's probe collector.

vLLM's own account of its loads is its log (``tests/support/vllm_server.lora_slot_fills``: the session server
logs ``vllm.lora.model_manager`` at DEBUG), independent of the plugin's hooks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from loadlens.contracts.probe_document import LoraLoad, ProbeDocument
from loadlens.util.probe_directory import ProbeReader
from tests.gpu.helpers import default_state
from tests.support import vllm_server as rig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

APPLIED = {
    ("lora_load", "vllm.lora.worker_manager"),
    ("cuda_graph_capture", "vllm.v1.worker.gpu_model_runner"),
    ("cuda_graph_capture", "vllm.v1.worker.gpu.model_runner"),
    ("busy_timeline", "vllm.v1.worker.gpu_model_runner"),
    ("busy_timeline", "vllm.v1.worker.gpu.model_runner"),
    ("worker_probe", "vllm.v1.worker.gpu_worker"),
    ("worker_probe", "vllm.v1.worker.cpu_worker"),
}
"""Every hook of exporters/vllm_plugin/hooks.py: vLLM 0.32's CPU build imports all their modules in its worker."""


def plugin_lines(server: rig.VllmServer) -> list[tuple[str, str]]:
    """(level, message) of the plugin's lines in vLLM's log."""
    text = server.log_path.read_text(encoding="utf-8", errors="replace")
    return [
        (line.split(" ", 1)[0], line.split("] ", 1)[1])
        for line in text.splitlines()
        if "] loadlens vllm plugin: " in line
    ]


def the_document(directory: Path) -> ProbeDocument:
    result = ProbeReader(directory).read()
    assert len(result.documents) == 1, (result.documents, result.dropped)
    return result.documents[0]


def wait_for(directory: Path, loads_total: int, timeout_s: float = 30.0) -> ProbeDocument:
    """The document once it holds ``loads_total`` loads (the probe publishes within ~50 ms of a load)."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = the_document(directory)
        if doc.events.lora_loads_total >= loads_total or time.monotonic() > deadline:
            return doc
        time.sleep(0.1)


def test_every_hook_applies_to_vllm_0_32_and_says_so_once(vllm_server: rig.VllmServer) -> None:
    lines = plugin_lines(vllm_server)
    assert {level for level, _ in lines} == {"INFO"}  # no refusal, no failure
    applied = [message for _, message in lines if " applied to " in message]
    assert len(applied) == len(APPLIED)  # one line each
    assert {(line.split()[4], line.split()[7]) for line in applied} == APPLIED
    assert all(line.endswith("(vLLM 0.32.0)") for line in applied)
    assert [m for _, m in lines if " applied to " not in m] == [
        "loadlens vllm plugin: probe started in worker process (no CUDA)"
    ]


def test_the_cpu_worker_publishes_a_document_without_devices(vllm_server: rig.VllmServer, vllm_probe_dir: Path) -> None:
    doc = the_document(vllm_probe_dir)  # kept by the GPU exporter's reader: fresh, its pid alive and not reused
    assert doc.role == "vllm-worker" and doc.pid != vllm_server.pid  # the engine core's worker, not the API server
    assert doc.devices == [] and doc.allocator_backend == "" and doc.torch_version == "2.13.0+cpu"
    assert doc.stats_duration_seconds is None and doc.snapshot_interval_seconds is None
    assert doc.snapshot_duration_seconds is None and doc.events.cuda_graph_capture_seconds is None


def _load(client: httpx.Client, server: rig.VllmServer, name: str, rank: int) -> None:
    body = {"lora_name": name, "lora_path": str(server.model.adapters[f"r{rank}"])}
    answer = client.post("/v1/load_lora_adapter", json=body)
    assert answer.status_code == 200, answer.text


def _complete(client: httpx.Client, model: str) -> None:
    body = {"model": model, "prompt": "Load tests", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text


def _exporter_samples(directory: Path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    nvml = Nvml(SimNvml(StaticSource(default_state()), max_age=0.0, clock=lambda: 0.0))
    exporter = GpuExporter(nvml, backend="sim", collectors=["probe"], proc_root=None, probe_dir=str(directory))
    exporter.sample_now()  # the sampler's pass reads the directory; the scrape serves it
    text = exporter.scrape().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_lora_loads_of_every_kind_are_recorded_as_vllm_did_them(
    vllm_server: rig.VllmServer, vllm_probe_dir: Path
) -> None:
    """With ``--max-loras 1 --max-cpu-loras 3``: three explicit loads (read from storage); two requests for
    adapters that lost the GPU slot (back from the CPU cache, on demand); a fourth explicit load evicts the
    least recently used adapter from the CPU cache, so the request for it reads it again (storage, on demand)."""
    before = the_document(vllm_probe_dir).events.lora_loads_total
    log_offset = len(vllm_server.log_path.read_text(encoding="utf-8", errors="replace"))
    tag = f"probe{os.getpid()}"  # names no other test of the session uses
    names = [f"{tag}-r{rank}" for rank in (2, 8, 32)] + [f"{tag}-r2b"]
    with httpx.Client(base_url=vllm_server.url, timeout=120) as client, rig.adapters_unloaded(client, names):
        for rank in (2, 8, 32):
            _load(client, vllm_server, f"{tag}-r{rank}", rank)
        _complete(client, f"{tag}-r2")
        _complete(client, f"{tag}-r8")
        _load(client, vllm_server, f"{tag}-r2b", 2)
        _complete(client, f"{tag}-r32")
    expected = [
        (f"{tag}-r2", 2, False, "storage"),
        (f"{tag}-r8", 8, False, "storage"),
        (f"{tag}-r32", 32, False, "storage"),
        (f"{tag}-r2", 2, True, "cpu_cache"),
        (f"{tag}-r8", 8, True, "cpu_cache"),
        (f"{tag}-r2b", 2, False, "storage"),
        (f"{tag}-r32", 32, True, "storage"),
    ]
    doc = wait_for(vllm_probe_dir, before + len(expected))
    assert doc.events.lora_loads_total == before + len(expected)
    new: list[LoraLoad] = doc.events.lora_loads[-len(expected) :]
    assert [(e.adapter, e.rank, e.on_demand, e.source) for e in new] == expected
    assert all(e.start <= e.end for e in new)

    # vLLM's own log: the same slot fills in the same order, the same source each, one int id per adapter name.
    fills = rig.lora_slot_fills(vllm_server.log_path.read_text(encoding="utf-8", errors="replace")[log_offset:])
    assert [source for _, source in fills] == [source for *_, source in expected]
    ids = {name: lora_id for (name, *_), (lora_id, _) in zip(expected, fills, strict=True)}
    assert [ids[name] for name, *_ in expected] == [lora_id for lora_id, _ in fills]
    assert len(set(ids.values())) == len(ids) == 4

    # The GPU exporter's probe collector reads the same document: the worker's loads by trigger, no device series.
    got = _exporter_samples(vllm_probe_dir)
    proc = {("pid", str(doc.pid)), ("role", "vllm-worker")}
    ev = doc.events
    assert got["loadlens_gpu_probe_lora_loads_total", frozenset(proc | {("trigger", "on_demand")})] == float(
        ev.lora_on_demand_loads_total
    )
    assert got["loadlens_gpu_probe_lora_loads_total", frozenset(proc | {("trigger", "preload")})] == float(
        ev.lora_loads_total - ev.lora_on_demand_loads_total
    )
    assert got["loadlens_gpu_probe_lora_last_load_timestamp_seconds", frozenset(proc)] == new[-1].end
    assert not [k for k in got if k[0].startswith("loadlens_gpu_allocator_")]
    assert got["loadlens_gpu_probe_documents", frozenset()] == 1.0
