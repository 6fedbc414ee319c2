"""The Prometheus config that loadlens runs with: the local stack writes it with 127.0.0.1 targets, the
compose generator with container names (one builder, so the two never drift)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def prometheus_config(
    targets: Mapping[str, Sequence[str]],
    *,
    rule_files: Sequence[str],
    alertmanagers: Sequence[str],
    scrape_interval: str = "5s",
    evaluation_interval: str = "5s",
) -> dict[str, Any]:
    """``targets``: Prometheus job name -> host:port list. Every job scrapes /metrics."""
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": evaluation_interval,
            "external_labels": {"stack": "loadlens"},
        },
        "rule_files": list(rule_files),
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]},
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": list(hosts)}]}
            for job, hosts in targets.items()
        ],
    }
