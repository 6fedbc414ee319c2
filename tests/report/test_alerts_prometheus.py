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
from loadlens.report.queries import collect_alerts, step_for
from loadlens.util.prometheus import PrometheusClient
from tests.support.prometheus import PrometheusServer

FIXTURE = Path(__file__).with_name("fixtures") / "benchmark_result.json"
ENGINE_LABELS = {"job": SERVE_JOB, "model_name": "tiny", "instance": "fixture"}
EVALUATIONS = "report_fixture_evaluation"
"""A recording rule of the group (``time()``): one sample per evaluation, stamped with the evaluation's instant."""
BURST_FIRING = 'ALERTS{alertname="ReportFixtureBurst",alertstate="firing"}'


def _rules(burst_from: float, burst_to: float, still_from: float) -> dict[str, object]:
    return {
        "groups": [
            {
                "name": "report-fixture",
                "interval": "1s",
                "rules": [
                    {"record": EVALUATIONS, "expr": "vector(time())"},
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


def _sample_times(prom: PrometheusServer, selector: str, at: float) -> list[float]:
    """The instants of the raw samples of ``selector`` (one series) in the 5 minutes up to ``at``."""
    result = prom.api("query", query=f"{selector}[5m]", time=f"{at:.3f}")["result"]
    return [float(t) for series in result for t, _ in series["values"]]


def _ms(t: float) -> int:
    return round(t * 1000)  # Prometheus keeps instants in whole milliseconds


@pytest.mark.slow
@pytest.mark.timeout(120)  # Prometheus start-up, the 9 s schedule, up to 60 s waiting for its evaluations
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
        burst = (round(t0 + 2.0, 3), round(t0 + 6.0, 3))  # to the millisecond, as the rules write them
        rules.write_text(yaml.safe_dump(_rules(*burst, t0 + 4.0)))
        urllib.request.urlopen(urllib.request.Request(f"{prom.url}/-/reload", method="POST"), timeout=5).close()
        # Wait for Prometheus to have evaluated the group past the burst's end (a loaded machine can run an
        # evaluation late), then end the window a step after that evaluation at the earliest.
        deadline = time.monotonic() + 60
        while not (done := [e for e in _sample_times(prom, EVALUATIONS, time.time()) if e >= burst[1]]):
            assert time.monotonic() < deadline, "Prometheus did not evaluate the rules past the burst in 60 s"
            time.sleep(0.2)
        time.sleep(max(0.0, max(t0 + 9.0, done[0] + 2.0) - time.time()))
        t1 = time.time()
        fired = collect_alerts(PrometheusClient(prom.url), t0, t1)
        assert [(a.name, a.severity, a.labels, a.open_end) for a in fired] == [
            ("ReportFixtureBurst", "critical", (("slo", "ttft"),), False),
            ("ReportFixtureStillFiring", "warning", (), True),
        ]
        first, still = fired
        # The edges against Prometheus's own record rather than the schedule (an evaluation that ran late moves
        # both alike). It fired at exactly its evaluations inside the burst, and resolved at the next one ...
        evaluations = _sample_times(prom, EVALUATIONS, t1)
        firing = _sample_times(prom, BURST_FIRING, t1)
        assert firing == [e for e in evaluations if burst[0] < e < burst[1]], (evaluations, burst)
        resolved = min(e for e in evaluations if e > firing[-1])
        assert resolved >= burst[1]
        # ... and the report's interval starts at the first point of its query grid at or after the first firing
        # evaluation and ends at the first point at or after the one that found it resolved: never before the
        # schedule, at most a step after Prometheus saw each edge.
        assert burst[0] <= first.start and burst[1] <= first.end
        step = step_for(t0, t1)
        assert _ms(firing[0]) <= _ms(first.start) < _ms(firing[0]) + 1000 * step
        assert _ms(resolved) <= _ms(first.end) < _ms(resolved) + 1000 * step
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
