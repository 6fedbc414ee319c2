"""Run a rendered overlay's loadlens workloads in a sandbox (tests/support/netns.py), as a cluster would.

What this adds to the sandbox:

- **Service names.** Every Service resolves by its short name, ``.loadlens``, ``.svc`` and
  ``.svc.cluster.local``, and so does kube-prometheus-stack's Prometheus.
- **Containers.** Each loadlens container runs as ``loadlens <args>`` with exactly the manifest's
  environment, and with ``valueFrom`` Secrets filled from ``secrets`` where given. Service links are added
  underneath, as the kubelet adds them, unless the pod turns them off (``enableServiceLinks: false``).
  - A volume's mount path is rewritten to a temporary directory. That is the only change made to a
    container.
  - A Deployment gets one process per replica.
  - A container that exits is restarted with back-off (``restartPolicy: Always``).
- **Prometheus Operator.** Prometheus's scrape jobs are built from the ServiceMonitors and PodMonitors, as the
  operator builds them:
  - the job comes from ``jobLabel``;
  - a Service port is followed to its container port;
  - ``relabelings`` become ``relabel_configs``;
  - the ``namespace``, ``service``, ``pod``, ``container`` and ``endpoint`` labels are set.

  The rule file is the PrometheusRule's spec. Alertmanager's config is the AlertmanagerConfig, nested under
  the operator's ``namespace`` matcher. Both run from the Debian binaries on the ports kube-prometheus-stack
  gives them (9090, 9093).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support import netns
from tests.support.netns import PROMETHEUS_PORT, Process

NAMESPACE = "loadlens"
ALERTMANAGER_PORT = 9093
# kube-prometheus-stack's Prometheus as the loadgen master is told to find it (k8s/base/locust.yaml).
EXTRA_HOSTS = ("kube-prometheus-stack-prometheus.monitoring.svc",)
# The evaluation interval here; kube-prometheus-stack-values.yaml sets 15 s on a cluster.
EVALUATION_INTERVAL = "1s"


def available() -> str | None:
    """Why this cannot run here, or None."""
    return netns.available("prometheus", "prometheus-alertmanager")


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in {"Deployment", "DaemonSet"}]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _container_ports(workload: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """Port name -> (container name, port number)."""
    out = {}
    for c in workload["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            out[p["name"]] = (c["name"], p["containerPort"])
    return out


def service_names(objects: list[dict[str, Any]]) -> list[str]:
    names = []
    for svc in _by_kind(objects, "Service"):
        n = svc["metadata"]["name"]
        names += [n, f"{n}.{NAMESPACE}", f"{n}.{NAMESPACE}.svc", f"{n}.{NAMESPACE}.svc.cluster.local"]
    return [*names, *EXTRA_HOSTS]


def service_links(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The variables the kubelet puts into every pod for each Service when ``enableServiceLinks`` is on
    (the default): ``LOADLENS_PAGER_PORT=tcp://10.0.0.1:9095`` and the rest, for Service ``loadlens-pager``."""
    env: dict[str, str] = {}
    for svc in _by_kind(objects, "Service"):
        name = svc["metadata"]["name"].upper().replace("-", "_")
        ports = svc["spec"]["ports"]
        env[f"{name}_SERVICE_HOST"] = "10.0.0.1"
        env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        env[f"{name}_PORT"] = f"tcp://10.0.0.1:{ports[0]['port']}"
        for port in ports:
            if "name" in port:
                env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
            prefix = f"{name}_PORT_{port['port']}_TCP"
            env[prefix] = f"tcp://10.0.0.1:{port['port']}"
            env |= {f"{prefix}_PROTO": "tcp", f"{prefix}_PORT": str(port["port"]), f"{prefix}_ADDR": "10.0.0.1"}
    return env


def processes(
    objects: list[dict[str, Any]],
    workdir: Path,
    secrets: dict[str, dict[str, str]],
    loadlens: str,
    stand_ins: dict[str, list[str]] | None = None,
) -> list[Process]:
    """One process per replica of every loadlens container, and of every container ``stand_ins`` plays
    (container name -> argv; vLLM has no GPU here). Other images are other programs and do not run."""
    out = []
    for wl in _workloads(objects):
        name = wl["metadata"]["name"]
        replicas = int(wl["spec"].get("replicas", 1)) if wl["kind"] == "Deployment" else 1
        pod = wl["spec"]["template"]["spec"]
        for c in pod["containers"]:
            stand_in = (stand_ins or {}).get(c["name"])
            if not c["image"].startswith("loadlens:") and stand_in is None:
                continue
            for replica in range(replicas):
                proc_name = f"{name}-{replica}" if replicas > 1 else name
                volumes: dict[str, str] = {}
                for mount in c.get("volumeMounts", []):
                    path = workdir / "volumes" / proc_name / mount["name"]
                    path.mkdir(parents=True, exist_ok=True)
                    volumes[mount["mountPath"]] = str(path)
                # The kubelet's service links come first; the container's own env overrides them.
                env: dict[str, str] = service_links(objects) if pod.get("enableServiceLinks", True) else {}
                for e in c.get("env", []):
                    if "value" in e:
                        value = str(e["value"])
                        for mount_path in sorted(volumes, key=len, reverse=True):
                            if value == mount_path or value.startswith(mount_path + "/"):
                                value = volumes[mount_path] + value[len(mount_path) :]
                                break
                        env[e["name"]] = value
                    elif "secretKeyRef" in e.get("valueFrom", {}):
                        ref = e["valueFrom"]["secretKeyRef"]
                        if ref["key"] in secrets.get(ref["name"], {}):
                            env[e["name"]] = secrets[ref["name"]][ref["key"]]
                cwd = workdir / "cwd" / proc_name
                cwd.mkdir(parents=True, exist_ok=True)
                ports = [p["containerPort"] for p in c.get("ports", [])]
                argv = stand_in if stand_in is not None else [loadlens, *c["args"]]
                out.append(Process(proc_name, argv, env, str(cwd), ports))
    return out


def _relabel(r: dict[str, Any]) -> dict[str, Any]:
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in r.items()}


def prometheus_config(objects: list[dict[str, Any]], rule_file: str) -> dict[str, Any]:
    """The scrape jobs the Prometheus Operator derives from the monitors (one static target per pod port)."""
    jobs = []
    workloads = _workloads(objects)
    for sm in _by_kind(objects, "ServiceMonitor"):
        for svc in _by_kind(objects, "Service"):
            if not _selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]):
                continue
            pods = [
                w for w in workloads if _selects(svc["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
            ]
            job = svc["metadata"]["labels"].get(sm["spec"].get("jobLabel", ""), svc["metadata"]["name"])
            for i, ep in enumerate(sm["spec"]["endpoints"]):
                port = next(p for p in svc["spec"]["ports"] if p["name"] == ep["port"])
                targets = []
                for pod in pods:
                    container, number = _container_ports(pod)[port["targetPort"]]
                    labels = {
                        "namespace": NAMESPACE,
                        "service": svc["metadata"]["name"],
                        "endpoint": ep["port"],
                        "pod": f"{pod['metadata']['name']}-0",
                        "container": container,
                        "job": job,
                    }
                    targets.append({"targets": [f"127.0.0.1:{number}"], "labels": labels})
                jobs.append(_job(f"serviceMonitor/{NAMESPACE}/{sm['metadata']['name']}/{i}", ep, targets))
    for pm in _by_kind(objects, "PodMonitor"):
        pods = [
            w
            for w in workloads
            if _selects(pm["spec"]["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])
        ]
        for i, ep in enumerate(pm["spec"]["podMetricsEndpoints"]):
            targets = []
            for pod in pods:
                pod_labels = pod["spec"]["template"]["metadata"]["labels"]
                job = pod_labels.get(pm["spec"].get("jobLabel", ""), f"{NAMESPACE}/{pm['metadata']['name']}")
                container, number = _container_ports(pod)[ep["port"]]
                labels = {
                    "namespace": NAMESPACE,
                    "pod": f"{pod['metadata']['name']}-0",
                    "container": container,
                    "job": job,
                    "__meta_kubernetes_pod_node_name": "node-0",
                }
                targets.append({"targets": [f"127.0.0.1:{number}"], "labels": labels})
            jobs.append(_job(f"podMonitor/{NAMESPACE}/{pm['metadata']['name']}/{i}", ep, targets))
    return {
        "global": {"scrape_interval": "30s", "evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [rule_file],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ALERTMANAGER_PORT}"]}]}]},
        "scrape_configs": jobs,
    }


def _job(name: str, endpoint: dict[str, Any], targets: list[dict[str, Any]]) -> dict[str, Any]:
    job: dict[str, Any] = {
        "job_name": name,
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": targets,
        # The operator keeps the target's job label (honor_labels false, but `job` set by relabeling).
        "honor_labels": False,
    }
    if "interval" in endpoint:
        job["scrape_interval"] = endpoint["interval"]
    if "scrapeTimeout" in endpoint:
        job["scrape_timeout"] = endpoint["scrapeTimeout"]
    if endpoint.get("relabelings"):
        job["relabel_configs"] = [_relabel(r) for r in endpoint["relabelings"]]
    return job


def _native_matcher(m: dict[str, str]) -> str:
    value = m["value"].replace("\\", "\\\\").replace('"', '\\"')
    return f'{m["name"]}{m.get("matchType", "=")}"{value}"'


_ROUTE_KEYS = {"receiver": "receiver", "groupBy": "group_by", "groupWait": "group_wait"}
_ROUTE_KEYS |= {"groupInterval": "group_interval", "repeatInterval": "repeat_interval", "continue": "continue"}
_WEBHOOK_KEYS = {"url": "url", "sendResolved": "send_resolved", "maxAlerts": "max_alerts"}


def _native_route(route: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {_ROUTE_KEYS[k]: v for k, v in route.items() if k in _ROUTE_KEYS}
    if "matchers" in route:
        out["matchers"] = [_native_matcher(m) for m in route["matchers"]]
    if "routes" in route:
        out["routes"] = [_native_route(r) for r in route["routes"]]
    return out


def native_config(amc: dict[str, Any]) -> dict[str, Any]:
    """An AlertmanagerConfig read back as an alertmanager.yml: what the operator does, less its namespace
    matcher. Written from the CRD's field names, independently of loadlens/codegen/k8s.py's translation."""
    spec = amc["spec"]
    receivers = []
    for r in spec["receivers"]:
        native: dict[str, Any] = {"name": r["name"]}
        if "webhookConfigs" in r:
            native["webhook_configs"] = [{_WEBHOOK_KEYS[k]: v for k, v in w.items()} for w in r["webhookConfigs"]]
        receivers.append(native)
    inhibit = [
        {
            "source_matchers": [_native_matcher(m) for m in rule["sourceMatch"]],
            "target_matchers": [_native_matcher(m) for m in rule["targetMatch"]],
            "equal": rule["equal"],
        }
        for rule in spec["inhibitRules"]
    ]
    return {"route": _native_route(spec["route"]), "inhibit_rules": inhibit, "receivers": receivers}


def alertmanager_config(amc: dict[str, Any]) -> dict[str, Any]:
    """The AlertmanagerConfig as the operator merges it: its route (and inhibitions) confined to
    `namespace="<its namespace>"`, under a cluster default receiver that gets everything else."""
    native = native_config(amc)
    scope = f'namespace="{NAMESPACE}"'
    route = {**native["route"], "matchers": [scope, *native["route"].get("matchers", [])]}
    return {
        "route": {"receiver": "cluster-default", "group_wait": "1s", "routes": [route]},
        "receivers": [{"name": "cluster-default"}, *native["receivers"]],
        "inhibit_rules": [
            {
                **rule,
                "source_matchers": [scope, *rule["source_matchers"]],
                "target_matchers": [scope, *rule["target_matchers"]],
            }
            for rule in native["inhibit_rules"]
        ],
    }


@contextlib.contextmanager
def run_overlay(
    objects: list[dict[str, Any]],
    workdir: Path,
    *,
    secrets: dict[str, dict[str, str]] | None = None,
    stand_ins: dict[str, list[str]] | None = None,
) -> Iterator[netns.Sandbox]:
    workdir.mkdir(parents=True, exist_ok=True)
    procs = processes(objects, workdir, secrets or {}, netns.loadlens_bin(), stand_ins)
    (workdir / "rules.yaml").write_text(yaml.safe_dump(_by_kind(objects, "PrometheusRule")[0]["spec"]))
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(objects, str(workdir / "rules.yaml"))))
    (workdir / "alertmanager.yml").write_text(
        yaml.safe_dump(alertmanager_config(_by_kind(objects, "AlertmanagerConfig")[0]))
    )
    for d in ("prometheus-data", "alertmanager-data"):
        (workdir / d).mkdir(exist_ok=True)
    infra = [
        Process(
            "prometheus",
            [
                "prometheus",
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
                "--enable-feature=exemplar-storage",
                "--rules.alert.resend-delay=1s",
            ],
            {},
            str(workdir),
            [PROMETHEUS_PORT],
        ),
        Process(
            "alertmanager",
            [
                "prometheus-alertmanager",
                f"--config.file={workdir / 'alertmanager.yml'}",
                f"--storage.path={workdir / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{ALERTMANAGER_PORT}",
                "--cluster.listen-address=",
            ],
            {},
            str(workdir),
            [ALERTMANAGER_PORT],
        ),
    ]
    with netns.run([*infra, *procs], service_names(objects), workdir) as sandbox:
        yield sandbox
