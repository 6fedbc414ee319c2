"""Shared loading for the deployment tests (static: nothing here needs Docker)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).resolve().parents[2].parent / "shared" / "schemas"
COMPOSE = ROOT / "docker-compose.yml"
COLLECTOR = ROOT / "otel-collector.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY_README = ROOT / "deploy" / "README.md"

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose() -> dict[str, Any]:
    doc = load_yaml(COMPOSE)
    assert isinstance(doc, dict)
    return doc


def interpolate(value: str) -> str:
    """Compose interpolation with an empty environment: `${X:-d}` -> d, `${X:?msg}` and `${X}` -> ''."""
    return _VAR.sub(lambda m: m.group(3) if m.group(2) in {":-", "-"} else "", value)


def variables(value: str) -> list[tuple[str, str | None]]:
    """(name, operator) of every `${...}` in value."""
    return [(m.group(1), m.group(2)) for m in _VAR.finditer(value)]


def services() -> dict[str, dict[str, Any]]:
    svc = compose()["services"]
    assert isinstance(svc, dict)
    return svc


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v)) for k, v in env.items()}


def aliases(name: str, service: dict[str, Any]) -> set[str]:
    names = {name}
    networks = service.get("networks") or {}
    if isinstance(networks, dict):
        for net in networks.values():
            names.update((net or {}).get("aliases", []))
    return names


def hostnames() -> dict[str, str]:
    """Every name reachable on the compose network -> the service it belongs to (aliases included)."""
    out: dict[str, str] = {}
    for name, svc in services().items():
        for alias in aliases(name, svc):
            out.setdefault(alias, name)
    return out


def published_ports(service: dict[str, Any]) -> list[tuple[int, int]]:
    """(host port, container port) for every published port of a service (short syntax "H:C")."""
    out = []
    for spec in service.get("ports", []):
        parts = str(spec).split("/")[0].split(":")
        assert len(parts) == 2, f"publish ports as 'HOST:CONTAINER' (no bind address): {spec}"
        out.append((int(parts[0]), int(parts[1])))
    return out


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source relative to the repo, target) of every bind mount from the repository ('./...')."""
    out = []
    for spec in service.get("volumes", []):
        source, target = str(spec).split(":")[:2]
        if source.startswith("./"):
            out.append((source[2:], target))
    return out
