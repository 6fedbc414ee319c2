"""docker-compose.yml, statically: schema, pinned images, files, ports, services and configs agree."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loadlens.contracts.ports import PORT, PORTS
from tests.deploy.support import (
    COMPOSE,
    DEPLOY_README,
    ROOT,
    SCHEMAS,
    SCHEMAS_MISSING,
    aliases,
    bind_mounts,
    compose,
    environment,
    hostnames,
    interpolate,
    load_yaml,
    published_ports,
    services,
    variables,
)
from tests.support import required

LOADLENS_IMAGE_PREFIX = "loadlens:"
# Images without a shell or HTTP client, and Locust workers (no listening port): documented in deploy/README.md.
NO_HEALTHCHECK = {"otel-collector", "tempo", "loki", "alloy", "locust-worker"}


def _loadlens_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services().items() if str(s.get("image", "")).startswith(LOADLENS_IMAGE_PREFIX)}


def _profiles(service: dict[str, Any]) -> set[str]:
    return set(service.get("profiles", []))


def test_compose_validates_against_the_compose_spec() -> None:
    schema_file = SCHEMAS / "compose-spec.json"
    if not schema_file.exists():
        required.unavailable(f"compose schema not found at {schema_file} ({SCHEMAS_MISSING})")
    jsonschema = required.require_module("jsonschema")
    schema = json.loads(schema_file.read_text())
    # The schema names draft-07 without a trailing '#', which jsonschema does not recognise by itself.
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_profiles() -> None:
    svc = services()
    by_profile: dict[str, set[str]] = {}
    for name, s in svc.items():
        for p in _profiles(s) or {"always"}:
            by_profile.setdefault(p, set()).add(name)
    assert by_profile["gpu"] == {"vllm", "serve-gpu", "gpu-exporter-nvml"}
    assert by_profile["sim"] == {"serve-sim", "gpu-exporter-sim"}
    assert by_profile["logs"] == {"loki", "alloy"}
    assert {
        "prometheus",
        "alertmanager",
        "grafana",
        "otel-collector",
        "tempo",
        "locust-master",
        "locust-worker",
        "pager",
    } <= by_profile["always"]


def test_images_are_pinned() -> None:
    for name, s in services().items():
        image = interpolate(str(s["image"]))
        repo, _, tag = image.rpartition(":")
        assert repo and tag and "/" not in tag, f"{name}: image {s['image']!r} has no tag"
        assert tag != "latest" and "latest" not in image, f"{name}: {image} is not pinned"


def test_loadlens_image_is_built_from_the_dockerfile_at_the_project_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    loadlens = _loadlens_services()
    assert {"serve-sim", "serve-gpu", "gpu-exporter-sim", "gpu-exporter-nvml", "pager", "locust-master"} <= set(
        loadlens
    )
    for name, s in loadlens.items():
        assert interpolate(s["image"]) == f"loadlens:{version}", name
        build = s["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
        assert s["user"] != "0" and not str(s["user"]).startswith("0:") and s["user"] != "root", name


def test_gpu_profile_serves_vllm_through_the_loadlens_proxy() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    svc = services()
    vllm = svc["vllm"]
    # vLLM's release, with loadlens installed so its plugin runs the probe in the GPU workers.
    assert interpolate(vllm["image"]) == f"loadlens-vllm:{version}"
    assert vllm["build"]["dockerfile"] == "Dockerfile.vllm"
    assert vllm["build"]["args"]["VLLM_IMAGE"].startswith("vllm/vllm-openai:v")
    assert vllm["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    command = [interpolate(str(c)) for c in vllm["command"]]
    vllm_port = int(command[command.index("--port") + 1])
    assert vllm_port == PORT["upstream"]
    assert "--model" in command and command[command.index("--model") + 1]
    env = environment(svc["serve-gpu"])
    assert env["LOADLENS_ENGINE"] == "openai"
    upstream = urlsplit(env["LOADLENS_UPSTREAM"])
    assert (upstream.hostname, upstream.port) == ("vllm", vllm_port)
    assert svc["serve-gpu"]["depends_on"]["vllm"]["condition"] == "service_healthy"

    gpu = svc["gpu-exporter-nvml"]
    assert gpu["pid"] == "host"
    assert environment(gpu)["LOADLENS_GPU_EXPORTER_BACKEND"] == "nvml"
    # The probe's documents cross from vLLM's workers to the exporter through one named volume.
    probe_dir = environment(vllm)["LOADLENS_PROBE_DIR"]
    assert environment(vllm)["LOADLENS_VLLM_PROBE"] == "1"
    assert environment(gpu)["LOADLENS_GPU_EXPORTER_PROBE_DIR"] == probe_dir
    assert f"probe:{probe_dir}" in vllm["volumes"] and f"probe:{probe_dir}:ro" in gpu["volumes"]
    assert "probe" in compose()["volumes"]
    for name in ("vllm", "gpu-exporter-nvml"):
        devices = svc[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name


def test_vllm_metrics_join_the_serving_job_only_where_vllm_runs() -> None:
    svc = services()
    prom = svc["prometheus"]
    config_path = next(c.split("=", 1)[1] for c in prom["command"] if c.startswith("--config.file="))
    jobs = {c["job_name"]: c for c in load_yaml(_host_path(prom, config_path))["scrape_configs"]}
    (sd,) = jobs["loadlens-serve"]["dns_sd_configs"]
    command = [interpolate(str(c)) for c in svc["vllm"]["command"]]
    # vllm:* series from a real vLLM land in the job the rules and dashboards select (job="loadlens-serve").
    # An sglang upstream is discovered under its own name on the same port (docs/metrics.md, sglang).
    assert sd["names"] == ["vllm", "sglang"] and sd["type"] == "A"
    assert sd["port"] == int(command[command.index("--port") + 1])
    # Discovery, not a static target: in profile sim `vllm` does not resolve, so no target is down.
    assert _profiles(svc["vllm"]) == {"gpu"}
    assert "vllm:8001" not in str(jobs["loadlens-serve"]["static_configs"])
    # ...and its instance is named like a static target, not by the container's changing IP.
    (relabel,) = jobs["loadlens-serve"]["relabel_configs"]
    assert relabel["source_labels"] == ["__meta_dns_name"] and relabel["target_label"] == "instance"
    assert relabel["replacement"] == f"$1:{sd['port']}"


def test_sim_profile() -> None:
    svc = services()
    assert environment(svc["serve-sim"])["LOADLENS_ENGINE"] == "sim"
    env = environment(svc["gpu-exporter-sim"])
    assert env["LOADLENS_GPU_EXPORTER_BACKEND"] == "sim"
    url = urlsplit(env["LOADLENS_GPU_EXPORTER_SIM_URL"])
    assert url.hostname in hostnames() and url.port == PORT["serve"] and url.path == "/sim/device-state"


def test_serve_and_gpu_exporter_have_one_name_in_either_profile() -> None:
    svc = services()
    for alias, names in {
        "serve": ("serve-sim", "serve-gpu"),
        "gpu-exporter": ("gpu-exporter-sim", "gpu-exporter-nvml"),
    }.items():
        for name in names:
            assert alias in aliases(name, svc[name]), name


def test_loadlens_ports_agree_with_the_ports_table() -> None:
    svc = services()
    port_vars = {
        "LOADLENS_PORT": "serve",
        "LOADLENS_GPU_EXPORTER_PORT": "gpu",
        "LOADLENS_PAGER_PORT": "pager",
        "LOADLENS_LOAD_METRICS_PORT": "loadgen",
        "LOADLENS_LOAD_WEB_PORT": "locust-ui",
    }
    seen = set()
    for name, s in _loadlens_services().items():
        env = environment(s)
        for var, port_name in port_vars.items():
            if var in env:
                assert int(env[var]) == PORT[port_name], f"{name}: {var}={env[var]}"
                seen.add(port_name)
        for _host, container in published_ports(s):
            assert container in {PORT[p] for p in port_vars.values()}, f"{name}: publishes {container}"
    assert seen == set(port_vars.values())
    assert published_ports(svc["prometheus"]) == [(PORT["prometheus"], 9090)]
    assert published_ports(svc["alertmanager"]) == [(PORT["alertmanager"], 9093)]


def test_only_documented_host_ports() -> None:
    published: dict[int, set[str]] = {}
    for name, s in services().items():
        for host, _container in published_ports(s):
            published.setdefault(host, set()).add(name)
    text = DEPLOY_README.read_text()
    section = text.split("## Host ports", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)}
    assert set(published) == documented
    for host, names in published.items():
        row = next(line for line in section.splitlines() if line.startswith(f"| {host} |"))
        for name in names:
            assert name in row, f"deploy/README.md: port {host} row does not name {name}"
    # Two services on one host port only when they are alternatives (sim vs gpu).
    for host, names in published.items():
        if len(names) > 1:
            profiles = [_profiles(services()[n]) for n in names]
            assert all(len(p) == 1 for p in profiles) and len(set.union(*profiles)) == len(names), host


def test_every_bind_mounted_file_exists() -> None:
    for name, s in services().items():
        for source, _target in bind_mounts(s):
            assert (ROOT / source).exists(), f"{name}: mounts missing ./{source}"


def test_named_volumes_are_declared_and_used() -> None:
    declared = set(compose()["volumes"])
    used = set()
    for name, s in services().items():
        for spec in s.get("volumes", []):
            source = str(spec).split(":")[0]
            if source.startswith(("./", "/")):
                continue
            assert source in declared, f"{name}: volume {source} is not declared"
            used.add(source)
    assert used == declared
    assert "prometheus-data:/prometheus" in services()["prometheus"]["volumes"]


def test_depends_on_and_healthchecks() -> None:
    svc = services()
    for name, s in svc.items():
        deps = s.get("depends_on") or {}
        for dep, spec in deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps):
            assert dep in svc, f"{name} depends on unknown {dep}"
            assert _profiles(svc[dep]) <= _profiles(s) or not _profiles(svc[dep]), f"{name} -> {dep}: profiles"
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in svc[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
        if name in NO_HEALTHCHECK:
            assert "healthcheck" not in s
        else:
            assert s["healthcheck"]["test"], name
    readme = DEPLOY_README.read_text()
    for name in NO_HEALTHCHECK:
        assert f"`{name}`" in readme, f"deploy/README.md does not explain why {name} has no healthcheck"


def _mount_target(service: dict[str, Any], source: str) -> str:
    return next(target for src, target in bind_mounts(service) if src == source)


def _host_path(service: dict[str, Any], container_path: str) -> Path:
    """The repository path a container path comes from (through the service's bind mounts)."""
    best = max(
        (m for m in bind_mounts(service) if container_path == m[1] or container_path.startswith(m[1] + "/")),
        key=lambda m: len(m[1]),
    )
    return ROOT / best[0] / container_path[len(best[1]) :].lstrip("/")


def test_prometheus_config_agrees_with_compose() -> None:
    svc = services()
    prom = svc["prometheus"]
    command = prom["command"]
    assert "--enable-feature=exemplar-storage" in command
    config_path = next(c.split("=", 1)[1] for c in command if c.startswith("--config.file="))
    config = load_yaml(_host_path(prom, config_path))
    names = hostnames()
    jobs = {c["job_name"]: c["static_configs"][0]["targets"] for c in config["scrape_configs"]}
    for p in PORTS:
        if p.job is not None:
            assert p.job in jobs, f"no scrape job {p.job}"
            for target in jobs[p.job]:
                host, port = target.rsplit(":", 1)
                assert host in names, f"{p.job}: {host} is no compose service"
                assert int(port) == p.port, f"{p.job}: {target} vs PORTS {p.port}"
    for job, targets in jobs.items():
        for target in targets:
            assert target.rsplit(":", 1)[0] in names, f"{job}: {target}"
    # Rule files resolve (through the alerts/ mount) to the generated rule files.
    for pattern in config["rule_files"]:
        host = _host_path(prom, pattern)
        matched = [f.name for f in host.parent.iterdir() if fnmatch.fnmatch(f.name, host.name)]
        assert sorted(matched) == ["loadlens-alerts.yaml", "loadlens-rules.yaml"], pattern
    am_targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am_targets == ["alertmanager:9093"]


def test_alertmanager_config_routes_to_the_pager() -> None:
    svc = services()
    am = svc["alertmanager"]
    config_path = next(c.split("=", 1)[1] for c in am["command"] if c.startswith("--config.file="))
    config = load_yaml(_host_path(am, config_path))
    pager_env = environment(svc["pager"])
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            url = urlsplit(hook["url"])
            assert url.hostname == "pager" and url.port == int(pager_env["LOADLENS_PAGER_PORT"]), hook["url"]
            assert url.path == "/alerts"


def test_grafana_provisioning_agrees_with_compose() -> None:
    grafana = services()["grafana"]
    env = grafana["environment"]
    assert [op for _n, op in variables(env["GF_SECURITY_ADMIN_PASSWORD"])] == [":?"], "no default admin password"
    providers = load_yaml(_host_path(grafana, "/etc/grafana/provisioning/dashboards/loadlens.yaml"))["providers"]
    for provider in providers:
        folder = _host_path(grafana, provider["options"]["path"])
        assert folder == ROOT / "dashboards"
        assert sorted(folder.glob("*.json")), "no dashboards to provision"
    datasources = []
    for source, target in bind_mounts(grafana):
        if target.startswith("/etc/grafana/provisioning/datasources/"):
            datasources += load_yaml(ROOT / source)["datasources"]
    uids = {d["uid"] for d in datasources}
    names = hostnames()
    for ds in datasources:
        url = urlsplit(ds["url"])
        assert url.hostname in names, f"datasource {ds['name']}: {ds['url']}"
        for link in ds.get("jsonData", {}).get("exemplarTraceIdDestinations", []):
            assert link["datasourceUid"] in uids
    prom_ds = next(d for d in datasources if d["type"] == "prometheus")
    assert urlsplit(prom_ds["url"]).port == 9090


def test_locust_master_and_workers() -> None:
    svc = services()
    master, worker = environment(svc["locust-master"]), environment(svc["locust-worker"])
    assert int(master["LOADLENS_LOAD_EXPECT_WORKERS"]) >= 1
    assert worker["LOADLENS_LOAD_MASTER_HOST"] in aliases("locust-master", svc["locust-master"])
    assert master["LOADLENS_LOAD_MASTER_PORT"] == worker["LOADLENS_LOAD_MASTER_PORT"]
    assert master["LOADLENS_LOAD_HOST"] == worker["LOADLENS_LOAD_HOST"]
    assert master["LOADLENS_LOAD_PROFILE"] == worker["LOADLENS_LOAD_PROFILE"]
    target = urlsplit(master["LOADLENS_LOAD_HOST"])
    assert target.hostname in hostnames() and target.port == PORT["serve"]
    assert "container_name" not in svc["locust-worker"], "a fixed name would stop the workers from scaling"


def test_tracing_reaches_the_collector_and_the_trace_store() -> None:
    svc = services()
    collector = load_yaml(ROOT / "otel-collector.yaml")
    http_port = int(collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1])
    for name in ("serve-sim", "serve-gpu"):
        url = urlsplit(environment(svc[name])["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert (url.hostname, url.port) == ("otel-collector", http_port), name
    assert _mount_target(svc["otel-collector"], "otel-collector.yaml") in " ".join(svc["otel-collector"]["command"])
    tempo_endpoint = collector["exporters"]["otlp_grpc/tempo"]["endpoint"]
    host, port = tempo_endpoint.rsplit(":", 1)
    assert host == "tempo" and host in svc
    tempo = load_yaml(ROOT / "deploy" / "compose" / "tempo.yaml")
    tempo_grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert tempo_grpc.rsplit(":", 1)[1] == port


def test_loadlens_environment_variables_are_documented() -> None:
    docs = "".join((ROOT / "docs" / f).read_text() for f in ("serving.md", "gpu-exporter.md", "loadgen.md"))
    pager_cli = (ROOT / "loadlens" / "pager" / "cli.py").read_text()
    for name, s in _loadlens_services().items():
        for var in environment(s):
            if var.startswith("LOADLENS_PAGER_"):
                flag = "--" + var.removeprefix("LOADLENS_PAGER_").lower().replace("_", "-")
                assert f'"{flag}"' in pager_cli, f"{name}: {var}"
            elif var.startswith("LOADLENS_"):
                assert f"`{var}`" in docs, f"{name}: {var} is not a documented variable"


def test_compose_file_is_at_the_repository_root() -> None:
    assert COMPOSE.parent == ROOT
