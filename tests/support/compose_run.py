"""Run docker-compose.yml's services for a profile in a sandbox (tests/support/netns.py), as Docker would.

What this adds to the sandbox:

- **Names.** Every service name and network alias of the active services resolves, as on the compose
  network.
- **loadlens services.** Each runs as ``loadlens <command>`` with its ``environment`` interpolated the way
  compose interpolates it, from the variables given (an empty environment otherwise).
  - Named volumes and bind mounts map their container paths to directories here.
  - ``deploy.replicas`` gives the number of processes.
  - A service that exits is restarted (``restart: unless-stopped``).
- **Prometheus and Alertmanager.** They run from the Debian binaries with the compose ``command``. Paths
  are mapped through the service's mounts, and the generated configs in ``deploy/compose/`` are used as they
  are. The one exception is the rule-file glob inside prometheus.yml, which names the container path of the
  ``alerts/`` mount, so a copy maps it the same way.

Grafana, Tempo, the Collector, Loki, Alloy and vLLM are images of other programs and do not run here. The
sandbox's stand-in receives OTLP/HTTP on ``otel-collector:4318``, and a test may name a stand-in program for
a service (``loadlens serve --engine sim`` for vLLM, which emits vLLM's own ``vllm:*`` series).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support import netns
from tests.support.netns import Process
from tests.support.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
# Image -> the Debian binary that is the same program.
BINARIES = {"prom/prometheus": "prometheus", "prom/alertmanager": "prometheus-alertmanager"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose interpolation: `${X:-d}` (unset or empty -> d), `${X-d}` (unset -> d), `${X:?m}`, `${X}`."""

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return value if value is not None else arg
        if op == ":?" and not value:
            raise ValueError(f"{name}: {arg}")
        return value or ""

    return _VAR.sub(sub, value)


def active_services(profile: str) -> dict[str, dict[str, Any]]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {n: s for n, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


def names(services: Mapping[str, dict[str, Any]]) -> list[str]:
    out = []
    for name, svc in services.items():
        out.append(name)
        for net in (svc.get("networks") or {}).values():
            out += (net or {}).get("aliases", [])
    return out


def _mounts(svc: dict[str, Any], workdir: Path) -> dict[str, str]:
    """Container path -> path here, for every bind mount and named volume of the service."""
    out = {}
    for spec in svc.get("volumes", []):
        source, target = str(spec).split(":")[:2]
        if source.startswith("./"):
            out[target] = str(ROOT / source[2:])
        elif not source.startswith("/"):
            path = workdir / "volumes" / source
            path.mkdir(parents=True, exist_ok=True)
            out[target] = str(path)
    return out


def _map(value: str, mounts: Mapping[str, str]) -> str:
    """A container path (or a `--flag=PATH`) -> the path here, through the service's mounts."""
    if value.startswith("--") and "=" in value:
        flag, _, rest = value.partition("=")
        return f"{flag}={_map(rest, mounts)}"
    for target in sorted(mounts, key=len, reverse=True):
        if value == target or value.startswith(target + "/"):
            return mounts[target] + value[len(target) :]
    return value


def processes(
    profile: str, workdir: Path, env: Mapping[str, str], stand_ins: Mapping[str, list[str]] | None = None
) -> list[Process]:
    """``stand_ins``: service name -> the argv of a program that plays it here (vLLM has no GPU to run on)."""
    out = []
    for name, svc in active_services(profile).items():
        image = interpolate(str(svc["image"]), env)
        repo = image.rsplit(":", 1)[0]
        mounts = _mounts(svc, workdir)
        environment = {k: interpolate(str(v), env) for k, v in (svc.get("environment") or {}).items()}
        environment = {k: _map(v, mounts) for k, v in environment.items()}
        command = [_map(interpolate(str(c), env), mounts) for c in svc.get("command", [])]
        if stand_ins and name in stand_ins:
            argv = list(stand_ins[name])
        elif repo == "loadlens":
            argv = [netns.loadlens_bin(), *command]
        elif repo in BINARIES:
            argv = [BINARIES[repo], *command]
        else:
            continue  # Grafana, Tempo, the Collector, Loki, Alloy, vLLM: not runnable here
        if repo == "prom/prometheus":
            argv = [_prometheus_config_copy(a, mounts, workdir) for a in argv]
        replicas = int(interpolate(str(svc.get("deploy", {}).get("replicas", 1)), env))
        ports = sorted(
            {int(str(p).split(":")[-1]) for p in svc.get("ports", [])} | _health_ports(svc) | _port_flag(command)
        )
        for i in range(replicas):
            proc_name = f"{name}-{i}" if replicas > 1 else name
            cwd = workdir / "cwd" / proc_name
            cwd.mkdir(parents=True, exist_ok=True)
            out.append(Process(proc_name, argv, environment, mounts.get("/data", str(cwd)), ports if i == 0 else []))
    return out


def _prometheus_config_copy(arg: str, mounts: Mapping[str, str], workdir: Path) -> str:
    if not arg.startswith("--config.file="):
        return arg
    config = yaml.safe_load(Path(arg.split("=", 1)[1]).read_text())
    config["rule_files"] = [_map(f, mounts) for f in config.get("rule_files", [])]
    copy = workdir / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    return f"--config.file={copy}"


def healthcheck_url(svc: dict[str, Any]) -> str | None:
    """The URL a service's healthcheck asks (its commands are `wget`/`urlopen` of one URL)."""
    test = " ".join(map(str, (svc.get("healthcheck") or {}).get("test", [])))
    m = re.search(r"(http://127\.0\.0\.1:\d+[^\s'\"]*)", test)
    return m.group(1) if m else None


def _port_flag(command: list[str]) -> set[int]:
    return {int(command[command.index("--port") + 1])} if "--port" in command else set()


def _health_ports(svc: dict[str, Any]) -> set[int]:
    url = healthcheck_url(svc)
    return {int(url.split(":")[2].split("/")[0])} if url else set()


@contextlib.contextmanager
def run_profile(
    profile: str, workdir: Path, env: Mapping[str, str], stand_ins: Mapping[str, list[str]] | None = None
) -> Iterator[netns.Sandbox]:
    workdir.mkdir(parents=True, exist_ok=True)
    procs = processes(profile, workdir, env, stand_ins)
    with netns.run(procs, names(active_services(profile)), workdir) as sandbox:
        yield sandbox
