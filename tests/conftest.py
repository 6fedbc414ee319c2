from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.live import LiveRun, live_sim_run


@pytest.fixture(scope="session")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """One real sim + GPU exporter + load generator + Prometheus run, shared by every test that reads live data."""
    with live_sim_run(tmp_path_factory.mktemp("live")) as run:
        yield run
