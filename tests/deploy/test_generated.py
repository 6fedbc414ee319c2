from __future__ import annotations

import pytest

from exporters.deploy import generate


def test_committed_compose_configs_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check"]) == 0, capsys.readouterr().err


def test_generated_prometheus_config_scrapes_every_job_of_the_ports_table() -> None:
    from exporters.stack.config import PORTS

    jobs = {c["job_name"] for c in generate.prometheus()["scrape_configs"]}
    assert {p.job for p in PORTS if p.job} <= jobs
