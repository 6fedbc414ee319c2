"""The proxy's own series (docs/metrics.md): failures it answers for, retries, where token counts came from,
and the kind of upstream it drives."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from exporters.serving.engines.openai import upstream_kinds
from exporters.serving.engines.openai.errors import FAILURE_REASONS, RETRY_REASONS
from exporters.serving.engines.openai.frames import TOKEN_SOURCES


class ProxyMetrics:
    """The proxy's own series: failures it answers for and the retries it made (docs/metrics.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.failures = Counter(
            "loadlens_proxy_upstream_failures",
            "Requests the proxy failed itself because the upstream could not be used, by reason.",
            ["reason"],
            registry=registry,
        )
        self.retries = Counter(
            "loadlens_proxy_upstream_retries",
            "Requests sent again because the first try provably never reached the upstream, by reason.",
            ["reason"],
            registry=registry,
        )
        self.token_counts = Counter(
            "loadlens_proxy_token_counts",
            "Finished streams by where their output-token counts came from (usage, final_usage, chunks).",
            ["source"],
            registry=registry,
        )
        self.upstream_info = Gauge(
            "loadlens_proxy_upstream_info",
            "1 for the kind of upstream the proxy drives (--upstream-kind, or detected by auto).",
            ["upstream_kind"],
            registry=registry,
        )
        self._failures = {reason: self.failures.labels(reason) for reason in FAILURE_REASONS}
        self._retries = {reason: self.retries.labels(reason) for reason in RETRY_REASONS}
        self._token_counts = {source: self.token_counts.labels(source) for source in TOKEN_SOURCES}
        self.upstream_info.labels(upstream_kinds.UNKNOWN).set(1)

    def failure(self, reason: str) -> None:
        self._failures[reason].inc()

    def retry(self, reason: str) -> None:
        self._retries[reason].inc()

    def token_source(self, source: str) -> None:
        self._token_counts[source].inc()

    def set_kind(self, kind: str) -> None:
        """One series at 1: the kind in use (``unknown`` until ``auto`` has seen the upstream)."""
        self.upstream_info.clear()
        self.upstream_info.labels(kind).set(1)
