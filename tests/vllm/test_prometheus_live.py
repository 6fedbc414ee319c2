"""The dashboards and the rule files on a real Prometheus scraping the session's real vLLM (docs/real-vllm.md,
"Dashboards and rules on a real vLLM").

One Prometheus for the module scrapes, as the GPU deployment does (deploy/README.md), vLLM's own ``/metrics`` and
the proxy in front of it (``loadlens serve --engine openai``) under the serving job, with the generated rule
files loaded (evaluated every second). Then LOAD_SECONDS of requests through the proxy: streamed and whole
chats and completions, some with a LoRA adapter loaded through the proxy, an unknown model, a client that
leaves mid-stream. Over that window:

- every query of vLLM's own Grafana dashboards and production-stack's (tests/fixtures/vllm_dashboards/) and
  of loadlens's serving dashboard parses and runs; the ones without data are exactly the listed ones, each
  with why (most: features a default vLLM does not have, and the sim's own series);
- every recording and alerting rule evaluates without error; the recording rules that produce series are
  exactly the listed ones; each engine alert's operands (the ``vllm:`` series it compares with a threshold)
  return one series for the served model.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml

from loadlens.codegen import alerts as generate
from loadlens.contracts.ports import SERVE_JOB
from loadlens.dashboards.catalog import dashboards
from tests.dashboards import test_vllm_dashboards as upstream
from tests.dashboards.support import VARIABLES, all_queries
from tests.support.paths import ROOT
from tests.support.prometheus import PrometheusServer, require_prometheus
from tests.support.vllm_model import SERVED_NAME
from tests.vllm.conftest import Proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LOAD_SECONDS = 12.0
"""Long enough for the dashboards' 5 s and 15 s rate windows to see several scrapes with requests."""
ADAPTER = "live-r8"
"""The adapter this module loads through the proxy (the rank-8 one, by its path under --lora-root)."""
RULE_FILES = ("loadlens-rules.yaml", "loadlens-alerts.yaml")

_SIM = "the sim's own loadlens_sim_* series; a real vLLM has no simulator"
_LOADGEN = "a loadlens load series (job loadlens-loadgen); this module sends its requests itself"

# vLLM's and production-stack's dashboards: every query that stays empty on the real vLLM, and why. The
# reasons shared with the sim are test_vllm_dashboards's (EXPECTED_EMPTY there).
VLLM_EXPECTED_EMPTY: dict[str, str] = dict(upstream.EXPECTED_EMPTY)
VLLM_SAMPLED = re.compile(r"vllm:kv_block_(lifetime|idle_before_evict|reuse_gap)_seconds")
"""Queries of the KV-block residency histograms: vLLM (``--kv-cache-metrics``) follows a random 1 % of the
blocks it allocates, and observes one only when that block is allocated again, so whether a short run has
any is chance. These must parse and run; whether they have data is not asserted."""

# loadlens's serving dashboard: every query that stays empty, and why.
SERVING_EXPECTED_EMPTY: dict[str, str] = {
    "loadlens-serving / Fairness (Jain's index) / {{stage}}": _LOADGEN,
    "loadlens-serving / annotation Stage": _LOADGEN,
    "loadlens-serving / annotation Firing alerts": "no alert can fire: those over the serving job wait >= 1 m "
    "(for:), longer than this Prometheus runs; the others read series nothing here exports",
    "loadlens-serving / Sim lag behind real time / lag now": _SIM,
    "loadlens-serving / Sim lag behind real time / wake-up lateness p99": _SIM,
    "loadlens-serving / Sim lag behind real time / wake-up lateness mean": _SIM,
    "loadlens-serving / Late steps and schedule restarts / late steps/s (> 2 ms)": _SIM,
    "loadlens-serving / Late steps and schedule restarts / schedule restarts/s": _SIM,
    # The proxy times a request's wait behind a LoRA swap only from the swap windows of vLLM's workers, which
    # the probe publishes (--upstream-probe-dir); this proxy has none, so the histogram has no observation.
    # (The delayed share, from the counters, has data.)
    "loadlens-serving / Swap blocking / blocked p99": "no --upstream-probe-dir: the proxy sees no swap windows",
    "loadlens-serving / Swap blocking / blocked mean": "no --upstream-probe-dir: the proxy sees no swap windows",
}

ERRORS = f'loadlens_requests_total{{job="{SERVE_JOB}",code=~"5..|429"}}'
"""The numerator of the error ratio: the proxy's answers with a server error or a rejection."""


@dataclass(frozen=True)
class Scraped:
    prom: PrometheusServer
    start: float
    end: float
    vllm_target: str
    """vLLM's ``host:port``, its ``instance`` label."""


def _load(proxy: Proxy) -> None:
    """LOAD_SECONDS of requests through the proxy, one client at a time (the tiny model answers in tens of
    milliseconds); every fourth with the adapter. Then one unknown model (404) and one client that leaves
    after its first chunk."""
    stop = time.monotonic() + LOAD_SECONDS
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        i = 0
        while time.monotonic() < stop:
            model = ADAPTER if i % 4 == 3 else SERVED_NAME
            if i % 2:
                body = {"model": model, "prompt": f"request {i} " * 8, "max_tokens": 8}
                path = "/v1/completions"
            else:
                body = {"model": model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 8}
                path = "/v1/chat/completions"
            body["stream"] = i % 3 == 0
            with client.stream("POST", path, json=body) as resp:
                assert resp.status_code == 200, resp.read()
                for _ in resp.iter_bytes():
                    pass
            i += 1
        assert client.post("/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
        body = {"model": SERVED_NAME, "prompt": "leave", "max_tokens": 512, "stream": True, "ignore_eos": True}
        with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            next(resp.iter_bytes())  # then close: the proxy aborts the request upstream


@pytest.fixture(scope="module")
def scraped(vllm_proxy: Proxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    require_prometheus()
    vllm_target = vllm_proxy.upstream.url.removeprefix("http://")
    targets = {SERVE_JOB: [vllm_target, vllm_proxy.url.removeprefix("http://")]}
    rules = {"rule_files": [str(ROOT / generate.OUT / name) for name in RULE_FILES]}
    work = tmp_path_factory.mktemp("prometheus")
    loaded = httpx.post(vllm_proxy.url + "/v1/load_lora_adapter", json={"lora_name": ADAPTER, "lora_path": "r8"})
    assert loaded.status_code == 200, loaded.text
    try:
        with PrometheusServer(work, targets=targets, extra_config=rules) as prom:
            _wait_for(prom, f'count(up{{job="{SERVE_JOB}"}} == 1) == 2')
            start = time.time()
            _load(vllm_proxy)
            _until_scraped_running(prom, vllm_proxy, vllm_target)
            time.sleep(3)  # a few more scrapes and rule evaluations after the last request
            yield Scraped(prom, start, time.time(), vllm_target)
    finally:
        unloaded = httpx.post(vllm_proxy.url + "/v1/unload_lora_adapter", json={"lora_name": ADAPTER})
        assert unloaded.status_code == 200, unloaded.text


def _until_scraped_running(prom: PrometheusServer, proxy: Proxy, vllm_target: str, attempts: int = 10) -> None:
    """Long streams, one after another, until a scrape has seen vLLM with a request running. The load's requests
    take tens of milliseconds and the scrapes come once a second, so a scrape may well have caught none; the
    service-status dashboard's output speed divides by the mean of ``vllm:num_requests_running`` over 5 m and
    drops the series where that mean is 0. One stream of 900 tokens runs across several scrapes."""
    seen = f'max_over_time(vllm:num_requests_running{{instance="{vllm_target}"}}[5m]) > 0'
    body = {"model": SERVED_NAME, "prompt": "long", "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=proxy.url, timeout=120) as client:
        for _ in range(attempts):
            time.sleep(1.5)  # the last scrape of the stream's end: a scrape interval and a half
            if prom.query(seen):
                return
            with client.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200, resp.read()
                for _ in resp.iter_bytes():
                    pass
    raise AssertionError(f"{attempts} streams of 900 tokens and no scrape saw a request running; {seen}")


def _wait_for(prom: PrometheusServer, expr: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not prom.query(expr):
        assert time.monotonic() < deadline, f"{expr} stays empty; log:\n{prom.log_tail()}"
        time.sleep(0.2)


def _has_data(run: Scraped, expr: str) -> bool:
    """Whether the range query over the load window has a value that is not NaN (raises on a query
    Prometheus refuses)."""
    data = run.prom.api("query_range", query=expr, start=f"{run.start:.3f}", end=f"{run.end:.3f}", step="1")
    return any(not math.isnan(float(v)) for series in data["result"] for _, v in series["values"])


def _empty(run: Scraped, queries: list[tuple[str, str]]) -> list[str]:
    return sorted(where for where, expr in queries if not _has_data(run, expr))


def test_vllm_dashboards_on_the_real_vllm(scraped: Scraped) -> None:
    window = math.ceil(scraped.end - scraped.start) + 1
    queries = [
        (where, _vllm_concrete(expr, scraped.vllm_target, window)) for where, expr in upstream.dashboard_queries()
    ]
    assert set(VLLM_EXPECTED_EMPTY) <= {where for where, _ in queries}, "VLLM_EXPECTED_EMPTY names a query that is gone"
    sampled = [(where, expr) for where, expr in queries if VLLM_SAMPLED.search(expr)]
    assert len(sampled) == 12  # p50, p95, p99 and mean of each of the three
    sampled_with_data = sum(_has_data(scraped, expr) for _, expr in sampled)  # each parses and runs
    empty = _empty(scraped, [q for q in queries if q not in sampled])
    print(f"{len(queries)} queries: {len(queries) - len(sampled) - len(empty)} of the {len(queries) - len(sampled)} "
          f"asserted have data; {sampled_with_data} of the {len(sampled)} sampled KV-block ones")  # fmt: skip
    assert empty == sorted(VLLM_EXPECTED_EMPTY), "\n".join(sorted(set(empty) ^ set(VLLM_EXPECTED_EMPTY)))


def _vllm_concrete(expr: str, instance: str, window_s: int) -> str:
    """Grafana's substitution as test_vllm_dashboards does it, for the serving job and the served model."""
    expr = expr.replace("$job", SERVE_JOB).replace("$model_name", SERVED_NAME).replace("$Deployment_id", SERVED_NAME)
    return upstream.concrete(expr, instance, window_s)


def test_serving_dashboard_on_the_real_vllm(scraped: Scraped) -> None:
    queries = all_queries({"loadlens-serving": dashboards()["loadlens-serving"]})
    assert set(SERVING_EXPECTED_EMPTY) <= {where for where, _ in queries}, "SERVING_EXPECTED_EMPTY names a gone query"
    variables = {**VARIABLES, "$model": SERVED_NAME}
    concrete = []
    for where, expr in queries:
        for name, value in variables.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, expr
        concrete.append((where, expr))
    empty = _empty(scraped, concrete)
    assert empty == sorted(SERVING_EXPECTED_EMPTY), "\n".join(sorted(set(empty) ^ set(SERVING_EXPECTED_EMPTY)))


def _rules(scraped: Scraped) -> list[dict[str, object]]:
    groups = scraped.prom.api("rules")["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_rule_evaluates_without_error(scraped: Scraped) -> None:
    expected = 0
    for name in RULE_FILES:
        doc = yaml.safe_load((ROOT / generate.OUT / name).read_text())
        expected += sum(len(group["rules"]) for group in doc["groups"])
    rules = _rules(scraped)
    assert len(rules) == expected
    bad = [(r["name"], r["health"], r.get("lastError", "")) for r in rules if r["health"] != "ok"]
    assert bad == []


def test_recording_rules_produce_series(scraped: Scraped) -> None:
    """Every recording rule has a series, but the error ratio while no request failed: its numerator (5xx and
    429 answers) then has no series. Whether one did depends on the session's other tests, so it is read."""
    records = sorted({str(r["name"]) for r in _rules(scraped) if r["type"] == "recording"})
    empty = [name for name in records if not scraped.prom.query(name)]
    failed = bool(scraped.prom.query(ERRORS))
    assert empty == ([] if failed else ["model_name:loadlens_requests_errors:ratio_rate5m"])


_THRESHOLD = re.compile(r"\s*(?:>|<|==)\s*[0-9.e+-]+\s*$")


def test_engine_alerts_read_the_real_vllms_series(scraped: Scraped) -> None:
    """Each engine alert's operands, their threshold taken off, give one series: the served model's."""
    doc = yaml.safe_load((ROOT / generate.OUT / "loadlens-alerts.yaml").read_text())
    (group,) = [g for g in doc["groups"] if g["name"] == "loadlens-engine"]
    operands = []
    for rule in group["rules"]:
        if "vllm:" not in rule["expr"]:
            continue
        for part in rule["expr"].split("\nand "):
            assert _THRESHOLD.search(part), part
            operands.append(_THRESHOLD.sub("", part))
    assert len(operands) == 4  # the queue's length and slope, the KV cache usage, the preemption rate
    for expr in operands:
        assert [r["metric"] for r in scraped.prom.query(expr)] == [{"model_name": SERVED_NAME}], expr
