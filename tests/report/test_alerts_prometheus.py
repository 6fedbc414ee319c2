"""Alerts and flat-zero panels from a real Prometheus: alert rules that fire on a schedule (one resolves, one is
still firing at the end) and recording rules that stand in for engine series (one flat at 0, one not), then
``loadlens report --results <run dir>`` writing beside the results."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from loadlens.cli import main
from loadlens.contracts.ports import SERVE_JOB
from loadlens.report.queries import collect_alerts
from loadlens.util.prometheus import PrometheusClient
from tests.support.prometheus import PrometheusServer

FIXTURE = Path(__file__).with_name("fixtures") / "benchmark_result.json"
ENGINE_LABELS = {"job": SERVE_JOB, "model_name": "tiny", "instance": "fixture"}


def _rules(burst_from: float, burst_to: float, still_from: float) -> dict[str, object]:
    return {
        "groups": [
            {
                "name": "report-fixture",
                "interval": "1s",
                "rules": [
                    {"record": "vllm:num_preemptions_total", "expr": "vector(0)", "labels": ENGINE_LABELS},
                    {"record": "vllm:num_requests_running", "expr": "vector(3)", "labels": ENGINE_LABELS},
                    {
                        "alert": "ReportFixtureBurst",
                        "expr": f"vector(1) and on () (vector(time()) > {burst_from:.3f})"
                        f" and on () (vector(time()) < {burst_to:.3f})",
                        "for": "0s",
                        "labels": {"severity": "critical", "slo": "ttft"},
                    },
                    {
                        "alert": "ReportFixtureStillFiring",
                        "expr": f"vector(1) and on () (vector(time()) > {still_from:.3f})",
                        "for": "0s",
                        "labels": {"severity": "warning"},
                    },
                ],
            }
        ]
    }


@pytest.mark.slow
def test_fired_alerts_and_flat_zero_from_prometheus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": []}))
    run_dir = tmp_path / "results" / "fixture-run"
    run_dir.mkdir(parents=True)
    (run_dir / "benchmark_result.json").write_text(FIXTURE.read_text())
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    with PrometheusServer(tmp_path / "prom", extra_config={"rule_files": [str(rules)]}) as prom:
        # The schedule starts once Prometheus runs (its start-up can take seconds on a loaded machine).
        t0 = time.time()
        burst = (t0 + 2.0, t0 + 6.0)
        rules.write_text(yaml.safe_dump(_rules(*burst, t0 + 4.0)))
        urllib.request.urlopen(urllib.request.Request(f"{prom.url}/-/reload", method="POST"), timeout=5).close()
        time.sleep(max(0.0, t0 + 9.0 - time.time()))
        t1 = time.time()
        fired = collect_alerts(PrometheusClient(prom.url), t0, t1)
        assert [(a.name, a.severity, a.labels, a.open_end) for a in fired] == [
            ("ReportFixtureBurst", "critical", (("slo", "ttft"),), False),
            ("ReportFixtureStillFiring", "warning", (), True),
        ]
        first, still = fired
        # Rules run every second and the query's step is 1 s: each edge lands within two seconds (three: a
        # loaded machine can delay an evaluation).
        assert burst[0] <= first.start <= burst[0] + 3.0
        assert burst[1] <= first.end <= burst[1] + 3.0
        assert still.end == pytest.approx(t1, abs=1e-3)

        code = main(["report", "--prometheus", prom.url, "--results", str(run_dir), "--from", f"{t0:.3f}",
                     "--to", f"{t1:.3f}"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    page_file = run_dir / "report" / "index.html"
    assert captured.out == f"loadlens report: {page_file}\n"
    assert list(work.iterdir()) == [], "nothing written where the command ran"
    page = page_file.read_text(encoding="utf-8")
    alerts = page[page.index('<h2 id="alerts">') : page.index('<h2 id="stages">')]
    rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr><td>(?:.*?)</tr>", alerts)]
    assert [r[:3] for r in rows] == [["ReportFixtureBurst", "critical", "slo=ttft"],
                                     ["ReportFixtureStillFiring", "warning", "–"]]  # fmt: skip
    assert rows[1][4].startswith("still firing at ")
    assert "2 firing intervals of 2 alerts in the window, from Prometheus" in alerts
    engine = page[page.index('<h2 id="engine">') : page.index('<h2 id="gpu">')]
    assert "(0 throughout the window, not drawn): Preemptions.</p>" in engine
    assert re.findall(r'<img alt="([^"]+)"', page) == ["Running / waiting"]
    doc = json.loads(FIXTURE.read_text())
    assert f"Run: {doc['run']['run_id']}" in page
