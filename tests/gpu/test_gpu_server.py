"""The exporter's HTTP surface, in process: /metrics, /health, content negotiation, assembly."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from exporters.gpu.collectors import DEFAULT_COLLECTORS
from exporters.gpu.faults import parse_faults
from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter, MetricsServer
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from tests.gpu.helpers import default_state


def serve(exporter: GpuExporter) -> Iterator[str]:
    server = MetricsServer(exporter, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        exporter.stop()


@pytest.fixture
def source() -> StaticSource:
    return StaticSource(default_state())


@pytest.fixture
def base_url(source: StaticSource) -> Iterator[str]:
    exporter = GpuExporter(Nvml(SimNvml(source, max_age=0.0)), backend="sim", proc_root=None)
    exporter.sampler.tick()
    yield from serve(exporter)


def get(url: str, accept: str = "") -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_metrics(base_url: str) -> None:
    status, ctype, body = get(f"{base_url}/metrics")
    assert status == 200
    assert ctype.startswith("text/plain; version=0.0.4")
    assert "loadlens_gpu_nvml_up 1.0" in body
    for name in DEFAULT_COLLECTORS:
        assert f'loadlens_gpu_collector_success{{collector="{name}"}} 1.0' in body
    assert "DCGM_FI_DEV_GPU_UTIL" not in body  # opt-in


def test_metrics_openmetrics(base_url: str) -> None:
    status, ctype, body = get(f"{base_url}/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert (status, ctype) == (200, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert body.endswith("# EOF\n")
    assert "loadlens_gpu_nvml_up 1.0" in body


def test_prometheus_scrape_header_gets_the_fast_text_format(base_url: str) -> None:
    """Prometheus accepts both; without exemplars the exporter answers text, from its fast encoder."""
    accept = "application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
    status, ctype, body = get(f"{base_url}/metrics", accept=accept)
    assert (status, ctype) == (200, "text/plain; version=0.0.4; charset=utf-8")
    assert "# EOF" not in body and "loadlens_gpu_nvml_up 1.0" in body


def test_health_ok(base_url: str) -> None:
    status, ctype, body = get(f"{base_url}/health")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body) == {
        "status": "ok",
        "backend": "sim",
        "nvml_up": True,
        "devices": 2,
        "lost_devices": [],
        "last_init_error": "",
        "last_init_detail": "",
    }


def test_index_and_not_found(base_url: str) -> None:
    assert get(f"{base_url}/")[0] == 200
    assert get(f"{base_url}/nope")[0] == 404


def test_nvml_down_metrics_200_health_503(source: StaticSource) -> None:
    source.fail = OSError("engine not running")
    exporter = GpuExporter(Nvml(SimNvml(source)), backend="sim", proc_root=None)
    exporter.sample_now()
    for url in serve(exporter):
        status, _, body = get(f"{url}/metrics")
        assert status == 200  # health series still reach Prometheus
        assert "loadlens_gpu_nvml_up 0.0" in body
        assert 'loadlens_gpu_collector_success{collector="memory"} 0.0' in body
        assert "loadlens_gpu_nvml_init_failures_total 1.0" in body
        status, _, body = get(f"{url}/health")
        assert status == 503
        doc = json.loads(body)
        # The sim backend's own failure, named and worded as such (not as NVML's DriverNotLoaded).
        assert doc["last_init_error"] == "SimDocumentUnavailable"
        assert doc["last_init_detail"] == "sim backend: cannot read the device-state document: engine not running"


def test_degraded_health_when_a_gpu_is_lost() -> None:
    sim = SimNvml(StaticSource(default_state()), faults=parse_faults("lost:1@0"), max_age=0.0)
    exporter = GpuExporter(Nvml(sim), backend="sim", proc_root=None)
    exporter.sample_now()
    for url in serve(exporter):
        status, _, body = get(f"{url}/metrics")
        assert status == 200
        assert 'loadlens_gpu_device_up{gpu="1"' in body
        status, _, body = get(f"{url}/health")
        assert status == 200
        doc = json.loads(body)
        assert (doc["status"], doc["lost_devices"]) == ("degraded", [1])


def test_unknown_collector_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown collectors"):
        GpuExporter(Nvml(SimNvml(StaticSource(default_state()))), backend="sim", collectors=["nope"])


def test_start_runs_the_sampler(source: StaticSource) -> None:
    exporter = GpuExporter(Nvml(SimNvml(source)), backend="sim", sample_interval=0.01, proc_root=None)
    exporter.start()
    try:
        deadline = time.monotonic() + 30.0  # bounds a failure only: a loaded machine may take a while
        while exporter.sampler.ticks_total < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert exporter.sampler.ticks_total >= 2
    finally:
        exporter.stop()
    assert not exporter.session.up


def test_metrics_connections_send_without_nagle(source: StaticSource, monkeypatch: pytest.MonkeyPatch) -> None:
    # Headers and body are two writes: with Nagle on a kept-alive connection the body waits for the client's
    # delayed ACK (40 ms). The handler's socket must have TCP_NODELAY.
    import socket

    from exporters.gpu import server as server_module

    seen: list[int] = []
    original = server_module._Handler.do_GET

    def recording(self: server_module._Handler) -> None:
        seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        original(self)

    monkeypatch.setattr(server_module._Handler, "do_GET", recording)
    exporter = GpuExporter(Nvml(SimNvml(source, max_age=0.0)), backend="sim", proc_root=None)
    exporter.sample_now()
    for url in serve(exporter):
        assert get(f"{url}/metrics")[0] == 200
    assert len(seen) == 1 and seen[0] != 0
