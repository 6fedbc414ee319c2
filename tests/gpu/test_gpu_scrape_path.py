"""A scrape that costs nothing (issue 24): every NVML read happens on the sampler's schedule, the scrape
serves the latest pass with its age, and a failing or hanging read on the sampler leaves the scrape intact."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pynvml
import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from exporters.gpu.cli import DEFAULT_SIM_URL, build_backend
from exporters.gpu.collectors import COLLECTORS, DEFAULT_COLLECTORS
from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter
from exporters.gpu.session import Session
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import HttpSource, StaticSource
from loadlens.cli import build_parser
from tests.gpu.helpers import FakeClock, Scraped, default_state

MODEL = "NVIDIA H100 80GB HBM3"


def labels(i: int) -> dict[str, str]:
    return {"gpu": str(i), "uuid": f"GPU-5e1f0000-0000-4000-8000-{i:012x}", "model": MODEL}


class CountingNvml:
    """pynvml's call surface over the sim, counting every call; ``hooks`` replace single calls."""

    def __init__(self, sim: SimNvml) -> None:
        self._sim = sim
        self.calls: Counter[str] = Counter()
        self.hooks: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        target = self.hooks.get(name) or getattr(self._sim, name)
        if not callable(target) or not name.startswith(("nvml", "loadlensSim")):
            return target

        def call(*args: Any) -> Any:
            self.calls[name] += 1
            return target(*args)

        return call

    # PCIe is NotSupported in the sim; answer it, so the opt-in collector's reads are counted too.
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        self.calls["nvmlDeviceGetPcieThroughput"] += 1
        return 1000


def build(clock: FakeClock, collectors: list[str] | None = None, **kwargs: Any) -> tuple[GpuExporter, CountingNvml]:
    api = CountingNvml(SimNvml(StaticSource(default_state()), max_age=0.0, clock=clock))
    names = collectors if collectors is not None else [c for c in COLLECTORS if c != "probe"]
    exporter = GpuExporter(
        Nvml(api), backend="sim", collectors=names, proc_root=None, monotonic=clock, hostname="h", **kwargs
    )
    return exporter, api


def age(got: Scraped, collector: str) -> float | None:
    return got.get("loadlens_gpu_sample_age_seconds", {"collector": collector})


def test_the_scrape_makes_no_nvml_call() -> None:
    exporter, api = build(FakeClock())
    exporter.sample_now()
    # 2 GPUs: power and dcgm read the power draw, pcie reads both directions.
    assert api.calls["nvmlDeviceGetPowerUsage"] == 4 and api.calls["nvmlDeviceGetPcieThroughput"] == 4
    api.calls.clear()
    text = exporter.scrape().decode()  # what /metrics serves Prometheus
    generate_latest(exporter.registry)  # the registry path (prometheus_client's encoder)
    openmetrics_latest(exporter.registry)  # what an OpenMetrics-only client gets
    got = Scraped(exporter.registry)
    assert api.calls == Counter()
    # ... and yet it served every collector's series.
    assert 'loadlens_gpu_power_watts{gpu="1"' in text and 'loadlens_gpu_pcie_tx_bytes_per_second{gpu="0"' in text
    assert got.get("loadlens_gpu_power_watts", labels(0)) == 412.5
    assert got.get("loadlens_gpu_pcie_rx_bytes_per_second", labels(1)) == 1000 * 1024.0
    assert {dict(k)["collector"]: v for k, v in got.series("loadlens_gpu_collector_success").items()} == dict.fromkeys(
        [c for c in COLLECTORS if c != "probe"], 1.0
    )


def test_collect_on_scrape_reads_at_scrape_time() -> None:
    # The pre-issue-24 path the benchmark compares against: each scrape runs the pass itself.
    exporter, api = build(FakeClock(), collectors=list(DEFAULT_COLLECTORS), collect_on_scrape=True)
    exporter.scrape()
    exporter.scrape()
    assert api.calls["nvmlDeviceGetPowerUsage"] == 4  # 2 GPUs x 2 scrapes
    exporter.sampler.tick()
    assert api.calls["nvmlDeviceGetPowerUsage"] == 4  # the sampler runs no pass of its own then


def test_before_the_first_pass_nothing_is_served_as_read() -> None:
    exporter, api = build(FakeClock())
    got = Scraped(exporter.registry)
    assert api.calls == Counter()
    assert got.get("loadlens_gpu_nvml_up") == 0
    assert got.series("loadlens_gpu_collector_success") == {}
    assert got.series("loadlens_gpu_sample_age_seconds") == {}
    assert got.series("loadlens_gpu_memory_used_bytes") == {}


def test_sample_age_grows_between_passes_and_resets_after_one() -> None:
    clock = FakeClock()
    exporter, _ = build(clock, collectors=list(DEFAULT_COLLECTORS))
    exporter.sample_now()
    got = Scraped(exporter.registry)
    assert age(got, "power") == 0.0 and age(got, "sampler") == 0.0
    assert got.get("loadlens_gpu_collect_interval_seconds") == 1.0
    clock.advance(0.5)
    exporter.sampler.tick()  # a poll, but the collectors' pass is not due (every 1 s)
    got = Scraped(exporter.registry)
    assert (age(got, "power"), age(got, "memory"), age(got, "sampler")) == (0.5, 0.5, 0.0)
    clock.advance(0.25)
    got = Scraped(exporter.registry)
    assert (age(got, "power"), age(got, "sampler")) == (0.75, 0.25)  # grows with no pass
    clock.advance(0.25)
    exporter.sampler.tick()  # 1 s since the last pass: due
    got = Scraped(exporter.registry)
    assert (age(got, "power"), age(got, "device"), age(got, "sampler")) == (0.0, 0.0, 0.0)


class ThreadCpuClock:
    """Each thread's CPU clock advances 1 ms per read: every measured stretch costs 1 ms, whatever thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        self._local.t = getattr(self._local, "t", 0.0) + 0.001
        return float(self._local.t)


def test_sampler_cpu_counts_its_polls_and_the_collectors_runs() -> None:
    exporter, _ = build(FakeClock(), collectors=list(DEFAULT_COLLECTORS), cpu_clock=ThreadCpuClock())
    assert len(DEFAULT_COLLECTORS) == 9
    exporter.sample_now()  # a poll (1 stretch) and a pass: 9 collectors on their threads (9)
    exporter.sampler.tick()  # a poll, no pass due (1)
    got = Scraped(exporter.registry)
    assert got.get("loadlens_gpu_sampler_cpu_seconds_total") == pytest.approx(0.011)


def test_a_failing_read_on_the_sampler_fails_only_its_collector() -> None:
    exporter, api = build(FakeClock(), collectors=list(DEFAULT_COLLECTORS))

    def power_fails(handle: Any) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    api.hooks["nvmlDeviceGetPowerUsage"] = power_fails
    exporter.sample_now()
    got = Scraped(exporter.registry)
    success = {dict(k)["collector"]: v for k, v in got.series("loadlens_gpu_collector_success").items()}
    assert success == {**dict.fromkeys(DEFAULT_COLLECTORS, 1.0), "power": 0.0}
    assert got.series("loadlens_gpu_power_watts") == {}  # absent, never a fake 0
    assert got.get("loadlens_gpu_power_limit_watts", labels(0)) == 700.0  # its other reads carry on
    assert got.get("loadlens_gpu_memory_used_bytes", labels(1)) == 72 * 2**30  # and the other collectors
    assert got.series("loadlens_gpu_nvml_errors_total") == {
        frozenset({("collector", "power"), ("error", "Unknown")}): 2.0
    }
    del api.hooks["nvmlDeviceGetPowerUsage"]
    exporter.sample_now()
    got = Scraped(exporter.registry)
    assert got.get("loadlens_gpu_collector_success", {"collector": "power"}) == 1.0
    assert got.get("loadlens_gpu_power_watts", labels(0)) == 412.5


def test_a_hanging_read_holds_up_neither_the_scrape_nor_the_other_readings() -> None:
    clock = FakeClock()
    exporter, api = build(clock, collectors=list(DEFAULT_COLLECTORS))
    exporter.sample_now()
    entered, release = threading.Event(), threading.Event()

    def power_hangs(handle: Any) -> int:
        entered.set()
        release.wait()
        return 1_000

    api.hooks["nvmlDeviceGetPowerUsage"] = power_hangs
    clock.advance(2.0)
    hung = threading.Thread(target=exporter.sample_now, daemon=True)  # its pass waits for the hung collector
    hung.start()
    assert entered.wait(30)  # bounds a failure only
    try:
        served: list[Scraped] = []
        scraper = threading.Thread(target=lambda: (exporter.scrape(), served.append(Scraped(exporter.registry))))
        scraper.start()
        scraper.join(30)  # bounds a failure only: a scrape waiting on NVML would still be blocked here
        assert not scraper.is_alive() and len(served) == 1
        # The sampler goes on: another pass refreshes every other collector, and the polls carry on.
        clock.advance(1.0)
        exporter.sample_now()
        got = Scraped(exporter.registry)
        assert (age(got, "power"), age(got, "memory"), age(got, "device"), age(got, "sampler")) == (3.0, 0.0, 0.0, 0.0)
        assert got.get("loadlens_gpu_power_watts", labels(0)) == 412.5  # power's previous reading, with its age
        assert got.get("loadlens_gpu_memory_used_bytes", labels(0)) == 72 * 2**30
        assert exporter.sampler.ticks_total == 3
    finally:
        release.set()
        hung.join(30)
    exporter.collector.sample()  # publishes power's run that has now returned, with the others
    got = Scraped(exporter.registry)
    assert got.get("loadlens_gpu_power_watts", labels(0)) == 1.0
    assert got.get("loadlens_gpu_collector_success", {"collector": "power"}) == 1.0


# --- --sim-url: the sim server's base URL, and errors worded as the sim backend's -------------------------


@pytest.fixture
def not_found_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_sim_url_takes_the_base_url() -> None:
    base = DEFAULT_SIM_URL.removesuffix("/sim/device-state")
    for given in (base, f"{base}/"):
        args = build_parser().parse_args(["gpu-exporter", "--backend", "sim", "--sim-url", given])
        nvml, backend = build_backend(args)
        assert backend == "sim"
        assert isinstance(nvml.api.source, HttpSource)
        assert nvml.api.source.url == DEFAULT_SIM_URL


def test_a_wrong_sim_url_names_the_sim_backend_and_the_url(
    not_found_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{not_found_server}/engine"
    session = Session(Nvml(SimNvml(HttpSource(url))), backend="sim")
    with caplog.at_level(logging.ERROR, logger="exporters.gpu.session"):
        assert session.devices() == []
    [record] = caplog.records
    assert record.getMessage() == (
        f"sim backend: cannot read the device-state document: GET {url}: HTTP 404 (the sim engine serves its "
        f"document at /sim/device-state: try --sim-url {url}/sim/device-state); next try in 1 s"
    )
    assert "NVML" not in record.getMessage() and "DriverNotLoaded" not in record.getMessage()
    assert (session.last_init_error, session.init_failures_total) == ("SimDocumentUnavailable", 1)
