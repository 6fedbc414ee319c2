"""Shared loading for the deployment tests (static: nothing here needs Docker)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.support import required
from tests.support.paths import ROOT

SCHEMAS = Path(__file__).resolve().parents[2].parent / "shared" / "schemas"
# Why a schema check cannot run (a skip on a laptop, a failure under CI): the upstream JSON Schemas are not
# checked into this repository.
SCHEMAS_MISSING = (
    "the upstream JSON Schemas are kept in ../shared/schemas/ beside this checkout, as CI has them; "
    "without them this check cannot run"
)
COMPOSE = ROOT / "docker-compose.yml"
COLLECTOR = ROOT / "otel-collector.yaml"
DOCKERFILE = ROOT / "Dockerfile"
VLLM_DOCKERFILE = ROOT / "Dockerfile.vllm"
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


# --- Kubernetes -------------------------------------------------------------------------------------------
K8S = ROOT / "k8s"
OVERLAYS = ("sim", "gpu")
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"


class _KubeLoader(yaml.SafeLoader):
    """YAML 1.1 gives a bare ``=`` the 'value' tag, which PyYAML cannot build; Kubernetes reads it as a string
    (kustomize writes AlertmanagerConfig's ``matchType: =`` unquoted)."""


_KubeLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def load_documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=_KubeLoader) if d]


def kubectl() -> str:
    """kubectl v1.33 with kustomize v5, put in .tools/ by scripts/k8s-tools.sh (make test runs it).

    Outside CI a missing binary skips the rendering tests; under CI (CI set) it fails them, so a broken
    set-up can never pass silently.
    """
    if KUBECTL.is_file():
        return str(KUBECTL)
    return required.require_binary("kubectl", how="run scripts/k8s-tools.sh (make test does)")


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def render(path: str) -> list[dict[str, Any]]:
    """`kubectl kustomize k8s/<path>`: the objects `kubectl apply -k` would send."""
    import subprocess

    if path not in _RENDERED:
        result = subprocess.run(
            [kubectl(), "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, f"kustomize {path}: {result.stderr}"
        _RENDERED[path] = load_documents(result.stdout)
    return _RENDERED[path]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}}
