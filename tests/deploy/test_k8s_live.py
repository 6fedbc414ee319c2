"""The sim overlay, run: its loadlens workloads start with their manifest configuration in an emulated pod
network, the monitors' targets are up under the rules' job names, load flows from the Locust workers, traces
leave for the Collector, and the fire-drill XID pages through the PrometheusRule and the AlertmanagerConfig.

The set-up (network, PID and mount namespaces; the operator's config; a stand-in OTLP receiver) is described
in tests/support/kube.py. It needs root, prometheus and prometheus-alertmanager; outside CI it skips without
them, and under CI it fails instead.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import K8S, kubectl, load_documents, render
from tests.support import kube, netns, required

pytestmark = pytest.mark.slow  # whole emulated clusters in network namespaces: tens of seconds each

ADMIN_TOKEN = "drill-admin-token"
LOADLENS_JOBS = {"loadlens-serve", "loadlens-gpu", "loadlens-pager", "loadlens-loadgen"}
# fire-drill injects the XID 60 s after the GPU exporter starts; then a scrape (5 s), an evaluation, the
# critical route's group_wait (5 s) and the webhook.
PAGE_DEADLINE_S = 150.0


def _render_with_fire_drill(tmp_path: Path) -> list[dict[str, Any]]:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(K8S, overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel}/overlays/sim\ncomponents:\n  - {rel}/components/fire-drill\n"
    )
    result = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return load_documents(result.stdout)


@pytest.mark.timeout(390)  # 72 s in the parallel phase, x5 (tests/support/timeout_margins.py)
def test_sim_overlay_runs_is_scraped_under_the_rule_job_names_and_pages(tmp_path: Path) -> None:
    reason = kube.available()
    if reason is not None:
        required.unavailable(f"cannot emulate the cluster: {reason}")
    objects = _render_with_fire_drill(tmp_path)
    secrets = {"loadlens-admin": {"token": ADMIN_TOKEN}}
    with kube.run_overlay(objects, tmp_path / "run", secrets=secrets) as cluster:
        # Every loadlens container's readiness probe passes, on the port and path its manifest names.
        probes = []
        for wl in (o for o in objects if o["kind"] in {"Deployment", "DaemonSet"}):
            for c in wl["spec"]["template"]["spec"]["containers"]:
                probe = c.get("readinessProbe", {}).get("httpGet")
                if probe and c["image"].startswith("loadlens:"):
                    port = next(p["containerPort"] for p in c["ports"] if p["name"] == probe["port"])
                    probes.append((wl["metadata"]["name"], port, probe["path"]))
        assert {name for name, _, _ in probes} == {
            "loadlens-serve",
            "loadlens-gpu-exporter",
            "loadlens-pager",
            "locust-master",
        }
        for name, port, path in probes:
            ready = lambda port=port, path=path: cluster.get(port, path).status_code == 200  # noqa: E731
            cluster.wait(f"{name} ready ({path} on {port})", ready, 60)

        # The Locust master counts the two worker replicas that dialled locust-master:5557.
        cluster.wait("2 Locust workers", lambda: len(cluster.get(8089, "/stats/requests").json()["workers"]) == 2, 60)

        # Prometheus (configured from the monitors) scrapes every loadlens job under the name the rules use.
        def jobs_up() -> set[str] | None:
            up = {r["metric"]["job"] for r in cluster.query('up{namespace="loadlens"} == 1')}
            return up if up >= LOADLENS_JOBS else None

        up = cluster.wait("every loadlens job up", jobs_up, 60)
        # The collector is the one target without a process behind it (no Collector binary here).
        assert up == LOADLENS_JOBS
        # Its first scrape can come up to one interval (15 s) after the others.
        down = cluster.wait("the collector's target scraped", lambda: cluster.query('up{job="otel-collector"}'), 30)
        assert [r["value"][1] for r in down] == ["0"]
        assert {r["metric"]["job"] for r in cluster.query('up{namespace="loadlens"} == 0')} == {"otel-collector"}
        # The exporter is up before its simulated NVML is (that waits for serve's device state).
        gpu = cluster.wait(
            "GPU series scraped", lambda: cluster.query('loadlens_gpu_memory_total_bytes{job="loadlens-gpu"}'), 30
        )
        assert gpu and gpu[0]["metric"]["node"] == "node-0", "the PodMonitor's relabeling adds the node"

        # The workers' load reaches serve, and serve's spans reach the collector's OTLP/HTTP port.
        cluster.wait(
            "requests counted by serve",
            lambda: cluster.query('sum(loadlens_requests_total{job="loadlens-serve",code="200"}) > 0'),
            90,
        )
        cluster.wait("spans exported to otel-collector:4318", lambda: cluster.otlp_exports() > 0, 30)

        # ...and none of them was lost on the way (the stand-in answers like a collector).
        dropped = cluster.query('sum by (reason) (loadlens_trace_spans_dropped_total{job="loadlens-serve"})')
        assert {r["metric"]["reason"]: float(r["value"][1]) for r in dropped} == {
            "queue_full": 0.0,
            "export_failed": 0.0,
        }

        # The admin token comes from the (optional) Secret.
        assert cluster.get(8000, "/admin/knobs").status_code == 401
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert cluster.client(8000).get("/admin/knobs", headers=headers).status_code == 200

        # The fire drill pages: XID -> LoadlensGpuXidError -> Alertmanager -> loadlens-pager.loadlens.svc:9095.
        pages = next(cluster.workdir.glob("volumes/loadlens-pager/data")) / "pages.jsonl"

        def paged() -> dict[str, Any] | None:
            if not pages.exists():
                return None
            for line in pages.read_text().splitlines():
                note = json.loads(line)
                for alert in note["alerts"]:
                    if alert["labels"]["alertname"] == "LoadlensGpuXidError" and alert["status"] == "firing":
                        return {"receiver": note["receiver"], **alert}
            return None

        page = cluster.wait("the fire-drill page", paged, PAGE_DEADLINE_S)
        assert page["receiver"] == "pager"
        assert page["labels"]["severity"] == "critical"
        assert page["labels"]["namespace"] == "loadlens"
        assert page["labels"]["job"] == "loadlens-gpu"
        assert page["annotations"]["description"].startswith("GPU 0 reported 1 XID event(s) in the last 5m")
        # The operator's target labels survive into the page: where to look, without a query.
        assert {k: page["labels"][k] for k in ("pod", "container", "node", "gpu")} == {
            "pod": "loadlens-gpu-exporter-0",
            "container": "gpu-exporter",
            "node": "node-0",
            "gpu": "0",
        }
        # Nothing crashed. Only the Locust master may have restarted: it exits while serve is not yet ready
        # and the kubelet (here the supervisor) starts it again.
        cluster.assert_no_restarts_but("locust-master")


@pytest.mark.timeout(240)
def test_gpu_overlay_serves_through_the_proxy_and_scrapes_vllm_into_the_serving_job(tmp_path: Path) -> None:
    """The gpu overlay with a stand-in for the vLLM container: `loadlens serve --engine sim` with the
    container's port and served-model name, which emits vLLM's own `vllm:*` series. Proves the in-pod wiring
    (proxy -> 127.0.0.1:8001) and the ServiceMonitor's second endpoint. No GPU: the NVML DaemonSet runs and
    reports NVML down."""
    reason = kube.available()
    if reason is not None:
        required.unavailable(f"cannot emulate the cluster: {reason}")
    objects = render("overlays/gpu")
    serve = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "loadlens-serve")
    vllm = next(c for c in serve["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    args = vllm["args"]
    port, served = args[args.index("--port") + 1], args[args.index("--served-model-name") + 1]
    stand_in = [netns.loadlens_bin(), "serve", "--engine", "sim", "--host", "0.0.0.0", "--port", port]
    stand_in += ["--served-model-name", served]
    with kube.run_overlay(objects, tmp_path / "run", stand_ins={"vllm": stand_in}) as cluster:
        cluster.wait(
            "the proxy ready (its upstream answers)", lambda: cluster.get(8000, "/health").status_code == 200, 60
        )
        assert [m["id"] for m in cluster.get(8000, "/v1/models").json()["data"]] == [served]
        cluster.wait("2 Locust workers", lambda: len(cluster.get(8089, "/stats/requests").json()["workers"]) == 2, 60)

        def serving_endpoints_up() -> list[str] | None:
            up = sorted(r["metric"]["endpoint"] for r in cluster.query('up{job="loadlens-serve"} == 1'))
            return up if len(up) == 2 else None

        assert cluster.wait("both endpoints of the serving pod up", serving_endpoints_up, 60) == ["http", "vllm"]
        cluster.wait(
            "proxied requests counted by the proxy and by vLLM",
            lambda: (
                cluster.query('sum(loadlens_requests_total{job="loadlens-serve",code="200"}) > 0')
                and cluster.query('sum(vllm:request_success_total{job="loadlens-serve",endpoint="vllm"}) > 0')
            ),
            90,
        )
        kv = cluster.query('vllm:kv_cache_usage_perc{job="loadlens-serve"}')
        assert {(r["metric"]["model_name"], r["metric"]["container"]) for r in kv} == {(served, "vllm")}
        # No GPU here: the DaemonSet's exporter serves /metrics with NVML down and is not ready.
        assert cluster.get(9400, "/health").status_code == 503
        assert cluster.scraped('loadlens_gpu_nvml_up{job="loadlens-gpu"}') == [0.0]
        cluster.assert_no_restarts_but("locust-master")
