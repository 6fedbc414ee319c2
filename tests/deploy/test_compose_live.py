"""docker-compose.yml's sim profile, run: its loadlens services start with their compose configuration on an
emulated compose network, the healthchecks pass, Prometheus (generated config) scrapes every job, load flows
from the Locust workers, and the fire drill (LOADLENS_SIM_FAULTS) pages through the generated rules and
Alertmanager config. Set-up: tests/support/compose_run.py. Needs root, prometheus and prometheus-alertmanager;
outside CI it skips without them, and under CI it fails instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadlens.contracts.ports import PORTS
from tests.support import compose_run, netns, required

pytestmark = pytest.mark.slow  # whole emulated stacks in network namespaces: tens of seconds each

JOBS = {p.job for p in PORTS if p.job is not None}
# What `LOADLENS_SIM_FAULTS=xid:0:79@30 docker compose --profile sim up` would be given.
ENV = {"LOADLENS_SIM_FAULTS": "xid:0:79@30", "GF_ADMIN_PASSWORD": "unused-here"}


@pytest.mark.timeout(300)
def test_sim_profile_runs_is_scraped_and_the_fire_drill_pages(tmp_path: Path) -> None:
    reason = netns.available("prometheus", "prometheus-alertmanager")
    if reason is not None:
        required.unavailable(f"cannot emulate the compose network: {reason}")
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
            sandbox.wait(f"{name} healthy ({url})", healthy, 60)
            checked.append(name)
        assert set(checked) == {"serve-sim", "gpu-exporter-sim", "prometheus", "alertmanager", "pager", "locust-master"}

        sandbox.wait("2 Locust workers", lambda: len(sandbox.get(8089, "/stats/requests").json()["workers"]) == 2, 60)

        def jobs_up() -> set[str] | None:
            up = {r["metric"]["job"] for r in sandbox.query("up == 1")}
            return up if up >= JOBS else None

        assert sandbox.wait("every job of the ports table up", jobs_up, 60) == JOBS
        # Down: the Collector's metrics (no Collector binary here). Absent: vLLM (profile gpu only).
        down = sandbox.wait("the collector's target scraped", lambda: sandbox.query('up{job="otel-collector"}'), 30)
        assert [r["value"][1] for r in down] == ["0"]
        assert {r["metric"]["job"] for r in sandbox.query("up == 0")} == {"otel-collector"}
        sandbox.wait(
            "requests counted by serve",
            lambda: sandbox.query('sum(loadlens_requests_total{job="loadlens-serve",code="200"}) > 0'),
            90,
        )
        sandbox.wait("spans exported to otel-collector:4318", lambda: sandbox.otlp_exports() > 0, 30)

        pages = sandbox.workdir / "volumes" / "pager-data" / "pages.jsonl"

        def paged() -> dict[str, Any] | None:
            for line in pages.read_text().splitlines() if pages.exists() else []:
                note = json.loads(line)
                for alert in note["alerts"]:
                    if alert["labels"]["alertname"] == "LoadlensGpuXidError" and alert["status"] == "firing":
                        return {"receiver": note["receiver"], **alert}
            return None

        page = sandbox.wait("the fire-drill page", paged, 120)
        assert page["receiver"] == "pager"
        assert page["labels"]["severity"] == "critical"
        assert page["labels"]["job"] == "loadlens-gpu"
        assert page["labels"]["instance"] == "gpu-exporter:9400"
        sandbox.assert_no_restarts_but("locust-master")


def _running(sandbox: netns.Sandbox) -> list[str]:
    spec = json.loads((sandbox.workdir / "spec.json").read_text())
    return [p["name"] for p in spec["processes"]]


@pytest.mark.timeout(240)
def test_gpu_profile_proxies_to_vllm_and_scrapes_its_series_into_the_serving_job(tmp_path: Path) -> None:
    """Profile gpu with a stand-in for vLLM: `loadlens serve --engine sim` on vLLM's port and served-model name.

    It emits vLLM's own `vllm:*` series, so this proves the proxy wiring (serve-gpu -> vllm:8001) and that
    Prometheus finds vLLM by DNS and files its series under job="loadlens-serve". There is no GPU: the NVML
    exporter runs and reports NVML down, as documented.
    """
    reason = netns.available("prometheus", "prometheus-alertmanager")
    if reason is not None:
        required.unavailable(f"cannot emulate the compose network: {reason}")
    vllm = compose_run.active_services("gpu")["vllm"]
    command = [compose_run.interpolate(str(c), {}) for c in vllm["command"]]
    port, served = command[command.index("--port") + 1], command[command.index("--served-model-name") + 1]
    stand_in = [netns.loadlens_bin(), "serve", "--engine", "sim", "--host", "0.0.0.0", "--port", port]
    stand_in += ["--served-model-name", served]
    with compose_run.run_profile("gpu", tmp_path / "run", ENV, {"vllm": stand_in}) as sandbox:
        # The proxy is healthy only when its upstream is: its /health asks vllm:8001.
        sandbox.wait("serve-gpu healthy", lambda: sandbox.get(8000, "/health").status_code == 200, 60)
        models = sandbox.get(8000, "/v1/models").json()
        assert [m["id"] for m in models["data"]] == [served], "the proxy lists vLLM's served model"
        sandbox.wait("2 Locust workers", lambda: len(sandbox.get(8089, "/stats/requests").json()["workers"]) == 2, 60)

        def both_serving_targets_up() -> list[str] | None:
            up = sorted(r["metric"]["instance"] for r in sandbox.query('up{job="loadlens-serve"} == 1'))
            return up if len(up) == 2 else None

        assert sandbox.wait("serve and vLLM up in loadlens-serve", both_serving_targets_up, 60) == [
            "serve:8000",
            f"vllm:{port}",
        ]
        # Requests pass the proxy and run on "vLLM": both sides count them, in the same job.
        sandbox.wait(
            "proxied requests counted on both sides",
            lambda: (
                sandbox.query('sum(loadlens_requests_total{job="loadlens-serve",code="200"}) > 0')
                and sandbox.query(f'sum(vllm:request_success_total{{job="loadlens-serve",instance="vllm:{port}"}}) > 0')
            ),
            90,
        )
        # The rules see vLLM's queue and KV cache under the job they select on.
        kv = sandbox.query('vllm:kv_cache_usage_perc{job="loadlens-serve"}')
        assert {r["metric"]["model_name"] for r in kv} == {served}
        # No GPU here: the NVML exporter answers /metrics with NVML down, and /health says so.
        assert sandbox.get(9400, "/health").status_code == 503
        assert sandbox.scraped('loadlens_gpu_nvml_up{job="loadlens-gpu"}') == [0.0]
        sandbox.assert_no_restarts_but("locust-master")
