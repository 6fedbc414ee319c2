"""A real Alertmanager for tests (Debian's ``prometheus-alertmanager``): 127.0.0.1, ephemeral port, temp
storage, gossip off, torn down after. Skips with the install command when the binary is missing."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from loadlens.util.net import free_port
from tests.support import required


def require_alertmanager() -> str:
    return required.require_binary(
        "prometheus-alertmanager", "alertmanager", how="apt-get install prometheus-alertmanager (make system-deps)"
    )


class AlertmanagerServer:
    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = Path(workdir)
        self.config = config
        self.binary = require_alertmanager()
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "alertmanager.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> AlertmanagerServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "alertmanager.yml"
        config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.port = free_port()
        args = [
            self.binary,
            f"--config.file={config_file}",
            f"--storage.path={self.workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip port on 0.0.0.0:9094
        ]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError(f"alertmanager did not start:\n{self.log_path.read_text()[-2000:]}")

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        req = urllib.request.Request(
            self.url + "/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as resp:
            return list(json.loads(resp.read()))
