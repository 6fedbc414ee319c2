"""The engine alerts on the recorded workload of tests/fixtures/sglang/, in each engine's dialect.

The fixture is one modelled workload written as sglang and as vLLM expose it, scraped every 15 s for 5 minutes
(tests/dashboards/engine_expositions.py); its middle phase is past capacity. Prometheus evaluates rules only
at its own clock, and the recording lies in the past, so a live server would never run the alerts over it;
``promtool test rules`` runs Prometheus's rule manager over virtual time instead. The series the engine alerts
read (their vLLM names and, through the one mapping, sglang's) become its input series, sample for sample,
with the ``job`` and ``instance`` a scrape under the serving job adds; the generated alert file runs over them
and ``ALERTS`` (pending and firing) is asserted at every evaluation. Both dialects must give the same timeline:
the same requests, read through the mapping.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.alerting.system_rules import ENGINE_ALERT_SERIES
from loadlens.codegen import alerts as generate
from loadlens.contracts.engine_series import BY_VLLM, Dialect
from loadlens.contracts.ports import SERVE_JOB
from tests.dashboards import engine_expositions as rec
from tests.support import required
from tests.support.paths import ROOT

FIXTURE: dict[Dialect, Path] = {"vllm": rec.VLLM_FILE, "sglang": rec.SGLANG_FILE}
INSTANCE: dict[Dialect, str] = {"vllm": "vllm:8001", "sglang": "sglang:8001"}
STEP = rec.SCRAPE_INTERVAL  # the rule files' evaluation interval is the scrape interval, as in the stack
EVALS = range(0, rec.DURATION + 1, STEP)

# The engine alerts on the recording, by alert: (first evaluation with a result, first firing, last result),
# seconds from its start. Arrivals double at 100 s; the queue is 0 at 105 s, 27 at 120 s, peaks at 151 at
# 195 s and drains (65 at 240 s, 34 at 255 s). QueueGrowing is pending from 120 s (over 10, and deriv() over
# 2 minutes positive) and fires at 240 s, its 2 minutes held, the last evaluation whose 2-minute window
# (27 ... 151 ... 65) still slopes up; at 255 s the slope is negative and it resolves. KV usage peaks at
# 0.68 and retractions at 0.8/s over a minute: under 0.95 and 1/s, those two alerts stay silent.
TIMELINE: dict[str, tuple[int, int, int]] = {"LoadlensQueueGrowing": (120, 240, 240)}
LABELS = {"severity": "warning", "model_name": rec.MODEL}

_SAMPLE = re.compile(r"^(?P<name>[^{ ]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+) (?P<ts>\d+)$")


def series_read(dialect: Dialect) -> list[str]:
    """The names the engine alerts read in ``dialect``, from the one mapping."""
    names = []
    for vllm in ENGINE_ALERT_SERIES.values():
        counterpart = BY_VLLM[vllm].sglang
        assert counterpart is not None and not counterpart.matchers and not counterpart.labels, vllm
        names.append(vllm if dialect == "vllm" else counterpart.name)
    return names


def input_series(path: Path, names: list[str], instance: str) -> list[dict[str, str]]:
    """Each series of ``names`` in the OpenMetrics file as a promtool input series (``_`` where a scrape has
    no sample: sglang creates counters on first use)."""
    by_series: dict[str, dict[int, str]] = {}
    for line in path.read_text().splitlines():
        m = _SAMPLE.match(line)
        if m is None or m["name"] not in names:
            continue
        offset = int(m["ts"]) - rec.START
        assert offset % STEP == 0, line
        labels = ",".join(x for x in (f'job="{SERVE_JOB}",instance="{instance}"', m["labels"]) if x)
        by_series.setdefault(f"{m['name']}{{{labels}}}", {})[offset // STEP] = m["value"]
    assert {s.split("{")[0] for s in by_series} == set(names), path.name
    return [
        {"series": s, "values": " ".join(samples.get(i, "_") for i in range(len(EVALS)))}
        for s, samples in by_series.items()
    ]


def expected_alerts(t: int) -> list[dict[str, Any]]:
    out = []
    for name, (active, firing, last) in TIMELINE.items():
        if active <= t <= last:
            state = "firing" if t >= firing else "pending"
            labels = ",".join(f'{k}="{v}"' for k, v in sorted({**LABELS, "alertstate": state}.items()))
            out.append({"labels": f'ALERTS{{alertname="{name}",{labels}}}', "value": 1})
    return out


def test_the_engine_alerts_read_the_series_of_the_mapping() -> None:
    text = (ROOT / generate.OUT / "loadlens-alerts.yaml").read_text()
    for dialect in FIXTURE:
        for name in series_read(dialect):
            assert f"{name}{{" in text, name


@pytest.mark.parametrize("dialect", list(FIXTURE))
def test_engine_alerts_on_the_recorded_overload(dialect: Dialect, tmp_path: Path) -> None:
    promtool = required.promtool()
    rules = [str(ROOT / generate.OUT / f) for f in ("loadlens-rules.yaml", "loadlens-alerts.yaml")]
    test = {
        "rule_files": rules,
        "evaluation_interval": f"{STEP}s",
        "tests": [
            {
                "name": f"the recorded workload in {dialect}'s dialect",
                "interval": f"{STEP}s",
                "input_series": input_series(FIXTURE[dialect], series_read(dialect), INSTANCE[dialect]),
                # Every alert the rules raise on these series, pending or firing, at every evaluation.
                "promql_expr_test": [
                    {"expr": "ALERTS", "eval_time": f"{t}s", "exp_samples": expected_alerts(t)} for t in EVALS
                ],
            }
        ],
    }
    path = tmp_path / f"{dialect}.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
