"""The proof: after a short real load run against the simulator, scraped by a real Prometheus under the job
names of loadlens/contracts/ports.py, every dashboard query (variables substituted) returns data.

Children: ``loadlens serve --engine sim``, ``loadlens gpu-exporter --backend sim`` reading the sim's device
state, and ``loadlens load --profile quick --time-scale 0.2 --headless`` (about 17 s): the shared live run of
tests/support/live.py. Queries run as range
queries over the test window, because the load generator's series go stale once it exits.
"""

from __future__ import annotations

import math

import pytest

from loadlens.dashboards.catalog import dashboards
from tests.dashboards.support import all_queries, concrete
from tests.support.live import JOBS, LiveRun

# Queries that legitimately return no data in a ~17 s healthy sim run. Each entry names why.
NO_DATA_IN_SHORT_SIM_RUN = {
    # No alert rules are loaded into the test Prometheus and nothing would fire in 17 s anyway; the
    # "Alerts firing" stat panel uses `or vector(0)` and is checked.
    "loadlens-overview / annotation Firing alerts",
    "loadlens-gpu / annotation Firing alerts",
    "loadlens-serving / annotation Firing alerts",
    # Jain's index needs ≥ 2 priority classes in the profile; `quick` sends one class.
    "loadlens-serving / Fairness (Jain's index) / {{stage}}",
    # The quick profile uses no LoRA adapters, so no request is ever blocked by a swap: the blocking
    # histogram has no observations and its quantile and mean are NaN. (The delayed share is checked.)
    "loadlens-serving / Swap blocking / blocked p99",
    "loadlens-serving / Swap blocking / blocked mean",
    # The swing period is absent while utilisation is flat or fewer than two cycles fit in the window.
    "loadlens-gpu / Utilisation swing period / gpu {{gpu}} period",
    # The same for the busy timeline's period (absent with a reason: a steady quick load has no cycle).
    "loadlens-gpu / Utilisation swing period / gpu {{gpu}} busy timeline period",
}


# Dashboards whose series need another source than the sim load run, by uid, each with the test that proves
# their queries instead.
OTHER_SOURCE = {
    # loadlens_training_* come from a training run (exporters/training) and the trainer's allocator from a
    # probe with role="trainer": neither is part of a load run. tests/dashboards/test_training_data.py runs
    # every query of this dashboard against a real Prometheus scraping a training run and a probe document.
    "loadlens-training": "tests/dashboards/test_training_data.py",
    # The sglang view reads sglang:* series, which the sim (vLLM's dialect) does not export; its queries run
    # against a recorded sglang exposition there (its loadlens_* queries are the vLLM view's, checked here).
    "loadlens-serving-sglang": "tests/dashboards/test_engine_dialects.py",
}


def _has_data(run: LiveRun, expr: str) -> bool:
    data = run.prom.api("query_range", query=expr, start=f"{run.start:.3f}", end=f"{run.end:.3f}", step="1")
    values = [float(v) for series in data["result"] for _, v in series["values"]]
    return any(not math.isnan(v) for v in values)


@pytest.mark.slow
def test_every_dashboard_query_returns_data(live_run: LiveRun) -> None:
    queries = all_queries({k: v for k, v in dashboards().items() if k not in OTHER_SOURCE})
    assert set(OTHER_SOURCE) <= set(dashboards()), "OTHER_SOURCE names a dashboard that no longer exists"
    stale = NO_DATA_IN_SHORT_SIM_RUN - {where for where, _ in queries}
    assert stale == set(), "allow-list names a query that no longer exists"
    empty = [f"{where}: {concrete(expr)}" for where, expr in queries
             if where not in NO_DATA_IN_SHORT_SIM_RUN and not _has_data(live_run, concrete(expr))]  # fmt: skip
    assert empty == []


@pytest.mark.slow
def test_scraped_under_stack_job_names(live_run: LiveRun) -> None:
    health = live_run.prom.targets_health()
    assert health[JOBS["serve"]] == "up"
    assert health[JOBS["gpu"]] == "up"
    assert _has_data(live_run, f'up{{job="{JOBS["loadgen"]}"}} == 1')
