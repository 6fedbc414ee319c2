"""``loadlens gpu-exporter``: GPU and VRAM-fragmentation metrics on /metrics.

::

    loadlens gpu-exporter                                   # NVML if it loads, else the sim engine
    loadlens gpu-exporter --backend sim --sim-url /tmp/device-state.json --port 9400
    loadlens gpu-exporter --backend sim --sim-faults 'lost:1@30,unsupported:power'
    loadlens gpu-exporter --collectors default,pcie --dcgm-compat
    loadlens gpu-exporter --probe-dir /run/loadlens/probes   # adds the in-process probes' allocator series

Heavy imports (pynvml, pydantic, the collectors) stay inside :func:`run`, so building the parser is cheap.
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from loadlens.util.cliutil import UsageError, env_arg, non_negative_int, port_number, positive_float

if TYPE_CHECKING:
    from exporters.gpu.nvml import Nvml
    from exporters.gpu.registration import CollectorRegistrations

log = logging.getLogger("exporters.gpu")

DEFAULT_SIM_URL = "http://127.0.0.1:8000/sim/device-state"
DEFAULT_PORT = 9400
# Its own prefix, so one environment can configure this and `loadlens serve` (LOADLENS_PORT) side by side.
ENV_PREFIX = "LOADLENS_GPU_EXPORTER_"
LOG_LEVELS = ("debug", "info", "warning", "error")


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    arg = functools.partial(env_arg, env_prefix=ENV_PREFIX)
    p = sub.add_parser(
        "gpu-exporter",
        help="export GPU, VRAM and allocator-fragmentation metrics (NVML or the simulated engine)",
        description=(
            "Serve GPU metrics on /metrics and a health document on /health. Backends: nvml (pynvml, real "
            "GPUs) or sim (the simulated engine's device-state document); auto picks nvml when NVML loads."
        ),
    )
    arg(p, "--backend", choices=("auto", "nvml", "sim"), default="auto", help="device backend")
    arg(
        p,
        "--sim-url",
        default=DEFAULT_SIM_URL,
        help="sim backend: the sim server's base URL (http://HOST:PORT; its /sim/device-state is read), the "
        "document's full http URL, or a path to a device-state JSON file",
    )
    arg(
        p,
        "--sim-faults",
        help="sim backend: comma-separated faults, e.g. 'lost:1@30,unsupported:power,init-fail:2' (see docs)",
    )
    arg(
        p,
        "--sim-refresh",
        type=positive_float,
        default=0.5,
        help="sim backend: seconds between fetches of the document; sampler ticks and scrapes in between reuse it",
    )
    arg(p, "--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)")
    arg(p, "--port", type=port_number, default=DEFAULT_PORT, help="TCP port to listen on")
    arg(
        p,
        "--sample-interval",
        type=positive_float,
        default=0.1,
        help="seconds between sampler polls of the driver's sample buffers",
    )
    arg(p, "--window", type=positive_float, default=30.0, help="rolling window for window statistics, seconds")
    arg(
        p,
        "--stats-interval",
        type=positive_float,
        default=1.0,
        help="seconds between recomputations of the utilisation window statistics by the sampler",
    )
    arg(
        p,
        "--collect-interval",
        type=positive_float,
        default=1.0,
        help="seconds between the sampler's passes over the collectors (every NVML read the scrape serves); "
        "a scrape serves the latest pass, so this is the staleness it may see",
    )
    arg(
        p,
        "--collectors",
        default="default",
        help="comma-separated collectors; 'default' = device,utilization,memory,processes,power,clock_events,"
        "errors,allocator,gpm; also pcie (opt-in, ~20 ms per direction per GPU), dcgm and probe (with --probe-dir)",
    )
    arg(
        p,
        "--dcgm-compat",
        action="store_true",
        default=False,
        help="also export DCGM-named aliases (adds the dcgm collector)",
    )
    arg(
        p,
        "--max-processes",
        type=positive_int,
        default=128,
        help='per-process series per GPU (largest first); the rest are summed under pid="other"',
    )
    arg(
        p,
        "--memory-step-bytes",
        type=positive_int,
        default=2 * 1024 * 1024,
        help="smallest rise in used memory counted as a step (adapter load)",
    )
    arg(
        p,
        "--probe-dir",
        help="directory the in-process allocator probes write their documents to (adds the probe collector)",
    )
    arg(p, "--log-level", choices=LOG_LEVELS, default="info", help="log level")
    p.set_defaults(handler=run)


def parse_collectors(
    text: str, dcgm_compat: bool, available: CollectorRegistrations | None = None, *, probe_dir: str | None = None
) -> list[str]:
    """The ``--collectors`` value as collector names, in order, without duplicates.

    A probe directory adds the ``probe`` collector; ``probe`` without one is refused.
    """
    if available is None:
        from exporters.gpu.collectors import COLLECTORS

        available = COLLECTORS
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name == "default":
            names.extend(available.defaults())
        elif name in available:
            names.append(name)
        else:
            raise UsageError(f"unknown collector {name!r}; choose from default, {', '.join(available)}")
    if dcgm_compat:
        names.append("dcgm")
    if probe_dir:
        names.append("probe")
    elif "probe" in names:
        raise UsageError("the probe collector needs --probe-dir")
    if not names:
        raise UsageError("--collectors selects nothing")
    return list(dict.fromkeys(names))


def _nvml_loads() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        log.warning("NVML does not load (%s): using the sim backend", type(err).__name__)
        return False
    pynvml.nvmlShutdown()
    return True


def build_backend(args: argparse.Namespace) -> tuple[Nvml, str]:
    from exporters.gpu.faults import FaultSpecError, parse_faults
    from exporters.gpu.nvml import Nvml

    backend = args.backend
    if backend == "auto":
        backend = "nvml" if _nvml_loads() else "sim"
    try:
        faults = parse_faults(args.sim_faults or "")
    except FaultSpecError as err:
        raise UsageError(f"--sim-faults: {err}") from err
    if backend == "nvml":
        if (args.sim_faults or "").strip():
            raise UsageError("--sim-faults needs the sim backend (--backend sim)")
        return Nvml(), "nvml"
    # Imported here: the sim backend needs pydantic, which a lean install on a GPU node may not have.
    from exporters.gpu.sim import SimNvml
    from exporters.gpu.sim_sources import open_source

    try:
        source = open_source(args.sim_url)
    except ValueError as err:
        raise UsageError(f"--sim-url: {err}") from err
    return Nvml(SimNvml(source, faults=faults, max_age=args.sim_refresh)), "sim"


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    if args.window <= args.sample_interval:
        raise UsageError(f"--window ({args.window} s) must be longer than --sample-interval ({args.sample_interval} s)")
    collectors = parse_collectors(args.collectors, args.dcgm_compat, probe_dir=args.probe_dir)
    nvml, backend = build_backend(args)

    from exporters.gpu.server import GpuExporter, MetricsServer

    exporter = GpuExporter(
        nvml,
        backend=backend,
        collectors=collectors,
        sample_interval=args.sample_interval,
        window=args.window,
        stats_every=args.stats_interval,
        collect_interval=args.collect_interval,
        max_processes=args.max_processes,
        step_bytes=args.memory_step_bytes,
        proc_root="/proc" if backend == "nvml" else None,  # sim pids are not this host's processes
        probe_dir=args.probe_dir or None,
    )
    try:
        server = MetricsServer(exporter, args.host, args.port)
    except OSError as err:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from err

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, Any] = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    # Everything built so far lives as long as the process: keep it out of the collector's full passes,
    # which would otherwise show up as scrape-latency spikes.
    gc.collect()
    gc.freeze()
    exporter.start()
    thread = threading.Thread(target=server.serve_forever, name="gpu-exporter-http", daemon=True)
    thread.start()
    log.info(
        "gpu-exporter listening on http://%s:%d/metrics (backend %s, collectors %s)",
        args.host,
        server.port,
        backend,
        ",".join(collectors),
    )
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
        exporter.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
        log.info("gpu-exporter stopped")
    return 0
