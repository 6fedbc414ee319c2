"""The pager: v4 payload validation, lossless JSONL under concurrent posts, printed pages, counters."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from loadlens.pager.app import create_pager_app
from tests.support.server import serve_app


def payload(
    name: str = "LoadlensTTFTHigh", status: str = "firing", n: int = 1, severity: str = "critical"
) -> dict[str, Any]:
    alerts = [
        {
            "status": status,
            "labels": {"alertname": name, "severity": severity, "model_name": "m", "i": str(i)},
            "annotations": {"summary": "TTFT p99 is over its SLO."},
            "startsAt": "2026-11-29T22:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://127.0.0.1:19090/graph",
            "fingerprint": f"f{i}",
        }
        for i in range(n)
    ]
    return {
        "version": "4",
        "groupKey": '{}:{alertname="' + name + '"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "pager",
        "groupLabels": {"alertname": name},
        "commonLabels": {"alertname": name},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:19093",
        "alerts": alerts,
    }


def test_accepts_v4_prints_logs_and_counts(tmp_path: Path) -> None:
    log = tmp_path / "pages.jsonl"
    out = io.StringIO()
    registry = CollectorRegistry()
    with serve_app(create_pager_app(log, registry, out)) as url:
        r = httpx.post(url + "/alerts", json=payload(n=2))
        assert r.status_code == 200
        assert r.json() == {"status": "ok", "alerts": 2}
        pages = httpx.get(url + "/pages").json()["notifications"]
    assert len(pages) == 1 and pages[0]["receiver"] == "pager"
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["groupKey"] == '{}:{alertname="LoadlensTTFTHigh"}'
    printed = out.getvalue().splitlines()
    assert printed == [
        "PAGE firing critical LoadlensTTFTHigh i=0 model_name=m :: TTFT p99 is over its SLO.",
        "PAGE firing critical LoadlensTTFTHigh i=1 model_name=m :: TTFT p99 is over its SLO.",
    ]
    labels = {"alertname": "LoadlensTTFTHigh", "severity": "critical", "status": "firing"}
    assert registry.get_sample_value("loadlens_pager_alerts_total", labels) == 2
    assert (
        registry.get_sample_value("loadlens_pager_notifications_total", {"receiver": "pager", "status": "firing"}) == 1
    )


def test_bad_payloads_are_400_and_not_logged(tmp_path: Path) -> None:
    log = tmp_path / "pages.jsonl"
    registry = CollectorRegistry()
    with serve_app(create_pager_app(log, registry, io.StringIO())) as url:
        cases = [
            b"not json",
            b"[]",
            json.dumps({**payload(), "version": "3"}).encode(),
            json.dumps({**payload(), "alerts": []}).encode(),
            json.dumps({**payload(), "alerts": [{"status": "weird", "labels": {}, "startsAt": "x"}]}).encode(),
        ]
        for body in cases:
            r = httpx.post(url + "/alerts", content=body)
            assert r.status_code == 400, body
            assert r.json()["error"]["code"] == 400
    assert not log.exists() or log.read_text() == ""
    assert registry.get_sample_value("loadlens_pager_invalid_payloads_total") == 5
    assert r.json()["error"]["type"] == "BadRequestError"  # the shared OpenAI-style body


def test_concurrent_posts_lose_nothing(tmp_path: Path) -> None:
    log = tmp_path / "pages.jsonl"
    with (
        serve_app(create_pager_app(log, CollectorRegistry(), io.StringIO())) as url,
        httpx.Client() as client,
        ThreadPoolExecutor(8) as pool,
    ):
        statuses = list(
            pool.map(lambda i: client.post(url + "/alerts", json=payload(f"A{i}", n=3)).status_code, range(200))
        )
    assert statuses == [200] * 200
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 200
    assert sorted(line["groupLabels"]["alertname"] for line in lines) == sorted(f"A{i}" for i in range(200))


def test_metrics_negotiates_text_or_openmetrics(tmp_path: Path) -> None:
    with serve_app(create_pager_app(tmp_path / "pages.jsonl", CollectorRegistry(), io.StringIO())) as url:
        httpx.post(url + "/alerts", content=b"not json")
        plain = httpx.get(url + "/metrics")
        om = httpx.get(url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "loadlens_pager_invalid_payloads_total 1.0" in plain.text.splitlines()
    assert om.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert "loadlens_pager_invalid_payloads_total 1.0" in om.text.splitlines()
    assert om.text.endswith("# EOF\n")


def test_a_ticket_is_printed_as_a_ticket(tmp_path: Path) -> None:
    out = io.StringIO()
    doc = payload(n=1, severity="warning")
    doc["receiver"] = "ticket"
    with serve_app(create_pager_app(tmp_path / "p.jsonl", CollectorRegistry(), out)) as url:
        assert httpx.post(url + "/alerts", json=doc).status_code == 200
    assert out.getvalue().splitlines() == [
        "TICKET firing warning LoadlensTTFTHigh i=0 model_name=m :: TTFT p99 is over its SLO."
    ]


def test_runbooks_page_has_an_anchor_per_alert(tmp_path: Path) -> None:
    from loadlens.alerting.rules import build_groups
    from loadlens.contracts.slo import load_slos

    with serve_app(create_pager_app(tmp_path / "p.jsonl", CollectorRegistry(), io.StringIO())) as url:
        page = httpx.get(url + "/runbooks")
        source = httpx.get(url + "/runbooks.md")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert source.status_code == 200 and source.text.startswith("# Runbooks\n")
    _, alerts = build_groups(load_slos())
    for group in alerts:
        for rule in group["rules"]:
            anchor = rule["alert"].lower()
            assert f'<h2 id="{anchor}"><a href="#{anchor}">{rule["alert"]}</a></h2>' in page.text
    assert "<code>histogram_quantile(0.99, sum by (le, priority_class)" in page.text  # inline code rendered
    assert "<strong>Means.</strong>" in page.text
