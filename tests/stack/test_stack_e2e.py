"""End to end, for real: the local stack (Prometheus, Alertmanager, sim server, GPU exporter, pager) pages
when the simulator is driven into a TTFT SLA breach, the page resolves when the load stops, and a healthy
run pages nothing.

Timing budget (stated bound): scrape and rule evaluation every 1 s, a 10 s latency window with ``for: 5s``
(a test SLO file; the packaged one uses 1m/1m), Alertmanager group_wait 1 s, Prometheus resend delay 1 s.
The page must arrive within 45 s of the breach starting and resolve within 60 s of the load stopping: wall-clock
bounds, so the test runs in the serial phase (tests/conftest.py SERIAL). The test SLO file also gives ITL and
E2E bounds no loaded machine reaches, so what may page the healthy load is the TTFT alert under test.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadlens.contracts.slo import DEFAULT_SLO_FILE
from loadlens.stack.runner import Stack
from tests.support.stack import running_stack

# Measured in five runs on the loaded 2-core box (load average ~4, beside other test runs): paged 11.5-12.5 s
# after the breach began, resolved 11.0-12.5 s after the load stopped; the bounds are 3.6x and 4.8x the worst.
PAGE_BOUND_S = 45
RESOLVE_BOUND_S = 60


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    slo = yaml.safe_load(DEFAULT_SLO_FILE.read_text())
    slo["alerting"].update({"latency_window": "10s", "latency_for": "5s", "min_request_rate": 0.1})
    # ITL and E2E bounds no loaded machine reaches: the healthy load must page nothing, and what may page it is
    # the TTFT alert this test is about, not a stall of the box pushing the sim's ITL p99 past 50 ms.
    for cls in slo["classes"]:
        cls["itl_seconds"], cls["e2e_seconds"] = 30.0, 300.0
    slo_file = tmp_path / "slos.yaml"
    slo_file.write_text(yaml.safe_dump(slo))
    with running_stack(tmp_path, slo_file=slo_file, knobs=["max_waiting=1000"]) as s:
        yield s


def _url(stack: Stack, name: str) -> str:
    return next(s.url for s in stack._load() if s.name == name)


async def _load(url: str, streams: int, seconds: float, enough: asyncio.Event | None = None) -> int:
    """Closed-loop chat streams of 32 tokens for `seconds`, or until ``enough`` is set (the requests under way
    then finish); returns the number of completed requests."""
    done = 0
    stop = time.monotonic() + seconds
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi " * 50}], "max_tokens": 32,
            "ignore_eos": True, "stream": True}  # fmt: skip

    async def user(client: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < stop and not (enough is not None and enough.is_set()):
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_bytes():
                    pass
            done += 1

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(user(client) for _ in range(streams)))
    return done


def _pages(stack: Stack) -> list[dict[str, Any]]:
    path = stack.run_dir / "pages.jsonl"
    if not path.exists():
        return []
    pages = []
    for line in path.read_text().splitlines():
        try:
            pages.append(json.loads(line))
        except ValueError:
            continue  # the line the pager is writing as we read
    return pages


def _ttft_alerts(stack: Stack, status: str) -> list[dict[str, Any]]:
    return [
        a
        for n in _pages(stack)
        for a in n["alerts"]
        if a["labels"]["alertname"] == "LoadlensTTFTP99High" and a["status"] == status
    ]


@pytest.mark.slow
@pytest.mark.timeout(270)  # 81-84 s measured when the breach ran on to 45 s; 53 s since it stops once paged (x5)
def test_ttft_breach_pages_then_resolves_and_healthy_load_pages_nothing(stack: Stack) -> None:
    serve = _url(stack, "serve")
    prom = _url(stack, "prometheus")
    # Wait until Prometheus has discovered Alertmanager, or the first notifications are dropped.
    deadline = time.monotonic() + 20
    while not httpx.get(prom + "/api/v1/alertmanagers").json()["data"]["activeAlertmanagers"]:
        assert time.monotonic() < deadline, "Prometheus never discovered Alertmanager"
        time.sleep(0.5)

    # 1. Healthy: 4 streams on an idle engine keep TTFT far below 0.2 s. Nothing pages.
    healthy = asyncio.run(_load(serve, 4, 15))
    assert healthy > 20
    time.sleep(3)
    assert _pages(stack) == []

    # 2. Breach (admin API): every step that admits a request costs the sim 300 ms, so every first token the
    #    server observes is past 0.2 s whatever the 12 streams manage. (A queue behind one sequence slot hung the
    #    server's TTFT on the client keeping the queue full: tests/stack/test_demo_verdict.py, where CI saw it.)
    r = httpx.patch(serve + "/admin/knobs", json={"insertion_overhead_us": 300_000})
    assert r.status_code == 200, r.text
    started = time.monotonic()

    async def breach_until_paged() -> float:
        paged = asyncio.Event()
        task = asyncio.create_task(_load(serve, 12, PAGE_BOUND_S, paged))
        while not task.done():
            if _ttft_alerts(stack, "firing"):
                paged_after = time.monotonic() - started
                paged.set()  # the load stops once it has paged (it ran on to the bound before: 30 s of the test)
                await task
                return paged_after
            await asyncio.sleep(0.5)
        await task
        return float("inf")

    paged_after = asyncio.run(breach_until_paged())
    assert paged_after <= PAGE_BOUND_S, "no TTFT page within the bound"
    firing = _ttft_alerts(stack, "firing")[0]
    assert firing["labels"]["severity"] == "critical"
    assert firing["labels"]["priority_class"] == "interactive"
    assert firing["labels"]["gen_ai_request_model"] == "tiny"
    pager = _url(stack, "pager")
    # The links a page carries open: the runbook section on this stack's pager, the source in its Prometheus.
    assert firing["annotations"]["runbook_url"] == f"{pager}/runbooks#loadlensttftp99high"
    runbooks = httpx.get(firing["annotations"]["runbook_url"].split("#")[0])
    assert runbooks.status_code == 200 and '<h2 id="loadlensttftp99high">' in runbooks.text
    assert firing["generatorURL"].startswith(prom + "/")
    notification = next(n for n in _pages(stack) if any(a in n["alerts"] for a in [firing]))
    assert notification["receiver"] == "pager" and notification["version"] == "4"
    assert notification["externalURL"] == _url(stack, "alertmanager")
    # What `loadlens stack status` prints. Alertmanager may deliver another notification of the firing group
    # meanwhile (group_interval 5 s), so its count is checked against the log read just before and just after.
    before = len(_pages(stack))
    firing_now, notifications, last = stack.alerts_and_pages()
    after = len(_pages(stack))
    assert firing_now is not None and "LoadlensTTFTP99High{critical}" in firing_now
    assert 1 <= before <= notifications <= after and last is not None
    links = dict(stack.ui_links())
    for what in ("Prometheus graph", "Prometheus alerts", "Alertmanager", "Runbooks"):
        assert httpx.get(links[what]).status_code == 200, (what, links[what])

    # 3. Load stops: the latency window empties, the alert resolves and the pager hears it.
    stopped = time.monotonic()
    while not _ttft_alerts(stack, "resolved"):
        assert time.monotonic() - stopped < RESOLVE_BOUND_S, "TTFT page did not resolve after the load stopped"
        time.sleep(0.5)
