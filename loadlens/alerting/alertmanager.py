"""Alertmanager configuration: critical pages, warning opens a ticket, info goes nowhere.

Secrets never live in the file: PagerDuty and Slack receivers are added only when a secret *file* is
configured (``routing_key_file``, ``api_url_file``), so the same generated file works locally (webhook to
``loadlens pager`` only) and in production (secret files mounted by compose or Kubernetes). Environment:

- ``LOADLENS_PAGER_URL``: the webhook both receivers post to (default ``http://127.0.0.1:9095/alerts``);
- ``LOADLENS_PAGERDUTY_ROUTING_KEY_FILE``: file holding a PagerDuty Events v2 routing key → pages also go there;
- ``LOADLENS_SLACK_API_URL_FILE`` (+ ``LOADLENS_SLACK_CHANNEL``): file holding a Slack webhook URL → pages
  and tickets are also posted to Slack.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

DEFAULT_PAGER_URL = "http://127.0.0.1:9095/alerts"
# Labels that identify "the same problem": one notification per alert, SLO, model and GPU.
GROUP_BY = ["alertname", "slo", "model_name", "gen_ai_request_model", "gpu"]


def alertmanager_config(
    pager_url: str = DEFAULT_PAGER_URL,
    *,
    pagerduty_routing_key_file: str | None = None,
    slack_api_url_file: str | None = None,
    slack_channel: str = "#loadlens-alerts",
) -> dict[str, Any]:
    pager: dict[str, Any] = {
        "name": "pager",
        "webhook_configs": [{"url": pager_url, "send_resolved": True, "max_alerts": 0}],
    }
    ticket: dict[str, Any] = {
        "name": "ticket",
        "webhook_configs": [{"url": pager_url, "send_resolved": True, "max_alerts": 0}],
    }
    if pagerduty_routing_key_file:
        pager["pagerduty_configs"] = [
            {
                "routing_key_file": pagerduty_routing_key_file,
                "send_resolved": True,
                "severity": "critical",
                "description": '{{ template "pagerduty.default.description" . }}',
            }
        ]
    if slack_api_url_file:
        slack = {
            "api_url_file": slack_api_url_file,
            "channel": slack_channel,
            "send_resolved": True,
            "title": "{{ .Status | toUpper }} {{ .CommonLabels.alertname }}",
            "text": "{{ range .Alerts }}{{ .Annotations.summary }} {{ .Annotations.description }}\n{{ end }}",
        }
        pager["slack_configs"] = [slack]
        ticket["slack_configs"] = [dict(slack)]
    return {
        "route": {
            "receiver": "ticket",
            "group_by": GROUP_BY,
            "group_wait": "10s",
            "group_interval": "1m",
            "repeat_interval": "4h",
            "routes": [
                {"matchers": ['severity="critical"'], "receiver": "pager", "group_wait": "5s", "repeat_interval": "1h"},
                {"matchers": ['severity="warning"'], "receiver": "ticket"},
                {"matchers": ['severity="info"'], "receiver": "null"},
            ],
        },
        "inhibit_rules": [
            {
                # A page silences the ticket of the same SLO for the same model (burn-rate page vs ticket,
                # TTFT p99 page vs goodput ticket is a different slo and still notifies).
                "source_matchers": ['severity="critical"'],
                "target_matchers": ['severity="warning"'],
                "equal": ["slo", "model_name", "gen_ai_request_model"],
            },
            {
                # A serving target that cannot be scraped makes every latency and SLO alert noise.
                "source_matchers": ['alertname="LoadlensServingDown"'],
                "target_matchers": ['slo=~"ttft|itl|e2e|goodput|availability|lora_swap|ttft-.+"'],
                "equal": [],
            },
            {
                # A GPU exporter that is down or stale makes the GPU alerts meaningless.
                "source_matchers": ['alertname=~"LoadlensGpuExporterDown|LoadlensGpuExporterStale"'],
                "target_matchers": ['component="gpu"', 'alertname!~"LoadlensGpuExporterDown|LoadlensGpuExporterStale"'],
                "equal": [],
            },
        ],
        "receivers": [pager, ticket, {"name": "null"}],
    }


def config_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    return alertmanager_config(
        env.get("LOADLENS_PAGER_URL") or DEFAULT_PAGER_URL,
        pagerduty_routing_key_file=env.get("LOADLENS_PAGERDUTY_ROUTING_KEY_FILE") or None,
        slack_api_url_file=env.get("LOADLENS_SLACK_API_URL_FILE") or None,
        slack_channel=env.get("LOADLENS_SLACK_CHANNEL") or "#loadlens-alerts",
    )
