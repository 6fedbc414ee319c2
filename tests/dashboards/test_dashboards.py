"""The generated dashboards are current and well-formed: units, datasources, stable uids, rate() over
``$__rate_interval`` for every counter and histogram, and every query parses (promtool)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from loadlens.codegen import dashboards as generate
from loadlens.codegen.files import stale
from loadlens.contracts.slo import load_slos
from loadlens.dashboards.catalog import dashboards
from loadlens.dashboards.model import SCHEMA_VERSION, unrated_counters
from tests.dashboards.support import all_queries, concrete
from tests.support import required
from tests.support.paths import ROOT

# Grafana links and bookmarks point at these; changing one breaks them.
STABLE_UIDS = {
    "loadlens-overview": "loadlens-overview",
    "loadlens-gpu": "loadlens-gpu",
    "loadlens-serving": "loadlens-serving",
    "loadlens-serving-sglang": "loadlens-serving-sglang",
    "loadlens-training": "loadlens-training",
}
# The load-test dashboards filter by model, instance and load stage and mark the stages; the training
# dashboard has no model or stage (a training run is no load test): it filters by run and the trainer's GPU.
TRAINING = "loadlens-training"
REQUIRED_VARIABLES = {"datasource", "model", "instance", "stage"}
TRAINING_VARIABLES = {"datasource", "run", "instance", "gpu"}


def _docs() -> dict[str, dict[str, Any]]:
    return {stem: json.loads((ROOT / generate.OUT / f"{stem}.json").read_text()) for stem in STABLE_UIDS}


def test_generated_files_are_current() -> None:
    assert stale(generate.outputs(ROOT)) == [], "run `make generate`"


def test_uids_stable_and_unique() -> None:
    docs = _docs()
    assert {stem: d["uid"] for stem, d in docs.items()} == STABLE_UIDS
    assert len({d["title"] for d in docs.values()}) == len(docs)
    for doc in docs.values():
        assert doc["schemaVersion"] == SCHEMA_VERSION
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))


def test_every_panel_has_unit_datasource_legend() -> None:
    for stem, doc in _docs().items():
        names = [v["name"] for v in doc["templating"]["list"]]
        assert (TRAINING_VARIABLES if stem == TRAINING else REQUIRED_VARIABLES) <= set(names), stem
        for panel in doc["panels"]:
            if panel["type"] == "row":
                continue
            where = f"{stem}: {panel['title']}"
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel["targets"], where
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", where
                assert target["legendFormat"], where
    assert "gpu" in [v["name"] for v in _docs()["loadlens-gpu"]["templating"]["list"]]


def test_annotations_and_slo_lines() -> None:
    for stem, doc in _docs().items():
        exprs = [a.get("expr", "") for a in doc["annotations"]["list"]]
        if stem == TRAINING:
            assert any('loadlens_training_checkpoint_decisions_total{run=~"$run", decision="save"}' in e for e in exprs)
        else:
            assert any("loadlens_loadgen_stage" in e for e in exprs), stem
        assert 'ALERTS{alertstate="firing"}' in exprs, stem
    overview = _docs()["loadlens-overview"]
    latency = [p for p in overview["panels"] if p["title"].startswith(("TTFT (", "ITL (", "E2E"))]
    assert len(latency) == 3
    for panel in latency:
        assert any("loadlens_slo_threshold_seconds" in t["expr"] for t in panel["targets"]), panel["title"]


def test_training_threshold_lines_follow_the_slo_file() -> None:
    slos = load_slos()
    t, g = slos.training, slos.gpu
    panels = {p["title"]: p for p in _docs()[TRAINING]["panels"] if p["type"] != "row"}

    def line(title: str) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = panels[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        return steps

    assert line("Jump ratio (norm / previous EMA)")[1]["value"] == t["grad_norm_jump_factor"]
    assert line("Gradient-norm variance")[1]["value"] == t["checkpoint_grad_norm_variance"]
    assert line("VRAM peak fluctuation")[1]["value"] == g["vram_fluctuation_ratio"]
    assert line("Trainer allocator fragmentation")[1]["value"] == g["fragmentation_ratio"]
    # A lower bound: red below the minimum, green from it up.
    assert line("LoRA A/B update correlation") == [
        {"color": "red", "value": None},
        {"color": "green", "value": t["lora_ab_correlation_min"]},
    ]
    norm = [x["expr"] for x in panels["Gradient L2 norm and EMA"]["targets"]]
    assert f'{t["grad_norm_jump_factor"]:g} * loadlens_training_grad_norm_ema{{run=~"$run"}}' in norm


def test_counters_use_rate_over_rate_interval() -> None:
    bad = {where: unrated_counters(expr) for where, expr in all_queries(dashboards()) if unrated_counters(expr)}
    assert bad == {}


def test_unrated_counter_detection() -> None:
    assert unrated_counters("sum(rate(x_total{a='b'}[$__rate_interval]))") == []
    assert unrated_counters("sum(rate(x_total{a='b'}[5m]))") == ["x_total"]
    assert unrated_counters("x_bucket{}") == ["x_bucket"]
    assert unrated_counters("increase(y_count{}[$__rate_interval]) / x_sum{}") == ["x_sum"]


def test_every_query_parses(tmp_path: Path) -> None:
    promtool = required.promtool()
    queries = all_queries(dashboards())
    rules = [{"record": f"dashboard:query_{i}:check", "expr": concrete(expr)} for i, (_, expr) in enumerate(queries)]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
