"""The golden /metrics exposition of the GPU exporter (style R5), and how to regenerate it.

The fixture is every collector (pcie and dcgm included) over the 2-GPU example document, with a frozen
timer and clock so durations and timestamps are stable. Regenerate after an intended change::

    .venv/bin/python -m tests.gpu.golden          # rewrites tests/fixtures/gpu/metrics.prom
"""

from __future__ import annotations

import sys
from pathlib import Path

from exporters.gpu.collectors import COLLECTORS
from exporters.gpu.nvml import Nvml
from exporters.gpu.server import GpuExporter
from exporters.gpu.sim import SimNvml
from exporters.gpu.sim_sources import StaticSource
from tests.gpu.sim_example import example_state

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "metrics.prom"
DOCUMENT = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "device_state.json"
FROZEN_TIME = 1_700_000_000.0


def document_json() -> str:
    """The example document committed beside the golden file (also used by the real-process test)."""
    return example_state(2, 3, sample_interval=0.1).model_dump_json(indent=1) + "\n"


def golden_exporter() -> GpuExporter:
    state = example_state(2, 3, sample_interval=0.1)
    exporter = GpuExporter(
        Nvml(SimNvml(StaticSource(state), max_age=0.0, clock=lambda: 0.0)),
        backend="sim",
        # probe reads a directory of documents, not the sim document: test_gpu_collectors_probe.py covers it.
        collectors=[c for c in COLLECTORS if c != "probe"],
        proc_root=None,
        hostname="golden-host",
        timer=lambda: 0.0,
        clock=lambda: FROZEN_TIME,
        monotonic=lambda: 0.0,  # sample ages 0
        cpu_clock=lambda: 0.0,  # sampler CPU 0
    )
    exporter.sample_now()
    return exporter


def render() -> str:
    """What /metrics serves Prometheus (the fast text encoder)."""
    return golden_exporter().scrape().decode()


def main() -> int:
    GOLDEN.write_text(render())
    DOCUMENT.write_text(document_json())
    print(f"wrote {GOLDEN} and {DOCUMENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
