"""The generated compose-side configs pass promtool and amtool (skipped where not installed; failed under CI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from loadlens.codegen.compose import OUT as COMPOSE_OUT
from loadlens.codegen.compose import RULES_DIR
from tests.support import required
from tests.support.paths import ROOT

OUT = ROOT / COMPOSE_OUT


def _tool(name: str) -> str:
    return required.require_binary(name, how="make system-deps")


def test_alertmanager_config_passes_amtool() -> None:
    amtool = _tool("amtool")
    result = subprocess.run(
        [amtool, "check-config", str(OUT / "alertmanager.yml")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = _tool("promtool")
    config = yaml.safe_load((OUT / "prometheus.yml").read_text())
    # The rules directory is mounted from alerts/; point promtool at it so the rule files are checked too.
    config["rule_files"] = [f.replace(RULES_DIR, str(ROOT / "alerts")) for f in config["rule_files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
