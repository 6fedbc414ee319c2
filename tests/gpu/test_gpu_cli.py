"""``loadlens gpu-exporter``: flags, usage errors, and the real process scraped by a real Prometheus."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from exporters.gpu.cli import DEFAULT_SIM_URL, build_backend, parse_collectors
from exporters.gpu.collectors import DEFAULT_COLLECTORS
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import FileSource, HttpSource
from loadlens.cli import build_parser, main
from loadlens.util.cliutil import UsageError
from tests.gpu.golden import DOCUMENT
from tests.support.paths import ROOT
from tests.support.prometheus import PrometheusServer, free_port, require_prometheus

REPO = ROOT


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags read LOADLENS_* variables; a developer's or CI's must not leak into these tests."""
    for name in [n for n in os.environ if n.startswith("LOADLENS_")]:
        monkeypatch.delenv(name)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["gpu-exporter", *argv])


def test_defaults() -> None:
    args = parse()
    assert (args.backend, args.sim_url, args.host, args.port) == ("auto", DEFAULT_SIM_URL, "127.0.0.1", 9400)
    assert (args.sample_interval, args.window, args.collectors, args.dcgm_compat) == (0.1, 30.0, "default", False)
    assert (args.max_processes, args.memory_step_bytes, args.log_level, args.sim_faults) == (128, 2097152, "info", None)


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADLENS_GPU_EXPORTER_BACKEND", "sim")
    monkeypatch.setenv("LOADLENS_GPU_EXPORTER_WINDOW", "12.5")
    monkeypatch.setenv("LOADLENS_GPU_EXPORTER_DCGM_COMPAT", "true")
    monkeypatch.setenv("LOADLENS_GPU_EXPORTER_SIM_FAULTS", "lost:1@5")
    args = parse()
    assert (args.backend, args.window, args.dcgm_compat, args.sim_faults) == ("sim", 12.5, True, "lost:1@5")
    assert parse("--window", "3").window == 3.0  # flags win


@pytest.mark.parametrize(
    ("text", "dcgm", "expected"),
    [
        ("default", False, list(DEFAULT_COLLECTORS)),
        ("default,pcie", True, [*DEFAULT_COLLECTORS, "pcie", "dcgm"]),
        ("memory, memory ,power", False, ["memory", "power"]),
    ],
)
def test_parse_collectors(text: str, dcgm: bool, expected: list[str]) -> None:
    assert parse_collectors(text, dcgm) == expected


@pytest.mark.parametrize(("text", "message"), [("fans", "unknown collector 'fans'"), (" , ", "selects nothing")])
def test_parse_collectors_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_collectors(text, False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "sim", "--sim-faults", "explode:1"], "--sim-faults: 'explode:1': unknown fault"),
        (["--backend", "nvml", "--sim-faults", "lost:0@1"], "needs the sim backend"),
        (["--backend", "sim", "--window", "0.1", "--sample-interval", "0.5"], "must be longer than"),
        (["--collectors", "fans"], "unknown collector"),
        (["--backend", "sim", "--sim-url", "https://x/sim/device-state"], "https is not supported"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu-exporter", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loadlens gpu-exporter: error: ")
    assert message in err
    assert err.count("\n") == 1  # one line


def test_bad_flag_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["gpu-exporter", "--port", "70000"])
    assert info.value.code == 2
    assert "port out of range" in capsys.readouterr().err


def test_port_in_use_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        argv = ["gpu-exporter", "--backend", "sim", "--sim-url", str(DOCUMENT), "--port", str(port)]
        assert main(argv) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_auto_backend_falls_back_to_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    nvml, backend = build_backend(build_parser().parse_args(["gpu-exporter", "--sim-url", str(DOCUMENT)]))
    assert backend == "sim"
    assert isinstance(nvml.api, SimNvml)
    assert isinstance(nvml.api.source, FileSource)


def test_auto_backend_prefers_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    nvml, backend = build_backend(build_parser().parse_args(["gpu-exporter"]))
    assert backend == "nvml"
    assert nvml.api is pynvml


def test_sim_url_http() -> None:
    nvml, backend = build_backend(build_parser().parse_args(["gpu-exporter", "--backend", "sim"]))
    assert backend == "sim"
    assert isinstance(nvml.api.source, HttpSource)
    assert nvml.api.source.url == DEFAULT_SIM_URL


# --- the real thing: a separate exporter process scraped by a real Prometheus ------------------------------


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def exporter_process(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = free_port()
    log = open(tmp_path / "exporter.log", "wb")  # noqa: SIM115 (closed in the finally below)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADLENS_")} | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "loadlens.cli", "gpu-exporter",
            "--backend", "sim", "--sim-url", str(DOCUMENT), "--host", "127.0.0.1", "--port", str(port),
            "--sim-faults", "unsupported:power:1", "--dcgm-compat",
        ],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
            try:
                if http_get(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            pytest.fail("exporter did not become healthy:\n" + (tmp_path / "exporter.log").read_text())
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()


@pytest.mark.slow
def test_real_process_scraped_by_real_prometheus(
    tmp_path: Path, exporter_process: tuple[int, subprocess.Popen[bytes]]
) -> None:
    require_prometheus()
    port, proc = exporter_process
    status, body = http_get(f"http://127.0.0.1:{port}/health")
    assert json.loads(body)["status"] == "ok"
    with PrometheusServer(tmp_path / "prom", targets={"gpu": [f"127.0.0.1:{port}"]}) as prom:
        prom.wait_for_up("gpu")
        used = prom.wait_for_value('loadlens_gpu_memory_used_bytes{job="gpu",gpu="1"}')
        doc = json.loads(DOCUMENT.read_text())
        assert used == doc["devices"][1]["memory_used_bytes"]
        assert prom.wait_for_value('loadlens_gpu_utilization_window_mean_ratio{gpu="0"}') == pytest.approx(0.68)
        assert prom.wait_for_value('loadlens_gpu_allocator_fragmentation_ratio{gpu="1"}') == 0.75
        assert prom.wait_for_value('DCGM_FI_DEV_GPU_UTIL{gpu="0"}') == 62.0
        assert prom.wait_for_value("loadlens_gpu_nvml_up") == 1
        assert prom.wait_for_value("count(loadlens_gpu_info)") == 2
        # --sim-faults reached the process: GPU 1's power is absent, not 0; nothing counts as failed.
        assert prom.wait_for_value("count(loadlens_gpu_power_watts)") == 1
        assert prom.wait_for_value("min(loadlens_gpu_collector_success)") == 1
        assert prom.wait_for_value("count(loadlens_gpu_collector_success)") == len(DEFAULT_COLLECTORS) + 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


# Blocks the imports a GPU node's lean install would not have, then runs `python -m exporters.gpu`.
_LEAN = """
import importlib.abc, runpy, sys
BLOCKED = {"fastapi", "uvicorn", "starlette", "pydantic", "locust", "gevent", "opentelemetry", "hdrh", "httpx"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["exporters.gpu", *sys.argv[1:]]
runpy.run_module("exporters.gpu", run_name="__main__")
"""


def test_lean_entry_point_runs_the_nvml_backend_without_the_rest_of_loadlens() -> None:
    # free_port, not bind(port 0) and close: a port of the kernel's ephemeral range can become another process's
    # outgoing connection before the exporter binds it ("Address already in use", exit 2).
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEAN, "--backend", "nvml", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        status = None
        while time.monotonic() < deadline and status is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                status = 200
            except urllib.error.HTTPError as err:
                status = err.code
            except OSError:
                time.sleep(0.1)
        # No GPU here: NVML does not load, /health says 503, and /metrics still answers with nvml_up 0.
        assert status == 503
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        assert "loadlens_gpu_nvml_up 0.0" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "blocked" not in err


def test_lean_entry_point_reports_usage_errors_in_its_own_name() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporters.gpu", "--port", "99999"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "python -m exporters.gpu: error: argument --port: port out of range 0-65535: 99999"
    )
