from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.live import LiveRun, live_sim_run

SERIAL: dict[str, str] = {
    "tests/loadgen/test_e2e.py": "client median TTFT and ITL within 20 ms and 5 ms of a scripted server's delays",
    "tests/loadgen/test_sim_e2e.py::test_client_timings_agree_with_the_simulator": "client and sim TTFT within 8 ms",
    "tests/serving/test_sim_lag.py": "client, gen_ai and vllm TTFT within 2 % while the sim lags",
    "tests/serving/test_app.py::test_metrics_count_requests_tokens_and_slo_verdicts": "in-process TTFT within the "
    "0.2 s SLO and TPOT within 50 ms decide the goodput counts",
    "tests/training/test_train_demo_e2e.py": "a page within 40 s of the trainer's /metrics coming up",
    "tests/training/test_experiment_stack.py": "every jumped run's page within 40 s of the experiment's end",
    "tests/experiment/test_sim_experiments.py::test_batching_window_on_the_sim": "a U-curve fitted to measured E2E",
    "tests/experiment/test_sim_experiments.py::test_token_budget_on_the_sim": "mean running sequences per grid point",
    "tests/loadgen/test_saturation_sim.py": "a stage below capacity must be judged stable",
    "tests/experiment/test_multi_lora.py::test_multi_lora_on_the_sim": "utilisation swing on the wall clock",
    "tests/loadgen/test_traces.py::test_mooncake_replay_on_the_sim": "each trace row reaches the sim within 250 ms",
    "tests/loadgen/test_traces.py::test_burstgpt_replay_scaled_on_the_sim": "each scaled trace row within 250 ms",
    "tests/stack/test_stack_e2e.py": "a TTFT page within 45 s of the breach, its resolution within 60 s",
    "tests/benchmarks/test_gpu_busy_check.py::test_the_cpu_twin_recovers_both_periods": "a CPU on/off load started "
    "every 29 / 84 ms on the wall clock, its period recovered within 1 ms",
}
"""Tests whose assertions are about wall-clock time, and what they time. `make test` runs the rest on two
xdist workers, then these alone (``-m serial``), so a neighbour's CPU never moves their figures.
tests/test_serial_list.py checks every entry still names a test."""

SESSION_GROUPS: dict[str, str] = {
    "live_run": "live_run",
    "vllm_server": "vllm",  # tests/vllm/conftest.py: one real vLLM per session (its proxy fixture uses it)
}
"""Session fixture -> the xdist group of every test that uses it (directly or through another fixture)."""


LIVE_RUN_TIMEOUT_S = 150


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    serial = pytest.mark.serial
    for item in items:
        if any(item.nodeid == key or item.nodeid.startswith(key + "::") for key in SERIAL):
            item.add_marker(serial)
        fixtures = getattr(item, "fixturenames", ())
        # One instance per session: on xdist, every test that uses it goes to the same worker
        # (tests/test_xdist_groups.py checks the installed pytest and xdist honour the groups).
        for fixture, group in SESSION_GROUPS.items():
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))
                break
        if "live_run" in fixtures and item.get_closest_marker("timeout") is None:
            # Whichever test reads the live run first pays for its set-up inside its own timeout: the slowest
            # reader, set-up included, took 25 s in the parallel phase; x5 and more (tests/support/timeout_margins.py).
            item.add_marker(pytest.mark.timeout(LIVE_RUN_TIMEOUT_S))


@pytest.fixture(scope="session")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """One real sim + GPU exporter + load generator + Prometheus run, shared by every test that reads live data."""
    with live_sim_run(tmp_path_factory.mktemp("live")) as run:
        yield run


PROCESS_SETTINGS = {
    "PYTEST_CURRENT_TEST": "pytest's own, set per test phase",
    "TOKENIZERS_PARALLELISM": "loadgen/tokenizer.py sets it once per process (setdefault) before the first encode",
    "TORCHINDUCTOR_CACHE_DIR": "torch's inductor sets it once per process, on the first import that reaches it "
    "(PEFT's, transformers'), to the same per-user path",
}
"""Variables a test may leave set: each is set on purpose, once per process, the same way for every test."""


@pytest.fixture(autouse=True)
def environment_left_as_found() -> Iterator[None]:
    """A test that changes this process's environment and does not put it back (use ``monkeypatch.setenv``)
    changes every later test on its xdist worker, which then passes or fails by the order tests were dealt:
    such a test fails here, naming the variables, and the environment is put back."""
    before = {k: v for k, v in os.environ.items() if k not in PROCESS_SETTINGS}
    yield
    after = {k: v for k, v in os.environ.items() if k not in PROCESS_SETTINGS}
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for key in changed:
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]
        pytest.fail(f"the test left the environment changed: {', '.join(changed)}", pytrace=False)
