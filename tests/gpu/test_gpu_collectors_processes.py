from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from exporters.gpu.collectors.processes import ProcessesCollector
from exporters.gpu.procinfo import ProcessResolver
from tests.gpu.helpers import MakeRig, Scraped, SimRig, default_state

UUID0 = "GPU-5e1f0000-0000-4000-8000-000000000000"
MODEL = "NVIDIA H100 80GB HBM3"


def proc_labels(pid: int, name: str, container: str = "", pod: str = "") -> frozenset[tuple[str, str]]:
    return frozenset(
        {
            ("gpu", "0"),
            ("uuid", UUID0),
            ("model", MODEL),
            ("pid", str(pid)),
            ("process_name", name),
            ("container_id", container),
            ("pod_uid", pod),
        }
    )


def gpu0(series: dict[frozenset[tuple[str, str]], float]) -> dict[frozenset[tuple[str, str]], float]:
    return {k: v for k, v in series.items() if ("gpu", "0") in k}


def test_per_process_memory(rig: SimRig, registry: CollectorRegistry) -> None:
    ProcessesCollector(rig.session, resolver=ProcessResolver(None), registry=registry)
    got = Scraped(registry)
    procs = rig.source.state.devices[0].processes
    assert gpu0(got.series("loadlens_gpu_process_used_memory_bytes")) == {
        proc_labels(p.pid, p.name): float(p.used_bytes) for p in procs
    }
    assert got.get("loadlens_gpu_processes", {"gpu": "0", "uuid": UUID0, "model": MODEL}) == 3


def test_overflow_is_summed(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(default_state(n_gpus=1, n_processes=5))
    ProcessesCollector(rig.session, max_processes=2, resolver=ProcessResolver(None), registry=registry)
    got = Scraped(registry)
    procs = sorted(rig.source.state.devices[0].processes, key=lambda p: (-p.used_bytes, p.pid))
    series = got.series("loadlens_gpu_process_used_memory_bytes")
    assert len(series) == 3
    other = frozenset(
        {("gpu", "0"), ("uuid", UUID0), ("model", MODEL), ("pid", "other"), ("process_name", "other")}
        | {("container_id", ""), ("pod_uid", "")}
    )
    assert series[other] == float(sum(p.used_bytes for p in procs[2:]))
    assert {dict(k)["pid"] for k in series} == {str(procs[0].pid), str(procs[1].pid), "other"}
    assert got.get("loadlens_gpu_processes", {"gpu": "0", "uuid": UUID0, "model": MODEL}) == 5


def test_process_churn_never_fails_the_scrape(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="process-churn:0")
    ProcessesCollector(rig.session, resolver=ProcessResolver(None), registry=registry)
    first = Scraped(registry)
    # All three listed; the last one exited before its name was looked up: no name, memory still reported.
    assert gpu0(first.series("loadlens_gpu_process_used_memory_bytes")).keys() == {
        proc_labels(10000, "python3 -m vllm.entrypoints.openai.api_server"),
        proc_labels(10001, "python3 worker-1"),
        proc_labels(10002, ""),
    }
    second = Scraped(registry)
    assert gpu0(second.series("loadlens_gpu_process_used_memory_bytes")).keys() == {
        proc_labels(10000, "python3 -m vllm.entrypoints.openai.api_server")
    }
    assert second.get("loadlens_gpu_processes", {"gpu": "0", "uuid": UUID0, "model": MODEL}) == 1
    assert second.get("loadlens_gpu_collector_success", {"collector": "processes"}) == 1
    assert second.series("loadlens_gpu_nvml_errors_total") == {}


def test_container_and_pod_from_cgroup(rig: SimRig, registry: CollectorRegistry, tmp_path: Path) -> None:
    cid = "4f" * 32
    (tmp_path / "10000").mkdir()
    (tmp_path / "10000" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0d4e2c1a_9f3b_4c5d_8e7f_a1b2c3d4e5f6"
        f".slice/cri-containerd-{cid}.scope\n"
    )
    ProcessesCollector(rig.session, resolver=ProcessResolver(tmp_path), registry=registry)
    got = Scraped(registry)
    key = proc_labels(
        10000, "python3 -m vllm.entrypoints.openai.api_server", cid, "0d4e2c1a-9f3b-4c5d-8e7f-a1b2c3d4e5f6"
    )
    assert key in got.series("loadlens_gpu_process_used_memory_bytes")


def test_unsupported_processes_are_absent(make_rig: MakeRig, registry: CollectorRegistry) -> None:
    rig = make_rig(faults="unsupported:processes:0")
    ProcessesCollector(rig.session, resolver=ProcessResolver(None), registry=registry)
    got = Scraped(registry)
    assert gpu0(got.series("loadlens_gpu_process_used_memory_bytes")) == {}
    assert len(got.series("loadlens_gpu_processes")) == 1  # GPU 1 only
