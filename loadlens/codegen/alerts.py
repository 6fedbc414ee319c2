"""The generated files in ``alerts/``: recording rules, alerts and the local Alertmanager config, from the SLO
file (``python -m loadlens.codegen`` writes them)."""

from __future__ import annotations

from pathlib import Path

from loadlens.alerting.alertmanager import alertmanager_config
from loadlens.alerting.rule_file import render
from loadlens.alerting.rules import build_groups
from loadlens.contracts.slo import load_slos

OUT = Path("alerts")


def outputs(root: Path, slo_file: Path | None = None) -> dict[Path, str]:
    recording, alerts = build_groups(load_slos(slo_file))
    return {
        root / OUT / "loadlens-rules.yaml": render({"groups": recording}),
        root / OUT / "loadlens-alerts.yaml": render({"groups": alerts}),
        # The local default; deployments regenerate it from LOADLENS_* variables (loadlens/alerting/alertmanager.py).
        root / OUT / "alertmanager.yml": render(alertmanager_config()),
    }
