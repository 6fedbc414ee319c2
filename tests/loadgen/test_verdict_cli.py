"""`loadlens load` and the verdict: written into benchmark_result.json and printed after the one table;
`--fail-on-slo` turns a FAIL into exit 1; a dead `--prometheus` is an error before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from loadlens.contracts.results import parse_result
from loadlens.contracts.slo import DEFAULT_SLO_FILE
from loadlens.util.net import free_port
from tests.loadgen.conftest import Served, loadlens, run_child, write_profile

pytestmark = pytest.mark.slow


def test_a_dead_prometheus_is_an_error_naming_the_url_and_the_failure(scripted: Served, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc = run_child(loadlens("--host", scripted.url, "--headless", "--prometheus", dead, "--results",
                              str(tmp_path)), timeout=30)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1] == (
        f"loadlens load: error: --prometheus {dead}: cannot reach Prometheus at {dead}: [Errno 111] Connection refused"
    )
    assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.timeout(180)  # two Locust runs, each up to its 60 s run_child limit, past the 60 s default
def test_fail_on_slo_exits_1_on_a_fail_verdict_and_the_file_holds_it(scripted: Served, tmp_path: Path) -> None:
    # The scripted engine's TTFT is 50 ms; this SLO file allows 10 ms. ITL and E2E get bounds no loaded
    # machine reaches, so the headline names exactly the two checks the scripted delays decide.
    slo = yaml.safe_load(DEFAULT_SLO_FILE.read_text())
    slo["classes"][0]["ttft_seconds"] = 0.01
    slo["classes"][0]["itl_seconds"] = 30.0
    slo["classes"][0]["e2e_seconds"] = 300.0
    slo_file = tmp_path / "tight.yaml"
    slo_file.write_text(yaml.safe_dump(slo))
    profile = write_profile(tmp_path / "p.yaml", {
        "traffic": [{"name": "chat", "prompt": {"tokens": 16}, "output_tokens": 8}],
        "stages": [{"name": "s1", "users": 2, "duration": 3}],
    })  # fmt: skip
    common = ["--profile", str(profile), "--host", scripted.url, "--headless", "--slo-file", str(slo_file),
              "--results", str(tmp_path / "results"), "--metrics-port", "0", "--progress-interval", "0"]  # fmt: skip
    proc = run_child(loadlens(*common, "--run-id", "strict", "--fail-on-slo"), timeout=60)
    assert proc.returncode == 1, proc.stdout[-3000:]
    headline = "FAIL: TTFT p99 at s1 above 10 ms; goodput at s1 below 90 %; alerts not checked"
    lines = proc.stdout.splitlines()
    assert f"verdict: {headline}" in lines
    assert lines[-1] == "loadlens load: verdict FAIL (--fail-on-slo): exit 1"
    header = next(line for line in lines if line.startswith("stage "))
    assert "TTFT p50 ms" in header and "ITL p99 ms" in header and "goodput %" in header
    assert "Aggregated" not in proc.stdout  # Locust's own table, which mixes TTFT, TPOT and E2E, is silenced
    path = tmp_path / "results" / "strict" / "benchmark_result.json"
    verdict = parse_result(json.loads(path.read_text())).verdict
    assert verdict is not None and verdict.status == "fail" and verdict.headline == headline
    assert verdict.alerts_source is None and verdict.pages_source is None
    assert [(c.stage, c.slo, c.threshold) for c in verdict.slos if c.passed is False] == [
        ("s1", "ttft", 10.0), ("s1", "goodput", 0.9), ("overall", "ttft", 10.0), ("overall", "goodput", 0.9)
    ]  # fmt: skip

    # The same run without the flag: the verdict is the same, the exit status is the run's.
    proc = run_child(loadlens(*common, "--run-id", "lenient"), timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"verdict: {headline}" in proc.stdout.splitlines()
