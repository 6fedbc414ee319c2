"""Alertmanager routing and inhibition: amtool on the generated file, and a real Alertmanager."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from loadlens.alerting.alertmanager import alertmanager_config, config_from_env
from tests.support import required
from tests.support.alertmanager import AlertmanagerServer
from tests.support.paths import ROOT

AM_FILE = ROOT / "alerts" / "alertmanager.yml"


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([required.amtool(), *args], capture_output=True, text=True, timeout=30)


def test_check_config() -> None:
    proc = _amtool("check-config", str(AM_FILE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=LoadlensTTFTP99High", "slo=ttft"], "pager"),
        (["severity=critical", "alertname=LoadlensGpuXidError", "gpu=0"], "pager"),
        (["severity=warning", "alertname=LoadlensKVCacheNearFull"], "ticket"),
        (["severity=info", "alertname=Something"], "null"),
        (["alertname=NoSeverity"], "ticket"),
    ],
)
def test_routes(labels: list[str], receiver: str) -> None:
    proc = _amtool("config", "routes", "test", f"--config.file={AM_FILE}", f"--verify.receivers={receiver}", *labels)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == receiver


def test_pagerduty_and_slack_from_secret_files(tmp_path: Path) -> None:
    key, url = tmp_path / "pd_key", tmp_path / "slack_url"
    key.write_text("0123456789abcdef0123456789abcdef")
    url.write_text("https://hooks.slack.invalid/services/T/B/X")
    env = {
        "LOADLENS_PAGER_URL": "http://pager:9095/alerts",
        "LOADLENS_PAGERDUTY_ROUTING_KEY_FILE": str(key),
        "LOADLENS_SLACK_API_URL_FILE": str(url),
    }
    cfg = config_from_env(env)
    receivers = {r["name"]: r for r in cfg["receivers"]}
    assert receivers["pager"]["pagerduty_configs"][0]["routing_key_file"] == str(key)
    assert receivers["pager"]["slack_configs"][0]["api_url_file"] == str(url)
    assert "pagerduty_configs" not in receivers["ticket"]
    assert receivers["pager"]["webhook_configs"][0]["url"] == "http://pager:9095/alerts"
    text = yaml.safe_dump(cfg)
    assert "0123456789abcdef" not in text and "hooks.slack" not in text  # secrets stay in their files
    path = tmp_path / "am.yml"
    path.write_text(text)
    proc = _amtool("check-config", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _alert(name: str, severity: str, **labels: str) -> dict[str, object]:
    return {"labels": {"alertname": name, "severity": severity, **labels}, "annotations": {"summary": "x."}}


def test_real_alertmanager_inhibits_ticket_behind_page(tmp_path: Path) -> None:
    cfg = alertmanager_config("http://127.0.0.1:9/alerts")  # nothing listens: delivery is not under test here
    with AlertmanagerServer(tmp_path, cfg) as am:
        am.post_alerts(
            [
                _alert("LoadlensErrorBudgetBurn", "critical", slo="availability", model_name="m"),
                _alert("LoadlensErrorBudgetBurn", "warning", slo="availability", model_name="m"),
                _alert("LoadlensErrorBudgetBurn", "warning", slo="availability", model_name="other"),
                _alert("LoadlensServingDown", "critical", job="loadlens-serve", instance="x"),
                _alert("LoadlensTTFTP99High", "critical", slo="ttft", gen_ai_request_model="m"),
                _alert("LoadlensKVCacheNearFull", "warning", model_name="m"),
            ]
        )
        expected = {
            ("LoadlensErrorBudgetBurn", "critical", "m"): "suppressed",  # serving down hides SLO alerts
            ("LoadlensErrorBudgetBurn", "warning", "m"): "suppressed",
            ("LoadlensErrorBudgetBurn", "warning", "other"): "suppressed",
            ("LoadlensTTFTP99High", "critical", ""): "suppressed",
            ("LoadlensServingDown", "critical", ""): "active",
            ("LoadlensKVCacheNearFull", "warning", "m"): "active",  # no slo label: not inhibited
        }
        # Alertmanager marks an alert inhibited only once the inhibiting alert has been processed, so an early
        # read can show "active" for a moment: wait for the final states (a wrong rule never reaches them).
        deadline = time.monotonic() + 30  # a polling deadline: the loop ends as soon as the states are final
        states: dict[tuple[str, str, str], str] = {}
        while time.monotonic() < deadline:
            states = {
                (a["labels"]["alertname"], a["labels"]["severity"], a["labels"].get("model_name", "")): a["status"][
                    "state"
                ]
                for a in am.alerts()
            }
            if states == expected:
                break
            time.sleep(0.2)
    assert states == expected


def test_real_alertmanager_page_inhibits_same_slo_ticket_only(tmp_path: Path) -> None:
    cfg = alertmanager_config("http://127.0.0.1:9/alerts")
    with AlertmanagerServer(tmp_path, cfg) as am:
        am.post_alerts(
            [
                _alert("LoadlensErrorBudgetBurn", "critical", slo="availability", model_name="m"),
                _alert("LoadlensErrorBudgetBurn", "warning", slo="availability", model_name="m"),
                _alert("LoadlensErrorBudgetBurn", "warning", slo="availability", model_name="other"),
                _alert("LoadlensGoodputLow", "warning", slo="goodput", model_name="m"),
            ]
        )
        expected = {
            ("LoadlensErrorBudgetBurn", "critical", "m"): "active",
            ("LoadlensErrorBudgetBurn", "warning", "m"): "suppressed",
            ("LoadlensErrorBudgetBurn", "warning", "other"): "active",
            ("LoadlensGoodputLow", "warning", "m"): "active",
        }
        # Processed is not final: the ticket shows "active" until Alertmanager has processed the page that
        # inhibits it (the test above). Wait for the final states; a wrong rule never reaches them.
        deadline = time.monotonic() + 30  # a polling deadline: the loop ends as soon as the states are final
        states: dict[tuple[str, str, str], str] = {}
        while time.monotonic() < deadline:
            states = {
                (a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["model_name"]): a["status"]["state"]
                for a in am.alerts()
            }
            if states == expected:
                break
            time.sleep(0.2)
    assert states == expected
