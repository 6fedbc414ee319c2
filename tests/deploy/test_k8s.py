"""k8s/: the overlays render with kustomize, every object validates, and the objects agree with each other,
with the ports table, the alert rules, the dashboards and the collector config (static: no cluster here)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from loadlens.cli import build_parser
from loadlens.codegen import k8s
from loadlens.contracts.ports import PORT, PORTS
from tests.deploy.support import (
    K8S,
    OVERLAYS,
    ROOT,
    SCHEMAS,
    SCHEMAS_MISSING,
    by_kind,
    compose,
    load_yaml,
    render,
    workloads,
)
from tests.support import kube, required

LOADLENS_IMAGE = "loadlens:0.1.0"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor_v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor_v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule_v1.json",
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): "alertmanagerconfig_v1alpha1.json",
}
KUBERNETES_VERSION = "1.33.0"
JOBS = {p.job for p in PORTS if p.job is not None}


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list(workload["spec"]["template"]["spec"]["containers"])


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _services(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return by_kind(objects, "Service")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pods_of(objects: list[dict[str, Any]], selector: dict[str, str]) -> list[dict[str, Any]]:
    return [w for w in workloads(objects).values() if _selects(selector, w["spec"]["template"]["metadata"]["labels"])]


def _named_container_ports(workload: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in _containers(workload) for p in c.get("ports", []) if "name" in p}


def _resolve(objects: list[dict[str, Any]], url: str) -> tuple[dict[str, Any], int]:
    """The Service a cluster URL (`http://svc:port`, or svc.ns.svc) reaches, and the container port behind it."""
    parts = urlsplit(url if "//" in url else f"tcp://{url}")
    host = parts.hostname or ""
    name = host.split(".")[0]
    if len(host.split(".")) > 1:
        assert host.split(".")[1] == k8s.NAMESPACE, url
    service = _services(objects).get(name)
    assert service is not None, f"{url}: no Service {name}"
    port = next((p for p in service["spec"]["ports"] if p["port"] == parts.port), None)
    assert port is not None, f"{url}: Service {name} has no port {parts.port}"
    pods = _pods_of(objects, service["spec"]["selector"])
    assert pods, f"Service {name} selects no pods"
    target = port.get("targetPort", port["port"])
    named = _named_container_ports(pods[0])
    return service, named[target] if isinstance(target, str) else target


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def objects(overlay: str) -> list[dict[str, Any]]:
    return render(f"overlays/{overlay}")


# --- rendering and schemas -----------------------------------------------------------------------------------


def test_base_and_overlays_render() -> None:
    kinds = {o["kind"] for o in render("base")}
    assert {"Namespace", "Deployment", "Service", "ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    assert {"AlertmanagerConfig", "ConfigMap", "PersistentVolumeClaim"} <= kinds
    for overlay in OVERLAYS:
        names = {(o["kind"], o["metadata"]["name"]) for o in render(f"overlays/{overlay}")}
        assert len(names) == len(render(f"overlays/{overlay}")), f"{overlay}: duplicate objects"


def test_core_objects_validate_against_the_kubernetes_schemas(objects: list[dict[str, Any]]) -> None:
    kubernetes_validate = required.require_module("kubernetes_validate")
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {err.message} at {list(err.path)}")
        checked += 1
    assert checked >= 15


def _crd_validator(schema_file: str) -> Any:
    path = SCHEMAS / schema_file
    if not path.exists():
        required.unavailable(f"CRD schema not found at {path} ({SCHEMAS_MISSING})")
    jsonschema = required.require_module("jsonschema")
    schema = json.loads(path.read_text())
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)(schema)


def _errors(validator: Any, instance: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def test_prometheus_operator_objects_validate_against_the_crd_schemas(objects: list[dict[str, Any]]) -> None:
    seen = set()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key[0].startswith("monitoring.coreos.com/"):
            assert key in CRD_SCHEMAS, f"no schema for {key}"
            errors = _errors(_crd_validator(CRD_SCHEMAS[key]), obj)
            assert not errors, f"{obj['kind']}/{obj['metadata']['name']}:\n" + "\n".join(errors)
            seen.add(key)
    assert seen == set(CRD_SCHEMAS)


def test_alertmanager_config_child_routes_validate_as_routes() -> None:
    # The CRD leaves child routes unchecked (x-kubernetes-preserve-unknown-fields); the operator parses them
    # as routes, so check each against the route schema.
    validator = _crd_validator(CRD_SCHEMAS[("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig")])
    route_schema = validator.schema["properties"]["spec"]["properties"]["route"]
    route_validator = type(validator)(route_schema)
    amc = by_kind(render("base"), "AlertmanagerConfig")["loadlens"]

    def walk(route: dict[str, Any]) -> int:
        errors = _errors(route_validator, route)
        assert not errors, errors
        return 1 + sum(walk(child) for child in route.get("routes", []))

    assert walk(amc["spec"]["route"]) == 4


def test_every_object_lives_in_the_loadlens_namespace(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] == "Namespace":
            assert obj["metadata"]["name"] == k8s.NAMESPACE
        else:
            assert obj["metadata"].get("namespace") == k8s.NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "loadlens"


# --- workloads -------------------------------------------------------------------------------------------------


def test_overlays_choose_the_engine_and_the_gpu_exporter(overlay: str, objects: list[dict[str, Any]]) -> None:
    wl = workloads(objects)
    serve = {c["name"]: c for c in _containers(wl["loadlens-serve"])}
    exporter = wl["loadlens-gpu-exporter"]
    exporter_env = _env(_containers(exporter)[0])
    if overlay == "sim":
        assert set(serve) == {"serve"}
        assert _env(serve["serve"])["LOADLENS_ENGINE"] == "sim"
        assert exporter["kind"] == "Deployment" and exporter_env["LOADLENS_GPU_EXPORTER_BACKEND"] == "sim"
        _, port = _resolve(objects, exporter_env["LOADLENS_GPU_EXPORTER_SIM_URL"])
        assert port == PORT["serve"]
        assert urlsplit(exporter_env["LOADLENS_GPU_EXPORTER_SIM_URL"]).path == "/sim/device-state"
    else:
        assert set(serve) == {"serve", "vllm"}
        env = _env(serve["serve"])
        assert env["LOADLENS_ENGINE"] == "openai"
        # The proxy reaches vLLM inside the pod, on the port vLLM listens on.
        upstream = urlsplit(env["LOADLENS_UPSTREAM"])
        vllm_args = serve["vllm"]["args"]
        assert upstream.hostname == "127.0.0.1"
        assert upstream.port == int(vllm_args[vllm_args.index("--port") + 1]) == PORT["upstream"]
        assert exporter["kind"] == "DaemonSet" and exporter_env["LOADLENS_GPU_EXPORTER_BACKEND"] == "nvml"
        pod = exporter["spec"]["template"]["spec"]
        assert pod["hostPID"] is True, "per-process GPU memory needs the host's PIDs"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        # vLLM's workers publish probe documents into the node's directory that the DaemonSet reads.
        vllm_env = _env(serve["vllm"])
        assert vllm_env["LOADLENS_VLLM_PROBE"] == "1"
        assert serve["vllm"]["image"].startswith("loadlens-vllm:")
        assert serve["vllm"]["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        probe_dir = vllm_env["LOADLENS_PROBE_DIR"]
        assert exporter_env["LOADLENS_GPU_EXPORTER_PROBE_DIR"] == probe_dir

        def host_dir(workload: dict[str, Any], container: dict[str, Any], read_only: bool) -> str:
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == probe_dir]
            assert mount.get("readOnly", False) is read_only
            (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
            assert volume["hostPath"]["type"] == "DirectoryOrCreate"
            return str(volume["hostPath"]["path"])

        serving = workloads(objects)["loadlens-serve"]
        assert host_dir(serving, serve["vllm"], False) == host_dir(exporter, _containers(exporter)[0], True)


def test_gpu_resources_are_whole_gpus_with_request_equal_to_limit(overlay: str, objects: list[dict[str, Any]]) -> None:
    holders = []
    for name, wl in workloads(objects).items():
        for c in _containers(wl):
            resources = c.get("resources", {})
            limit = resources.get("limits", {}).get("nvidia.com/gpu")
            request = resources.get("requests", {}).get("nvidia.com/gpu")
            if limit is None and request is None:
                continue
            assert isinstance(limit, int) and limit >= 1, f"{name}/{c['name']}: whole GPUs only ({limit!r})"
            assert request in (None, limit), f"{name}/{c['name']}: request {request} != limit {limit}"
            holders.append((name, c["name"]))
    # Only vLLM holds a GPU; the exporter watches every GPU of its node without taking one.
    assert holders == ([("loadlens-serve", "vllm")] if overlay == "gpu" else [])


def test_every_container_has_resources_and_probes_on_declared_ports(objects: list[dict[str, Any]]) -> None:
    for name, wl in workloads(objects).items():
        for c in _containers(wl):
            resources = c.get("resources", {})
            assert "memory" in resources.get("limits", {}), f"{name}/{c['name']}: no memory limit"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), f"{name}/{c['name']}: requests"
            ports = {p["name"] for p in c.get("ports", [])}
            probes = [c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in c]
            if name == "locust-worker":
                assert not probes and not ports, "a worker listens on nothing"
                continue
            assert "readinessProbe" in c and "livenessProbe" in c, f"{name}/{c['name']}"
            for probe in probes:
                action = probe.get("httpGet") or probe.get("tcpSocket")
                assert action["port"] in ports, f"{name}/{c['name']}: probe port {action['port']}"


def test_loadlens_ports_agree_with_the_ports_table(objects: list[dict[str, Any]]) -> None:
    wl = workloads(objects)
    expect = {
        ("loadlens-serve", "serve", "http"): PORT["serve"],
        ("loadlens-gpu-exporter", "gpu-exporter", "metrics"): PORT["gpu"],
        ("loadlens-pager", "pager", "http"): PORT["pager"],
        ("locust-master", "master", "metrics"): PORT["loadgen"],
        ("locust-master", "master", "web"): PORT["locust-ui"],
    }
    for (workload, container, port_name), port in expect.items():
        c = next(c for c in _containers(wl[workload]) if c["name"] == container)
        assert {p["name"]: p["containerPort"] for p in c["ports"]}[port_name] == port, (workload, port_name)
    # The port each loadlens process is told to listen on is the port its container declares.
    flags = {"LOADLENS_PORT": "http", "LOADLENS_GPU_EXPORTER_PORT": "metrics", "LOADLENS_PAGER_PORT": "http"}
    flags |= {"LOADLENS_LOAD_METRICS_PORT": "metrics", "LOADLENS_LOAD_WEB_PORT": "web"}
    flags |= {"LOADLENS_LOAD_MASTER_PORT": "master"}
    for name, w in wl.items():
        for c in _containers(w):
            declared = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for var, value in _env(c).items():
                if var in flags and flags[var] in declared:
                    assert int(value) == declared[flags[var]], f"{name}/{c['name']}: {var}"


def test_services_select_pods_and_target_declared_ports(objects: list[dict[str, Any]]) -> None:
    for name, svc in _services(objects).items():
        pods = _pods_of(objects, svc["spec"]["selector"])
        assert len(pods) == 1, f"Service {name} selects {len(pods)} workloads"
        named = _named_container_ports(pods[0])
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in named if isinstance(target, str) else target in named.values(), (name, port)
            assert "name" in port, f"Service {name}: monitors refer to ports by name"


def test_workload_selectors_match_their_pod_templates(objects: list[dict[str, Any]]) -> None:
    for name, wl in workloads(objects).items():
        assert _selects(wl["spec"]["selector"]["matchLabels"], wl["spec"]["template"]["metadata"]["labels"]), name
        # Selectors are immutable: the part-of label added by the component must stay out of them.
        assert "app.kubernetes.io/part-of" not in wl["spec"]["selector"]["matchLabels"], name


def test_volumes_refer_to_objects_that_exist(objects: list[dict[str, Any]]) -> None:
    configmaps, claims = by_kind(objects, "ConfigMap"), by_kind(objects, "PersistentVolumeClaim")
    used_claims = set()
    for name, wl in workloads(objects).items():
        pod = wl["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{name}/{c['name']}: mount {mount['name']}"
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps, f"{name}: ConfigMap {v['configMap']['name']}"
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                assert claim in claims, f"{name}: PVC {claim}"
                used_claims.add(claim)
                # A ReadWriteOnce volume and a rolling update deadlock on a second node.
                if wl["kind"] == "Deployment":
                    assert wl["spec"].get("strategy", {}).get("type") == "Recreate", f"{name}: RWO volume"
        for c in pod["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    # Secrets are the user's to create; without one the workload still starts.
                    assert ref.get("optional") is True, f"{name}/{c['name']}: {e['name']}"
    assert used_claims == set(claims), "every PVC is mounted"


def test_containers_run_unprivileged(overlay: str, objects: list[dict[str, Any]]) -> None:
    namespace = by_kind(objects, "Namespace")[k8s.NAMESPACE]["metadata"]["labels"]
    # sim meets the "restricted" Pod Security Standard; gpu cannot (vLLM's image is root, the exporter hostPID).
    assert namespace["pod-security.kubernetes.io/enforce"] == ("restricted" if overlay == "sim" else "privileged")
    assert namespace["pod-security.kubernetes.io/warn"] == "restricted"
    for name, wl in workloads(objects).items():
        pod = wl["spec"]["template"]["spec"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in pod["containers"]:
            ctx = {**pod["securityContext"], **c.get("securityContext", {})}
            assert ctx["allowPrivilegeEscalation"] is False, f"{name}/{c['name']}"
            if (name, c["name"]) == ("loadlens-serve", "vllm"):
                assert overlay == "gpu"
                continue
            assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] != 0, f"{name}/{c['name']}"
            assert ctx["capabilities"] == {"drop": ["ALL"]}, f"{name}/{c['name']}"
            assert ctx["readOnlyRootFilesystem"] is True, f"{name}/{c['name']}"
        if overlay == "sim":
            assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC"), name


def test_images_are_pinned_and_match_compose(objects: list[dict[str, Any]]) -> None:
    compose_images = {str(s["image"]).split(":")[0]: str(s["image"]) for s in compose()["services"].values()}
    for name, wl in workloads(objects).items():
        for c in _containers(wl):
            image = c["image"]
            repo, _, tag = image.rpartition(":")
            assert repo and tag and tag != "latest", f"{name}/{c['name']}: {image} is not pinned"
            if repo in ("loadlens", "loadlens-vllm"):
                # Built from this repository (Dockerfile, Dockerfile.vllm) at the project's version.
                assert image == f"{repo}:{LOADLENS_IMAGE.split(':')[1]}", f"{name}/{c['name']}: {image}"
            else:
                # The same upstream release as the compose stack, so both deployments behave alike.
                assert compose_images.get(repo) == image, f"{name}/{c['name']}: {image} vs compose"


def _subcommand_parse(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    env = _env(container)
    for var in [v for v in os.environ if v.startswith("LOADLENS_")]:
        monkeypatch.delenv(var)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    parser = build_parser()
    args = container["args"]
    try:
        namespace = parser.parse_args(args)
    except SystemExit as err:  # argparse reports a bad value (from a flag or the environment) and exits 2
        pytest.fail(f"{container['name']}: `loadlens {' '.join(args)}` with its env does not parse ({err})")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = {m for a in sub.choices[args[0]]._actions for m in re.findall(r"\[env: (\w+)\]", a.help or "")}
    unknown = {var for var in env if var.startswith("LOADLENS_")} - known
    assert not unknown, f"{container['name']}: no such variables of `loadlens {args[0]}`: {sorted(unknown)}"
    return namespace


def test_loadlens_containers_are_configured_with_real_flags(
    objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = 0
    for wl in workloads(objects).values():
        for c in _containers(wl):
            if c["image"].startswith("loadlens:"):
                _subcommand_parse(c, monkeypatch)
                parsed += 1
    assert parsed >= 5


def test_urls_between_workloads_resolve_to_services(overlay: str, objects: list[dict[str, Any]]) -> None:
    wl = workloads(objects)
    serve = next(c for c in _containers(wl["loadlens-serve"]) if c["name"] == "serve")
    collector = yaml.safe_load(by_kind(objects, "ConfigMap")["otel-collector"]["data"]["config.yaml"])
    service, port = _resolve(objects, _env(serve)["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert service["metadata"]["name"] == "otel-collector"
    assert port == int(collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1])
    service, port = _resolve(objects, collector["exporters"]["otlp_grpc/tempo"]["endpoint"])
    tempo = yaml.safe_load(by_kind(objects, "ConfigMap")["tempo"]["data"]["tempo.yaml"])
    assert port == int(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1])
    master, worker = (_env(_containers(wl[n])[0]) for n in ("locust-master", "locust-worker"))
    for env in (master, worker):
        _, port = _resolve(objects, env["LOADLENS_LOAD_HOST"])
        assert port == PORT["serve"]
    _, port = _resolve(objects, f"{worker['LOADLENS_LOAD_MASTER_HOST']}:{worker['LOADLENS_LOAD_MASTER_PORT']}")
    assert port == int(master["LOADLENS_LOAD_MASTER_PORT"])
    assert master["LOADLENS_LOAD_PROFILE"] == worker["LOADLENS_LOAD_PROFILE"]
    # The master waits for the workers the Deployment starts (scale both together: k8s/README.md).
    assert int(master["LOADLENS_LOAD_EXPECT_WORKERS"]) == wl["locust-worker"]["spec"]["replicas"] >= 2
    _, port = _resolve(objects, k8s.PAGER_URL)
    assert port == PORT["pager"]


# --- monitoring ------------------------------------------------------------------------------------------------


def _monitored(objects: list[dict[str, Any]]) -> dict[str, list[tuple[str, int]]]:
    """Prometheus job -> (workload, container port) of every endpoint the monitors scrape."""
    jobs: dict[str, list[tuple[str, int]]] = {}
    for sm in by_kind(objects, "ServiceMonitor").values():
        label = sm["spec"]["jobLabel"]
        for svc in _services(objects).values():
            if not _selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]):
                continue
            job = svc["metadata"]["labels"][label]
            pod = _pods_of(objects, svc["spec"]["selector"])[0]
            for endpoint in sm["spec"]["endpoints"]:
                port = next(p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"])
                target = _named_container_ports(pod)[port["targetPort"]]
                jobs.setdefault(job, []).append((pod["metadata"]["name"], target))
    for pm in by_kind(objects, "PodMonitor").values():
        label = pm["spec"]["jobLabel"]
        for pod in _pods_of(objects, pm["spec"]["selector"]["matchLabels"]):
            job = pod["spec"]["template"]["metadata"]["labels"][label]
            for endpoint in pm["spec"]["podMetricsEndpoints"]:
                target = _named_container_ports(pod)[endpoint["port"]]
                jobs.setdefault(job, []).append((pod["metadata"]["name"], target))
    return jobs


def test_monitors_scrape_every_job_the_rules_use_under_its_name(overlay: str, objects: list[dict[str, Any]]) -> None:
    jobs = _monitored(objects)
    assert JOBS | {"otel-collector"} == set(jobs)
    assert jobs["loadlens-gpu"] == [("loadlens-gpu-exporter", PORT["gpu"])]
    assert jobs["loadlens-pager"] == [("loadlens-pager", PORT["pager"])]
    assert jobs["loadlens-loadgen"] == [("locust-master", PORT["loadgen"])]
    serve = [("loadlens-serve", PORT["serve"])]
    # Under gpu, vLLM's own vllm:* series are scraped into the serving job, as the sim engine emits them there.
    assert jobs["loadlens-serve"] == (serve + [("loadlens-serve", PORT["upstream"])] if overlay == "gpu" else serve)
    rules = "".join((ROOT / "alerts" / f).read_text() for f in ("loadlens-alerts.yaml", "loadlens-rules.yaml"))
    used = set(re.findall(r'job="([^"]+)"', rules))
    assert used <= set(jobs), f"rules select jobs nobody scrapes: {used - set(jobs)}"


def test_monitoring_objects_carry_the_release_label(objects: list[dict[str, Any]]) -> None:
    values = load_yaml(K8S / "kube-prometheus-stack-values.yaml")
    release = values["prometheus"]["prometheusSpec"]["serviceMonitorSelector"]["matchLabels"]
    assert release == k8s.RELEASE_LABEL
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "AlertmanagerConfig"):
        for name, obj in by_kind(objects, kind).items():
            assert _selects(release, obj["metadata"]["labels"]), f"{kind}/{name}: not selected by the release"
    spec = values["prometheus"]["prometheusSpec"]
    for selector in ("podMonitorSelector", "ruleSelector"):
        assert spec[selector]["matchLabels"] == release
    assert "exemplar-storage" in spec["enableFeatures"]
    am = values["alertmanager"]["alertmanagerSpec"]
    assert am["alertmanagerConfigSelector"]["matchLabels"] == release
    sidecar = values["grafana"]["sidecar"]
    assert sidecar["dashboards"]["label"] == "grafana_dashboard" and sidecar["dashboards"]["labelValue"] == "1"
    assert sidecar["datasources"]["label"] == "grafana_datasource" and sidecar["datasources"]["labelValue"] == "1"
    assert sidecar["dashboards"]["searchNamespace"] == "ALL" and sidecar["datasources"]["searchNamespace"] == "ALL"
    assert sidecar["dashboards"]["folderAnnotation"] == "grafana_folder"
    links = sidecar["datasources"]["exemplarTraceIdDestinations"]
    assert links == {"datasourceUid": k8s.TEMPO_UID, "traceIdLabelName": "trace_id"}


def _rule_groups(path: Path) -> list[dict[str, Any]]:
    return list(load_yaml(path)["groups"])


def test_prometheus_rule_is_the_alerts_directory_plus_the_namespace_label() -> None:
    rule = by_kind(render("base"), "PrometheusRule")["loadlens"]
    expected = [g for f in ("loadlens-rules.yaml", "loadlens-alerts.yaml") for g in _rule_groups(ROOT / "alerts" / f)]
    got = rule["spec"]["groups"]
    assert [g["name"] for g in got] == [g["name"] for g in expected]
    alerts = 0
    for g_got, g_exp in zip(got, expected, strict=True):
        assert g_got.keys() == g_exp.keys()
        for r_got, r_exp in zip(g_got["rules"], g_exp["rules"], strict=True):
            if "alert" in r_exp:
                alerts += 1
                labels = dict(r_got["labels"])
                assert labels.pop("namespace") == k8s.NAMESPACE, r_exp["alert"]
                assert {**r_got, "labels": labels} == r_exp
            else:
                assert r_got == r_exp
    assert alerts >= 20


def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    promtool = _tool("promtool")
    rule = by_kind(render("base"), "PrometheusRule")["loadlens"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def _tool(name: str) -> str:
    return required.require_binary(name, how="make system-deps")


def test_alertmanager_config_routes_exactly_like_alerts_alertmanager_yml(tmp_path: Path) -> None:
    amc = by_kind(render("base"), "AlertmanagerConfig")["loadlens"]
    native = kube.native_config(amc)
    reference = load_yaml(ROOT / "alerts" / "alertmanager.yml")
    for receiver in reference["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = k8s.PAGER_URL
    assert native == reference
    amtool = _tool("amtool")
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(native))
    checked = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for labels, receiver in (
        (["severity=critical", "slo=ttft"], "pager"),
        (["severity=warning", "slo=goodput"], "ticket"),
        (["severity=info"], "null"),
    ):
        result = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={path}", f"--verify.receivers={receiver}", *labels],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, f"{labels}: {result.stdout}{result.stderr}"


def test_alerts_reach_the_receivers_through_the_operators_namespace_matcher(tmp_path: Path) -> None:
    """The operator nests an AlertmanagerConfig's route under `namespace="<its namespace>"`; only alerts with that
    label reach it, which is why the PrometheusRule adds it to every alert."""
    amtool = _tool("amtool")
    nested = kube.alertmanager_config(by_kind(render("base"), "AlertmanagerConfig")["loadlens"])
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(nested))
    rule = by_kind(render("base"), "PrometheusRule")["loadlens"]
    critical = next(
        r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("labels", {}).get("severity") == "critical"
    )
    labels = [f"{k}={v}" for k, v in critical["labels"].items()]

    def receiver(label_args: list[str]) -> str:
        result = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={path}", *label_args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.strip()

    assert receiver(labels) == "pager"
    assert receiver([lbl for lbl in labels if not lbl.startswith("namespace=")]) == "cluster-default"


def test_alertmanager_config_translation_rejects_what_it_cannot_translate() -> None:
    with pytest.raises(ValueError, match="cannot translate Alertmanager matcher"):
        k8s.matcher("severity critical")
    with pytest.raises(ValueError, match="no translation for \\['pagerduty_configs'\\]"):
        k8s._receiver({"name": "pager", "pagerduty_configs": [{}]})
    assert k8s.matcher('alertname!~"A|B"') == {"name": "alertname", "matchType": "!~", "value": "A|B"}
    assert k8s.matcher('msg="say \\"hi\\""') == {"name": "msg", "matchType": "=", "value": 'say "hi"'}


# --- Grafana and the collector ---------------------------------------------------------------------------------


def test_dashboard_configmaps_hold_the_dashboards() -> None:
    configmaps = by_kind(render("base"), "ConfigMap")
    dashboards = {n: c for n, c in configmaps.items() if c["metadata"]["labels"].get("grafana_dashboard") == "1"}
    files = sorted((ROOT / "dashboards").glob("*.json"))
    assert len(dashboards) == len(files) >= 3
    for path in files:
        cm = dashboards[f"grafana-dashboard-{path.stem}"]
        assert json.loads(cm["data"][path.name]) == json.loads(path.read_text())
        assert len(json.dumps(cm["data"])) < 900_000, "a ConfigMap holds at most 1 MiB"
    datasources = [c for c in configmaps.values() if c["metadata"]["labels"].get("grafana_datasource") == "1"]
    assert len(datasources) == 1
    (text,) = datasources[0]["data"].values()
    (tempo,) = yaml.safe_load(text)["datasources"]
    assert tempo["uid"] == k8s.TEMPO_UID and tempo["type"] == "tempo"
    _, port = _resolve(render("overlays/sim"), tempo["url"])
    assert port == 3200
    # The dashboards' exemplar links point at this uid (dashboards/provisioning/datasources/prometheus.yaml).
    prom = load_yaml(ROOT / "dashboards" / "provisioning" / "datasources" / "prometheus.yaml")["datasources"][0]
    assert prom["jsonData"]["exemplarTraceIdDestinations"][0]["datasourceUid"] == k8s.TEMPO_UID


def test_config_maps_hold_the_repository_configs_verbatim() -> None:
    configmaps = by_kind(render("base"), "ConfigMap")
    assert configmaps["otel-collector"]["data"]["config.yaml"] == (ROOT / "otel-collector.yaml").read_text()
    assert configmaps["tempo"]["data"]["tempo.yaml"] == (ROOT / "deploy" / "compose" / "tempo.yaml").read_text()
    collector = next(c for c in _containers(workloads(render("base"))["otel-collector"]))
    mount = next(m for m in collector["volumeMounts"] if m["name"] == "config")
    assert f"--config={mount['mountPath']}/config.yaml" in collector["args"]


def test_collector_service_exposes_the_ports_its_config_listens_on() -> None:
    objects = render("base")
    config = yaml.safe_load(by_kind(objects, "ConfigMap")["otel-collector"]["data"]["config.yaml"])
    listens = {
        int(config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1]),
        int(config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1]),
        int(config["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]),
    }
    collector = workloads(objects)["otel-collector"]
    health = int(config["extensions"]["health_check"]["endpoint"].rsplit(":", 1)[1])
    assert _named_container_ports(collector)["health"] == health
    service_ports = set()
    for port in _services(objects)["otel-collector"]["spec"]["ports"]:
        service_ports.add(_named_container_ports(collector)[port["targetPort"]])
    assert service_ports == listens
    assert collector["spec"]["replicas"] == 1, "tail_sampling needs every span of a trace on one instance"


# --- files -----------------------------------------------------------------------------------------------------


def test_every_kustomization_lists_files_that_exist() -> None:
    for path in K8S.rglob("kustomization.yaml"):
        doc = load_yaml(path)
        for entry in doc.get("resources", []) + doc.get("components", []):
            assert (path.parent / entry).exists(), f"{path.relative_to(ROOT)}: {entry}"
        for patch in doc.get("patches", []):
            if "path" in patch:
                assert (path.parent / patch["path"]).is_file(), f"{path.relative_to(ROOT)}: {patch['path']}"
    listed = set()
    for path in K8S.rglob("kustomization.yaml"):
        doc = load_yaml(path)
        for entry in doc.get("resources", []) + [p["path"] for p in doc.get("patches", []) if "path" in p]:
            listed.add((path.parent / entry).resolve())
    for path in K8S.rglob("*.yaml"):
        if path.name != "kustomization.yaml" and path.parent != K8S:
            assert path.resolve() in listed, f"{path.relative_to(ROOT)} is in no kustomization"


def test_pods_mount_no_api_token_and_get_no_service_links(objects: list[dict[str, Any]]) -> None:
    for name, wl in workloads(objects).items():
        pod = wl["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["enableServiceLinks"] is False, name


def test_service_links_would_break_the_pager_without_its_explicit_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why enableServiceLinks is off: Service loadlens-pager makes the kubelet set LOADLENS_PAGER_PORT to
    ``tcp://<ip>:9095`` in every pod, and that is the pager's own --port variable."""
    links = kube.service_links(render("overlays/sim"))
    assert links["LOADLENS_PAGER_PORT"] == "tcp://10.0.0.1:9095"
    for var in [v for v in os.environ if v.startswith("LOADLENS_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("LOADLENS_PAGER_PORT", links["LOADLENS_PAGER_PORT"])
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["pager"])
    assert exit_info.value.code == 2
