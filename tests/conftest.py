from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.live import LiveRun, live_sim_run

SERIAL: dict[str, str] = {
    "tests/loadgen/test_e2e.py": "client TTFT and ITL within 10 ms and 1 ms of a scripted server's delays",
    "tests/loadgen/test_sim_e2e.py::test_client_timings_agree_with_the_simulator": "client and sim TTFT within 8 ms",
    "tests/serving/test_sim_lag.py": "client, gen_ai and vllm TTFT within 2 % while the sim lags",
    "tests/training/test_train_demo_e2e.py": "a page within 60 s of the learning-rate spike",
    "tests/experiment/test_sim_experiments.py::test_batching_window_on_the_sim": "a U-curve fitted to measured E2E",
    "tests/experiment/test_sim_experiments.py::test_token_budget_on_the_sim": "mean running sequences per grid point",
    "tests/loadgen/test_saturation_sim.py": "a stage below capacity must be judged stable",
    "tests/stack/test_stack_e2e.py": "a TTFT page within 45 s of the breach, its resolution within 60 s",
}
"""Tests whose assertions are about wall-clock time, and what they time. `make test` runs the rest on two
xdist workers, then these alone (``-m serial``), so a neighbour's CPU never moves their figures.
tests/test_serial_list.py checks every entry still names a test."""


LIVE_RUN_TIMEOUT_S = 90


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    serial = pytest.mark.serial
    for item in items:
        if any(item.nodeid == key or item.nodeid.startswith(key + "::") for key in SERIAL):
            item.add_marker(serial)
        if "live_run" in getattr(item, "fixturenames", ()):
            # One live run per session: on xdist, every test that reads it goes to the same worker.
            item.add_marker(pytest.mark.xdist_group("live_run"))
            # Whichever of them runs first pays for the run's set-up inside its own timeout (22.5 s measured
            # on the loaded 2-core box, x3 and rounded up), which the 60 s default leaves too little room for.
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(LIVE_RUN_TIMEOUT_S))


@pytest.fixture(scope="session")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """One real sim + GPU exporter + load generator + Prometheus run, shared by every test that reads live data."""
    with live_sim_run(tmp_path_factory.mktemp("live")) as run:
        yield run
