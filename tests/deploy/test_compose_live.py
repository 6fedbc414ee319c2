"""docker-compose.yml's sim profile, run: its loadlens services start with their compose configuration on an
emulated compose network, the healthchecks pass, Prometheus (generated config) scrapes every job, load flows
from the Locust workers, and the fire drill (LOADLENS_SIM_FAULTS) pages through the generated rules and
Alertmanager config. Set-up: tests/support/compose_run.py. Needs root, prometheus and prometheus-alertmanager;
outside CI it skips without them, and under CI it fails instead.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from exporters.stack.config import PORTS
from tests.support import compose_run, netns

T = TypeVar("T")
JOBS = {p.job for p in PORTS if p.job is not None}
# What `LOADLENS_SIM_FAULTS=xid:0:79@30 docker compose --profile sim up` would be given.
ENV = {"LOADLENS_SIM_FAULTS": "xid:0:79@30", "GF_ADMIN_PASSWORD": "unused-here"}


def _wait(what: str, check: Callable[[], T | None], timeout: float, sandbox: netns.Sandbox) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (OSError, httpx.HTTPError, ValueError, KeyError) as err:
            result, last = None, err
        if result:
            return result
        time.sleep(1.0)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\n{sandbox.logs()}")


@pytest.mark.timeout(300)
def test_sim_profile_runs_is_scraped_and_the_fire_drill_pages(tmp_path: Path) -> None:
    reason = netns.available("prometheus", "prometheus-alertmanager")
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"cannot emulate the compose network: {reason}")
        pytest.skip(reason)
    services = compose_run.active_services("sim")
    with compose_run.run_profile("sim", tmp_path / "run", ENV) as sandbox:
        # Every healthcheck of a service that runs here passes.
        checked = []
        running = set(_running(sandbox))
        for name, svc in services.items():
            url = compose_run.healthcheck_url(svc)
            if url is None or not ({name, f"{name}-0"} & running):
                continue
            port, path = int(url.split(":")[2].split("/")[0]), "/" + url.split("/", 3)[3]
            healthy = lambda port=port, path=path: sandbox.get(port, path).status_code == 200  # noqa: E731
            _wait(f"{name} healthy ({url})", healthy, 60, sandbox)
            checked.append(name)
        assert set(checked) == {"serve-sim", "gpu-exporter-sim", "prometheus", "alertmanager", "pager", "locust-master"}

        _wait("2 Locust workers", lambda: len(sandbox.get(8089, "/stats/requests").json()["workers"]) == 2, 60, sandbox)

        def jobs_up() -> set[str] | None:
            up = {r["metric"]["job"] for r in sandbox.query("up == 1")}
            return up if up >= JOBS else None

        assert _wait("every job of the ports table up", jobs_up, 60, sandbox) == JOBS
        # Down: the Collector's metrics (no Collector binary here). Absent: vLLM (profile gpu only).
        assert {r["metric"]["job"] for r in sandbox.query("up == 0")} == {"otel-collector"}
        _wait(
            "requests counted by serve",
            lambda: sandbox.query('sum(loadlens_requests_total{job="loadlens-serve",code="200"}) > 0'),
            90,
            sandbox,
        )
        _wait("spans exported to otel-collector:4318", lambda: sandbox.otlp_exports() > 0, 30, sandbox)

        pages = sandbox.workdir / "volumes" / "pager-data" / "pages.jsonl"

        def paged() -> dict[str, Any] | None:
            for line in pages.read_text().splitlines() if pages.exists() else []:
                note = json.loads(line)
                for alert in note["alerts"]:
                    if alert["labels"]["alertname"] == "LoadlensGpuXidError" and alert["status"] == "firing":
                        return {"receiver": note["receiver"], **alert}
            return None

        page = _wait("the fire-drill page", paged, 120, sandbox)
        assert page["receiver"] == "pager"
        assert page["labels"]["severity"] == "critical"
        assert page["labels"]["job"] == "loadlens-gpu"
        assert page["labels"]["instance"] == "gpu-exporter:9400"
        restarts = sandbox.restarts()
        assert {n: k for n, k in restarts.items() if k and n != "locust-master"} == {}, restarts


def _running(sandbox: netns.Sandbox) -> list[str]:
    spec = json.loads((sandbox.workdir / "spec.json").read_text())
    return [p["name"] for p in spec["processes"]]
