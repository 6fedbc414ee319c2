"""Ports and generated configs of the local stack (Prometheus, Alertmanager) — one table for every process.

``PORTS`` is the single table of default ports; docs/architecture.md shows it, the local stack, compose
and k8s use it. The local stack's Prometheus and Alertmanager listen on 19090/19093 so they never collide
with a Prometheus or Alertmanager already running on the well-known 9090/9093.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Port:
    name: str
    port: int
    job: str | None
    what: str


PORTS: tuple[Port, ...] = (
    Port("serve", 8000, "loadlens-serve", "loadlens serve: OpenAI API, /metrics, /health, /sim/device-state"),
    Port("upstream", 8001, None, "a real vLLM behind `loadlens serve --engine openai`"),
    Port("gpu", 9400, "loadlens-gpu", "loadlens gpu-exporter: /metrics, /health"),
    Port("pager", 9095, "loadlens-pager", "loadlens pager: Alertmanager webhook receiver, /metrics"),
    Port("loadgen", 9646, "loadlens-loadgen", "loadlens load: client-side /metrics while a test runs"),
    Port("locust-ui", 8089, None, "Locust web UI (interactive runs)"),
    Port("prometheus", 19090, None, "Prometheus of the local stack (containers: 9090)"),
    Port("alertmanager", 19093, None, "Alertmanager of the local stack (containers: 9093)"),
)
PORT = {p.name: p.port for p in PORTS}


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
