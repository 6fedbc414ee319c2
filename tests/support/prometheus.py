"""A real Prometheus server for tests: 127.0.0.1, ephemeral port, temp config and TSDB, torn down after.

Reusable by any test that needs to check what Prometheus actually scrapes::

    from tests.support.prometheus import PrometheusServer, require_prometheus

    def test_scraped(tmp_path):
        require_prometheus()                     # skips (fails under CI) when the binary is missing
        with PrometheusServer(tmp_path, targets={"gpu": ["127.0.0.1:9400"]}) as prom:
            prom.wait_for_up("gpu")
            value = prom.wait_for_value('loadlens_gpu_nvml_up{job="gpu"}')

The Debian package installs ``/usr/bin/prometheus`` (``apt-get install prometheus``; see
scripts/system-deps.sh); ``LOADLENS_PROMETHEUS`` overrides the binary. Scrape and evaluation intervals
default to 1 s so tests finish quickly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from loadlens.util.net import free_port
from tests.support import required

ENV_BINARY = "LOADLENS_PROMETHEUS"

__all__ = [
    "PrometheusError",
    "PrometheusServer",
    "free_port",
    "prometheus_binary",
    "prometheus_on_openmetrics",
    "require_prometheus",
]


def prometheus_binary() -> str | None:
    return os.environ.get(ENV_BINARY) or shutil.which("prometheus")


def require_prometheus() -> str:
    """The binary's path; else the calling test skips saying how to get it (fails under CI: support/required.py)."""
    return required.require_binary(
        "prometheus", how="apt-get install prometheus (make system-deps), or set LOADLENS_PROMETHEUS", env=ENV_BINARY
    )


class PrometheusError(RuntimeError):
    pass


class PrometheusServer:
    """Context manager around one Prometheus process; see the module docstring."""

    def __init__(
        self,
        workdir: Path,
        *,
        targets: Mapping[str, Sequence[str]] | None = None,
        scrape_interval: str = "1s",
        extra_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        startup_timeout: float = 15.0,
        tsdb_path: Path | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.binary = binary or require_prometheus()
        self.targets = dict(targets or {})
        self.scrape_interval = scrape_interval
        self.extra_config = dict(extra_config or {})
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        # An existing TSDB to serve (e.g. blocks from `promtool tsdb create-blocks-from`); default: a fresh one.
        self.tsdb_path = tsdb_path
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [
                {"job_name": job, "scrape_interval": self.scrape_interval, "static_configs": [{"targets": list(t)}]}
                for job, t in self.targets.items()
            ],
        }
        cfg.update(self.extra_config)
        return cfg

    def start(self) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        for _attempt in range(3):  # the free port can be taken between free_port() and bind
            self.port = free_port()
            tsdb = self.tsdb_path or self.workdir / f"tsdb-{self.port}"
            args = [
                self.binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                *self.extra_args,
            ]
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            if self._wait_ready():
                return self
            self.stop()
        raise PrometheusError(f"prometheus did not become ready; log:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    # --- HTTP API ---

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as resp:
            doc = json.loads(resp.read())
        if doc.get("status") != "success":
            raise PrometheusError(f"{path}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector result of ``expr``: a list of {"metric": {...}, "value": [ts, "v"]}."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets_health(self) -> dict[str, str]:
        """job -> health of its (first) active target: "up", "down" or "unknown"."""
        data = self.api("targets", state="active")
        return {t["labels"]["job"]: t["health"] for t in data["activeTargets"]}

    def wait_for_up(self, job: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        health = "unknown"
        while time.monotonic() < deadline:
            health = self.targets_health().get(job, "unknown")
            if health == "up":
                return
            time.sleep(0.2)
        raise PrometheusError(f"target {job} is {health} after {timeout} s; log:\n{self.log_tail()}")

    def wait_for_value(self, expr: str, timeout: float = 15.0) -> float:
        """The value of a single-series ``expr`` once Prometheus has one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if len(result) == 1:
                return float(result[0]["value"][1])
            if len(result) > 1:
                raise PrometheusError(f"{expr!r} matched {len(result)} series")
            time.sleep(0.2)
        raise PrometheusError(f"no value for {expr!r} after {timeout} s")


@contextmanager
def prometheus_on_openmetrics(work: Path, text: str) -> Iterator[PrometheusServer]:
    """A Prometheus serving a recorded OpenMetrics text (samples with timestamps) as its TSDB, through
    ``promtool tsdb create-blocks-from openmetrics``; skips (fails under CI) without prometheus or promtool."""
    require_prometheus()
    promtool = required.promtool()
    work.mkdir(parents=True, exist_ok=True)
    recording = work / "recording.om"
    recording.write_text(text)
    tsdb = work / "tsdb"
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(recording), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with PrometheusServer(work, tsdb_path=tsdb) as prom:
        yield prom
