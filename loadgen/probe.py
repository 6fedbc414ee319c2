"""``GET /v1/models``: is the target up, and which model does it serve first?

Used by ``loadlens load`` before Locust starts and by each Locust process (plain ``locust -f`` has no CLI in
front of it). Standard library only, so it works both in the CLI and under gevent's patching.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

PROBE_TIMEOUT_S = 5.0


class TargetUnreachable(RuntimeError):
    """One line saying why the target cannot be used (no ``error:`` prefix: callers add their own)."""


def models_url(base: str) -> str:
    """The models endpoint of a base URL; a trailing ``/v1`` is accepted, a path prefix is kept."""
    return base.rstrip("/").removesuffix("/v1") + "/v1/models"


def first_model(base: str, api_key: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> str:
    """The first base model (not a LoRA adapter, which names a ``parent``) the target lists."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(models_url(base), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as err:
        raise TargetUnreachable(f"target {base} answered GET /v1/models with HTTP {err.code}") from err
    except (OSError, ValueError) as err:  # URLError is an OSError; ValueError: a malformed URL
        reason = getattr(err, "reason", err)
        raise TargetUnreachable(f"cannot reach target {base}: {reason or type(err).__name__}") from err
    if status != 200:
        raise TargetUnreachable(f"target {base} answered GET /v1/models with HTTP {status}")
    try:
        doc = json.loads(body)
    except ValueError as err:
        raise TargetUnreachable(f"target {base}: /v1/models is not JSON") from err
    models = (doc.get("data") if isinstance(doc, dict) else None) or []
    base_models = [m for m in models if isinstance(m, dict) and not m.get("parent")] or models
    if not base_models or not isinstance(base_models[0], dict) or "id" not in base_models[0]:
        raise TargetUnreachable(f"target {base} lists no models at /v1/models")
    return str(base_models[0]["id"])
