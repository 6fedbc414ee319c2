"""The typed model of benchmark_result.json: what it accepts, what it refuses, and that the docs name every key."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from loadlens.contracts import results as R
from tests.support.paths import ROOT

FIXTURE = ROOT / "tests" / "report" / "fixtures" / "benchmark_result.json"
LATENCY_KEY = re.compile(r"^(mean|median|std|min|max|p50|p90|p95|p99|p99\.9)_[a-z0-9_]+_ms$|^[a-z0-9_]+_samples$")


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text())
    return doc


def test_a_partial_document_parses_with_absent_figures_as_none() -> None:
    result = R.parse_result(_doc(), "f.json")
    assert result.run.run_id == "fixture-run"
    first = result.stages[0]
    assert (first.name, first.warmup, first.mean_ttft_ms, first.p99_ttft_ms) == ("warmup", True, 161.879365, 280.4475)
    assert first.server is not None and first.server.peak_vram_gib == 36.794302
    assert first.completed is None and first.p90_ttft_ms is None  # absent, never a fake 0
    assert result.overall is None


def test_the_dotted_percentile_key_round_trips() -> None:
    doc = _doc()
    doc["stages"][0]["p99.9_ttft_ms"] = 300.5
    stage = R.parse_result(doc).stages[0]
    assert stage.p99_9_ttft_ms == 300.5
    assert stage.model_dump(by_alias=True, exclude_unset=True)["p99.9_ttft_ms"] == 300.5


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema="other"), "f.json: not a loadlens benchmark_result.json (schema is not "
         "loadlens.benchmark_result)"),
        (lambda d: d.update(schema_version=2), "f.json: schema_version 2 is not 1 (written by another loadlens "
         "version)"),
        (lambda d: d["stages"][0].update(mean_ttft=1.0), "f.json: stages.0.mean_ttft: Extra inputs are not permitted"),
        (lambda d: d["stages"][1].update(warmup="sometimes"), "f.json: stages.1.warmup: Input should be a valid "
         "boolean, unable to interpret input"),
        (lambda d: d.update(stages={}), "f.json: stages: Input should be a valid list"),
    ],
    ids=["schema", "version", "unknown-key", "bad-type", "stages-not-a-list"],
)  # fmt: skip
def test_a_bad_document_is_refused_naming_the_key(edit: Any, message: str) -> None:
    doc = _doc()
    edit(doc)
    with pytest.raises(R.ResultsError) as err:
        R.parse_result(doc, "f.json")
    assert str(err.value) == message


def _keys(model: type[R.BaseModel]) -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(field.alias or name)
    return out


def test_docs_name_every_key() -> None:
    """docs/loadgen.md names each key, and the latency family by its pattern and each distribution."""
    text = (ROOT / "docs" / "loadgen.md").read_text()
    models = (R.StageResult, R.Overall, R.RunInfo, R.ProfileInfo, R.TrafficClass, R.SLOInfo, R.SLOClass,
              R.Validity, R.SummaryRow, R.ServerFigures, R.Versions, R.BenchmarkResult, R.Verdict, R.VerdictWindow,
              R.SLOCheck, R.VerdictAlert, R.VerdictPage, R.WorkloadFigures, R.TurnFigures, R.TrafficPrefix,
              R.TrafficConversation, R.Distribution)  # fmt: skip
    missing = sorted(k for m in models for k in _keys(m) if not LATENCY_KEY.match(k) and k not in text)
    assert missing == []
    for infix in ("ttft", "tpot", "itl", "e2el", "chunk_itl", "dispatch_lag"):
        assert infix in text
