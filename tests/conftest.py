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
}
"""Tests whose assertions are about wall-clock time, and what they time. `make test` runs the rest on two
xdist workers, then these alone (``-m serial``), so a neighbour's CPU never moves their figures.
tests/test_serial_list.py checks every entry still names a test."""

SESSION_GROUPS: dict[str, str] = {
    "live_run": "live_run",
    "vllm_server": "vllm",  # tests/vllm/conftest.py: one real vLLM per session (its proxy fixture uses it)
}
"""Session fixture -> the xdist group of every test that uses it (directly or through another fixture)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    serial = pytest.mark.serial
    for item in items:
        if any(item.nodeid == key or item.nodeid.startswith(key + "::") for key in SERIAL):
            item.add_marker(serial)
        fixtures = getattr(item, "fixturenames", ())
        # One instance per session: on xdist, every test that uses it goes to the same worker.
        for fixture, group in SESSION_GROUPS.items():
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))
                break


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup``, give each grouped test the ``@group`` node-id suffix xdist schedules by.

    xdist 3.8 writes it to ``item._nodeid``, which pytest 9.2 no longer reads (an item's id is ``item._id``),
    so its groups silently became plain ``load``: two workers, two live runs, two vLLMs. Runs after every
    ``pytest_collection_modifyitems`` (xdist's included) and before xdist's worker reports the ids; where
    xdist's suffix took, nothing is left to do."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist workers only
        return
    for item in session.items:
        groups = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args})
        if groups and "@" not in item.nodeid.rpartition("]")[2] and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId  # pytest >= 9.2 only, where this is needed

            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(scope="session")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """One real sim + GPU exporter + load generator + Prometheus run, shared by every test that reads live data."""
    with live_sim_run(tmp_path_factory.mktemp("live")) as run:
        yield run
