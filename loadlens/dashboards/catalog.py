"""The loadlens dashboards by file stem: one module each (``overview``, ``gpu``, ``serving``, ``training``; serving in
two metric dialects, vLLM's and sglang's), sharing
selectors, variables and annotations through ``common``. Thresholds come from the SLO file, so
`make generate` keeps the lines in step with it.
"""

from __future__ import annotations

from pathlib import Path

from loadlens.contracts.engine_series import Dialect
from loadlens.contracts.slo import load_slos
from loadlens.dashboards import gpu, overview, serving, training
from loadlens.dashboards.model import Dashboard

# What a load test's report draws: the serving run's dashboards. The training dashboard watches a
# fine-tuning job, which a load test does not run (its panels would all be empty there).
LOAD_TEST_DASHBOARDS = ("loadlens-overview", "loadlens-gpu", "loadlens-serving")
# The serving dashboard in each engine's metric dialect; the report draws the views of the dialects whose series
# Prometheus has (loadlens/report/engines.py).
SERVING_VIEWS: dict[Dialect, str] = {"vllm": "loadlens-serving", "sglang": "loadlens-serving-sglang"}


def dashboards(slo_file: Path | None = None) -> dict[str, Dashboard]:
    """File stem -> dashboard."""
    slos = load_slos(slo_file)
    return {
        "loadlens-overview": overview.dashboard(),
        "loadlens-gpu": gpu.dashboard(slos),
        SERVING_VIEWS["vllm"]: serving.dashboard(slos),
        # The same panels for an sglang upstream, its sglang: series in place of vllm: (contracts/engine_series.py).
        SERVING_VIEWS["sglang"]: serving.dashboard(slos, "sglang"),
        "loadlens-training": training.dashboard(slos),
    }
