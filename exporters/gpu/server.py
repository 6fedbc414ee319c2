"""Assembly of the GPU exporter and its HTTP server (``/metrics``, ``/health``).

::

    exporter = GpuExporter(Nvml(SimNvml(open_source(path))), backend="sim")
    exporter.start()                                  # sampler thread
    server = MetricsServer(exporter, "127.0.0.1", 9400)
    server.serve_forever()

Every NVML call happens on the sampler's thread (:mod:`exporters.gpu.sampler`): its polls every
``sample_interval`` and its pass over the collectors every ``collect_interval``. A scrape serves the latest
pass (already encoded) plus a few live series, among them each reading's age, and never waits for NVML.
Concurrent scrapes are serialised. ``/metrics`` answers in text format 0.0.4 through
:mod:`exporters.gpu.exposition` (several times faster than prometheus_client's encoder); a client that asks
only for OpenMetrics gets OpenMetrics.
``/metrics`` answers 200 even when NVML is down, so ``loadlens_gpu_nvml_up 0`` and the health series reach
Prometheus; ``/health`` answers 503 then (for readiness probes).
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.registry import CollectorRegistry

from exporters.gpu.collectors import COLLECTORS, DEFAULT_COLLECTORS
from exporters.gpu.exporter_collector import GpuExporterCollector
from exporters.gpu.exposition import text_exposition
from exporters.gpu.nvml import Nvml
from exporters.gpu.registration import BuildContext, CollectorRegistrations
from exporters.gpu.sampler import Sampler
from exporters.gpu.session import Session
from loadlens.util.exposition import (
    OPENMETRICS,
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    negotiate,
    openmetrics_bytes,
)

log = logging.getLogger(__name__)


class GpuExporter:
    """Session + sampler + collectors in one registry."""

    def __init__(
        self,
        nvml: Nvml,
        *,
        backend: str,
        collectors: Sequence[str] = DEFAULT_COLLECTORS,
        sample_interval: float = 0.1,
        window: float = 30.0,
        stats_every: float = 1.0,
        collect_interval: float = 1.0,
        max_processes: int = 128,
        step_bytes: int = 2 * 1024 * 1024,
        proc_root: str | None = "/proc",
        hostname: str | None = None,
        probe_dir: str | None = None,
        registry: CollectorRegistry | None = None,
        timer: Callable[[], float] = time.perf_counter,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        collect_on_scrape: bool = False,
        available: CollectorRegistrations = COLLECTORS,
    ) -> None:
        unknown = [c for c in collectors if c not in available]
        if unknown:
            raise ValueError(f"unknown collectors {unknown}; choose from {', '.join(available)}")
        self.backend = backend
        self.session = Session(nvml, backend=backend, clock=monotonic)
        self.sampler = Sampler(
            self.session,
            interval=sample_interval,
            window=window,
            step_bytes=step_bytes,
            stats_every=stats_every,
            collect_every=collect_interval,
            clock=monotonic,
            cpu_clock=cpu_clock,
        )
        self.registry = CollectorRegistry() if registry is None else registry
        ctx = BuildContext(
            self.session,
            self.sampler,
            max_processes=max_processes,
            proc_root=proc_root,
            hostname=hostname,
            probe_dir=probe_dir,
            dcgm_compat="dcgm" in collectors,  # --dcgm-compat adds the dcgm collector
            timer=timer,
            clock=clock,
            monotonic=monotonic,
        )
        # Keep the order asked for (it is the order of the families in /metrics); drop duplicates.
        built = [available.build(name, ctx) for name in dict.fromkeys(collectors)]
        self.collector = GpuExporterCollector(
            self.session,
            built,
            sampler=self.sampler,
            registry=self.registry,
            timer=timer,
            monotonic=monotonic,
            cpu_clock=cpu_clock,
            collect_on_scrape=collect_on_scrape,
        )
        if not collect_on_scrape:
            self.sampler.set_collection(self.collector.sample)
        self._own_registry = registry is None
        self.scrape_lock = threading.Lock()

    def scrape(self) -> bytes:
        """One collection in text format 0.0.4 (what ``/metrics`` serves Prometheus)."""
        with self.scrape_lock:
            # A scrape allocates ~10k short-lived objects without reference cycles (refcounting frees them);
            # the cycle collector passes they would trigger find nothing and were the main source of p99
            # spikes. Pausing it for the few milliseconds of a scrape is safe: it resumes right after.
            paused = gc.isenabled()
            gc.disable()
            try:
                if self._own_registry:  # only our collector: the pass's bytes plus the live families
                    return self.collector.exposition()
                return text_exposition(self.registry.collect())
            finally:
                if paused:
                    gc.enable()

    def sample_now(self) -> None:
        """One sampler poll and one collectors' pass, at once (tests, benchmarks, start-up)."""
        self.sampler.tick(collect=True)

    def start(self) -> None:
        self.session.ensure()
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()
        self.session.close()

    def health(self) -> tuple[int, dict[str, Any]]:
        devices = self.session.all_devices()
        lost = [d.index for d, up in devices if not up]
        if not self.session.up:
            status = "down"
        elif lost:
            status = "degraded"
        else:
            status = "ok"
        body = {
            "status": status,
            "backend": self.backend,
            "nvml_up": self.session.up,
            "devices": len(devices),
            "lost_devices": lost,
            "last_init_error": self.session.last_init_error,
            "last_init_detail": self.session.last_init_detail,
        }
        return (503 if status == "down" else 200), body


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes; with Nagle's algorithm on a kept-alive connection the
    # body waits for the client's delayed ACK of the headers: +40 ms on a 10 kB /metrics (1 GPU), measured
    # with benchmarks/gpu_scrape.py. TCP_NODELAY sends it at once.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            exporter = self.server.exporter
            # Prometheus lists text 0.0.4 in its Accept header; the fast encoder writes it. No exemplars here,
            # so OpenMetrics only for a client that asks for nothing else.
            if negotiate(self.headers.get("Accept"), prefer_text=True) == OPENMETRICS:
                with exporter.scrape_lock:
                    body, content_type = openmetrics_bytes(exporter.registry), OPENMETRICS_CONTENT_TYPE
            else:
                body, content_type = exporter.scrape(), TEXT_CONTENT_TYPE
            self._send(200, content_type, body)
        elif path == "/health":
            status, doc = self.server.exporter.health()
            self._send(status, "application/json", json.dumps(doc).encode())
        elif path == "/":
            self._send(200, "text/plain; charset=utf-8", b"loadlens gpu-exporter: /metrics /health\n")
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, exporter: GpuExporter, host: str, port: int) -> None:
        self.exporter = exporter
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])
