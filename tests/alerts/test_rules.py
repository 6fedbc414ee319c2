"""Generated rule files: current, valid (promtool check), unit-tested (promtool test), every alert covered."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadlens.alerting.rules import build_groups
from loadlens.codegen import alerts as generate
from loadlens.contracts.slo import load_slos
from tests.support import required
from tests.support.paths import ROOT

ALERTS = ROOT / generate.OUT
TESTS = sorted((ALERTS / "tests").glob("*.test.yaml"))


def test_generated_files_are_current() -> None:
    for path, text in generate.outputs(ROOT).items():
        assert path.read_text() == text, f"{path.name} is stale: run `make generate`"


def test_promtool_check_rules() -> None:
    files = [str(p) for p in sorted(ALERTS.glob("loadlens-*.yaml"))]
    proc = subprocess.run([required.promtool(), "check", "rules", *files], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.parametrize("test_file", TESTS, ids=[p.name for p in TESTS])
def test_promtool_unit_tests(test_file: Path) -> None:
    proc = subprocess.run(
        [required.promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _alert_tests() -> list[dict[str, Any]]:
    cases = []
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    _, alert_groups = build_groups(load_slos())
    names = {r["alert"] for g in alert_groups for r in g["rules"]}
    cases = _alert_tests()
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert names - firing == set(), "alerts without a firing test"
    assert names - quiet == set(), "alerts without a not-firing test"


def test_every_alert_follows_the_conventions() -> None:
    _, alert_groups = build_groups(load_slos())
    for group in alert_groups:
        for rule in group["rules"]:
            name = rule["alert"]
            assert name.startswith("Loadlens") and name[0].isupper(), name
            assert rule["for"], name
            assert rule["labels"]["severity"] in {"critical", "warning"}, name
            ann = rule["annotations"]
            assert ann["summary"].endswith(".") and "{{" not in ann["summary"], name
            assert "{{" in ann["description"], name
            assert ann["runbook_url"].endswith("#" + name.lower()), name


def test_runbooks_cover_every_alert() -> None:
    _, alert_groups = build_groups(load_slos())
    text = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {line.removeprefix("## ").strip().lower() for line in text.splitlines() if line.startswith("## ")}
    for group in alert_groups:
        for rule in group["rules"]:
            assert rule["alert"].lower() in anchors, f"docs/runbooks.md has no section for {rule['alert']}"
