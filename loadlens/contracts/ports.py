"""The one table of default ports and Prometheus job names of every loadlens process.

The local stack, compose and k8s use it (compose and k8s are checked against it), docs/architecture.md shows
it (a test keeps that table equal), and the alert rules, dashboards and server-side queries select the
jobs named here. The local stack's Prometheus and Alertmanager listen on 19090/19093 so they never collide
with a Prometheus or Alertmanager already running on the well-known 9090/9093.
"""

from __future__ import annotations

from dataclasses import dataclass

# The Prometheus job of each process that exposes /metrics.
SERVE_JOB = "loadlens-serve"
GPU_JOB = "loadlens-gpu"
PAGER_JOB = "loadlens-pager"
LOADGEN_JOB = "loadlens-loadgen"
# A training run's /metrics (exporters/training). The local stack scrapes it under this job; its PORTS row
# names no job until compose and k8s scrape it too (their tests check every job of the table is scraped).
TRAINING_JOB = "loadlens-training"


@dataclass(frozen=True)
class Port:
    name: str
    port: int
    job: str | None
    what: str


PORTS: tuple[Port, ...] = (
    Port("serve", 8000, SERVE_JOB, "loadlens serve: OpenAI API, /metrics, /health, /sim/device-state"),
    Port("upstream", 8001, None, "a real vLLM behind `loadlens serve --engine openai`"),
    Port("gpu", 9400, GPU_JOB, "loadlens gpu-exporter: /metrics, /health"),
    Port("pager", 9095, PAGER_JOB, "loadlens pager: Alertmanager webhook receiver, /metrics"),
    Port("loadgen", 9646, LOADGEN_JOB, "loadlens load: client-side /metrics while a test runs"),
    Port("training", 9647, None, "a training run's /metrics (TrainerCallback or hook; make train-demo)"),
    Port("locust-ui", 8089, None, "Locust web UI (interactive runs)"),
    Port("prometheus", 19090, None, "Prometheus of the local stack (containers: 9090)"),
    Port("alertmanager", 19093, None, "Alertmanager of the local stack (containers: 9093)"),
)
PORT = {p.name: p.port for p in PORTS}
# Port name -> its job, for the processes Prometheus scrapes.
JOBS: dict[str, str] = {p.name: p.job for p in PORTS if p.job}


def job_selector(job: str) -> str:
    """The PromQL label matcher that selects one job: ``job="loadlens-serve"``."""
    return f'job="{job}"'
