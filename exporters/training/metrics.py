"""The ``loadlens_training_*`` series (docs/metrics.md) on a registry of their own, and their /metrics server.

Each ``TrainingMetrics`` owns a fresh ``CollectorRegistry``, so tests and several runs in one process never
collide in the global registry. ``serve()`` exposes it on ``/metrics`` (content negotiation as every
loadlens process) and answers ``/health``, in a daemon thread beside the training loop.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge

from loadlens.util.exposition import render

RUN = ("run",)


class TrainingMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.loss = Gauge(
            "loadlens_training_loss", "Training loss of the last optimiser step (or log interval).", RUN, registry=r
        )
        self.grad_norm = Gauge(
            "loadlens_training_grad_norm", "Gradient L2 norm before clipping, last optimiser step.", RUN, registry=r
        )
        self.grad_norm_ema = Gauge(
            "loadlens_training_grad_norm_ema", "EMA of the gradient L2 norm, this step included.", RUN, registry=r
        )
        self.jump_ratio = Gauge(
            "loadlens_training_grad_norm_jump_ratio", "Gradient norm / its EMA before this step.", RUN, registry=r
        )
        self.jumps = Counter(
            "loadlens_training_grad_norm_jumps",
            "Steps whose jump ratio exceeded the SLO file's factor.",
            RUN,
            registry=r,
        )
        self.grad_norm_variance = Gauge(
            "loadlens_training_grad_norm_variance", "Population variance of the last N gradient norms.", RUN, registry=r
        )
        self.vram_step_peak = Gauge(
            "loadlens_training_vram_step_peak_bytes",
            "Peak allocated device memory during the last step.",
            RUN,
            registry=r,
        )
        self.vram_fluctuation = Gauge(
            "loadlens_training_vram_peak_fluctuation_ratio",
            "(max - min) / mean of per-step peak VRAM over the last N steps.",
            RUN,
            registry=r,
        )
        self.ab_correlation = Gauge(
            "loadlens_training_lora_ab_correlation",
            "Pearson correlation of a LoRA module's effective weight update in consecutive steps.",
            (*RUN, "module"),
            registry=r,
        )
        self.steps = Counter("loadlens_training_step", "Optimiser steps taken.", RUN, registry=r)
        self.step_duration = Gauge(
            "loadlens_training_step_duration_seconds", "Wall time of the last optimiser step.", RUN, registry=r
        )
        self.accumulation = Gauge(
            "loadlens_training_accumulation_steps",
            "Micro-batches (backward passes) in the last optimiser step.",
            RUN,
            registry=r,
        )
        self.learning_rate = Gauge(
            "loadlens_training_learning_rate", "Learning rate of the last step.", RUN, registry=r
        )
        self.checkpoints = Counter(
            "loadlens_training_checkpoint_decisions",
            "Checkpoint policy decisions (decision: save, skip).",
            (*RUN, "decision"),
            registry=r,
        )

    def start_run(self, run: str, *, policy: bool) -> None:
        """Create the run's counters at 0, so increase() sees the first event and dashboards see the run."""
        self.steps.labels(run)
        self.jumps.labels(run)
        if policy:
            for decision in ("save", "skip"):
                self.checkpoints.labels(run, decision)


class MetricsServer:
    """``/metrics`` and ``/health`` on ``host:port`` in a daemon thread; ``close()`` stops it."""

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> None:
        self._scrapes = 0  # /metrics bodies rendered
        self._delivered = 0  # of those, written to the scraper's connection
        self._scraped = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, content_type = render(registry, self.headers.get("Accept"))
                    # Counted once the body is rendered (the scraper's view is fixed from here) and before it
                    # is sent, so a client that has read the body always finds its scrape counted.
                    server._count_scrape()
                elif path == "/health":
                    body, content_type = b'{"status":"ok"}', "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if path == "/metrics":
                    server._count_delivery()

            def log_message(self, format: str, *args: object) -> None:
                pass  # a scrape per second would flood the training log

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="loadlens-training-metrics", daemon=True)
        self._thread.start()

    def _count_scrape(self) -> None:
        with self._scraped:
            self._scrapes += 1

    def _count_delivery(self) -> None:
        with self._scraped:
            self._delivered += 1
            self._scraped.notify_all()

    @property
    def scrapes(self) -> int:
        """``/metrics`` bodies rendered so far (each counted just before it is sent)."""
        with self._scraped:
            return self._scrapes

    def wait_for_scrape(self, timeout_s: float) -> bool:
        """Block until a ``/metrics`` body rendered after this call has been written to its scraper (True), or
        ``timeout_s`` passed (False): what a run of a few seconds waits for, so that a scraper sees its series
        before and after. Written, not only rendered: a trainer that ends its process once its last run's scrape
        is waited for must not take that scrape's body down with it."""
        with self._scraped:
            seen = self._scrapes
            return self._scraped.wait_for(lambda: self._delivered > seen, timeout=timeout_s)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve(metrics: TrainingMetrics, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    return MetricsServer(metrics.registry, host, port)
