"""Prometheus recording and alerting rules, built from the SLO file (one source of truth).

Conventions (kubernetes-mixin / node-mixin style):
- recording rules are named ``level:metric:operations`` with the window in the name; ``_total`` is dropped
  under ``rate()``;
- SLO series follow sloth's names (``slo:sli_error:ratio_rate5m`` ... with ``sloth_id``, ``sloth_service``,
  ``sloth_slo``, ``sloth_window`` labels; ``slo:objective:ratio``, ``slo:error_budget:ratio``) so sloth's
  dashboards read them;
- every alert is CamelCase with the ``Loadlens`` prefix, has ``for``, ``severity`` (``critical`` pages,
  ``warning`` opens a ticket), a static ``summary`` ending with a period, a templated ``description`` and a
  ``runbook_url`` to ``docs/runbooks.md#<alertname lower-cased>`` (added to all by one function).
"""

from __future__ import annotations

from typing import Any

from loadlens.alerting.efficiency_rules import gpu_efficiency_alert_group
from loadlens.alerting.rule_kit import Ctx, add_runbook_links
from loadlens.alerting.slo_rules import burn_rate_group, serving_recording_group, slo_alert_group, slo_recording_groups
from loadlens.alerting.system_rules import (
    engine_alert_group,
    gpu_alert_group,
    loadgen_alert_group,
    training_alert_group,
)
from loadlens.contracts.slo import SLOConfig


def build_groups(slos: SLOConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(recording groups, alerting groups)."""
    c = Ctx(slos, slos.alerting)
    recording = [serving_recording_group(c), *slo_recording_groups(c)]
    alerts = [
        slo_alert_group(c),
        burn_rate_group(c),
        engine_alert_group(c),
        gpu_alert_group(c),
        gpu_efficiency_alert_group(c),
        loadgen_alert_group(c),
        training_alert_group(c),
    ]
    return recording, add_runbook_links(alerts, c.a["runbook_base_url"])
