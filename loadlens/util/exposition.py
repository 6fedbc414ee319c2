"""Prometheus exposition with content negotiation, keeping colon names intact in OpenMetrics.

prometheus_client 0.26 writes OpenMetrics sample names through a label-name escaper, so with its default
"underscores" escaping ``vllm:num_requests_running`` is exposed as ``vllm_num_requests_running`` while its
``# TYPE`` line keeps the colon. Prometheus asks for OpenMetrics first, so vLLM-compatible dashboards would
see nothing. Every loadlens name is a valid legacy name, which the "allow-utf-8" escaping writes verbatim.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def wants_openmetrics(accept: str | None) -> bool:
    """Whether an Accept header accepts OpenMetrics (any ``application/openmetrics-text`` with q > 0)."""
    return _accepted(accept, "application/openmetrics-text")


TEXT = "text"
OPENMETRICS = "openmetrics"


def _accepted(accept: str | None, media_type: str) -> bool:
    """Whether the Accept header lists ``media_type`` with q > 0 (a missing q is 1)."""
    for part in (accept or "").split(","):
        fields = [f.strip() for f in part.split(";")]
        if fields[0] != media_type:
            continue
        q = next((f[2:] for f in fields[1:] if f.startswith("q=")), "1")
        try:
            if float(q) > 0:
                return True
        except ValueError:
            continue
    return False


def negotiate(accept: str | None, *, prefer_text: bool = False) -> str:
    """The one content negotiation of every loadlens /metrics: :data:`OPENMETRICS` or :data:`TEXT`.

    OpenMetrics when the client accepts it (Prometheus always does, and the serving layer needs it for its
    exemplars). ``prefer_text``: a server without exemplars and with a faster text encoder (the GPU exporter)
    answers text whenever the client accepts text too, and OpenMetrics only to a client that asks for nothing
    else.
    """
    if not _accepted(accept, "application/openmetrics-text"):
        return TEXT
    if prefer_text and _accepted(accept, "text/plain"):
        return TEXT
    return OPENMETRICS


def openmetrics_bytes(registry: CollectorRegistry) -> bytes:
    """OpenMetrics 1.0.0 with colon names intact (see the module docstring)."""
    body: bytes = openmetrics.generate_latest(registry, escaping=openmetrics.ALLOWUTF8)  # type: ignore[no-untyped-call]
    return body


def render(
    registry: CollectorRegistry,
    accept: str | None = None,
    *,
    text_encoder: Callable[[CollectorRegistry], bytes] = generate_latest,
) -> tuple[bytes, str]:
    """The /metrics answer for a scrape: ``(body, content_type)``, chosen from the raw Accept header value.

    OpenMetrics 1.0.0 (with exemplars, colon names intact) when ``accept`` accepts it, else text 0.0.4 written
    by ``text_encoder`` (a server with a faster encoder of the same format passes its own). ``accept`` is the
    header string as received, or None when absent, so any server can call it::

        body, content_type = render(registry, request.headers.get("accept"))   # Starlette
        body, content_type = render(registry, self.headers.get("Accept"))      # http.server handler
    """
    if negotiate(accept) == OPENMETRICS:
        return openmetrics_bytes(registry), OPENMETRICS_CONTENT_TYPE
    return text_encoder(registry), TEXT_CONTENT_TYPE
