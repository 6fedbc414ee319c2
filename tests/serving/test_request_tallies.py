"""The per-request tallies (exporters/serving/tallies.py ``CountTally``, ``HistogramTally``): what a request adds
at admission and at its end leaves every series as ``inc``, ``dec`` and ``observe`` of prometheus_client would,
exemplars included: the same exposition, byte for byte, at every scrape."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from exporters.serving.engine import RequestTiming
from exporters.serving.http_metrics import HttpMetrics
from exporters.serving.lifecycle import RequestLifecycle
from exporters.serving.metrics import ServingMetrics, Tallies
from exporters.serving.request_log import RequestLogger
from exporters.serving.tallies import CountTally, FoldingSummary, HistogramTally, SummaryTally
from loadlens.contracts.slo import load_slos

BOUNDS = (0.01, 0.1, 1.0, 80.0)
AMOUNTS = [0.0, 0.004, 0.01, 0.0100001, 0.05, 0.1, 0.1000001, 0.7, 1.0, 3.0, 80.0, 1e9, 0.1, 0.003]
"""On, just below and just above bounds (a bound is in its own bucket), and past the last."""


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """time.time() reads the list's value (exemplars' times), in every module; the test sets it."""
    stamp = [1_700_000_000.0]
    monkeypatch.setattr(time, "time", lambda: stamp[0])
    yield stamp


def _lines(registry: CollectorRegistry) -> list[bytes]:
    """The OpenMetrics exposition (with exemplars) less ``_created`` lines (children are made at other times)."""
    return [line for line in generate_openmetrics(registry).split(b"\n") if b"_created" not in line]


def _pair() -> tuple[
    CollectorRegistry, Tallies, Histogram, Counter, Gauge, CollectorRegistry, Histogram, Counter, Gauge
]:
    """The same three series twice: children behind tallies (folded before every collect), and plain ones."""

    def series(registry: CollectorRegistry) -> tuple[Histogram, Counter, Gauge]:
        h = Histogram("h_seconds", "h", ["k"], buckets=BOUNDS, registry=registry)
        c = Counter("c", "c", ["k"], registry=registry)
        g = Gauge("g", "g", ["k"], registry=registry)
        return h, c, g

    ours, reference = CollectorRegistry(), CollectorRegistry()
    tallies = Tallies()
    h, c, g = series(ours)
    for parent in (h, c, g):
        collect = parent.collect

        def folded(collect=collect):  # type: ignore[no-untyped-def]
            tallies.fold()
            return collect()

        parent.collect = folded  # type: ignore[method-assign]
    return (ours, tallies, h, c, g, reference, *series(reference))


def test_tallies_expose_what_observe_inc_and_dec_do_with_exemplars(clock: list[float]) -> None:
    ours, tallies, h, c, g, reference, rh, rc, rg = _pair()
    th, tc, tg = HistogramTally(h.labels("a")), CountTally(c.labels("a")), CountTally(g.labels("a"))
    tallies.keep(th, tc, tg)
    plain_h, plain_c, plain_g = rh.labels("a"), rc.labels("a"), rg.labels("a")
    assert _lines(ours) == _lines(reference)
    for i, amount in enumerate(AMOUNTS):
        exemplar = {"trace_id": f"{i:032x}"} if i % 3 else None
        clock[0] = 1_700_000_000.0 + i
        th.observe(amount, exemplar)
        plain_h.observe(amount, exemplar)
        tc.inc()
        plain_c.inc()
        if i % 2:
            tg.dec()
            plain_g.dec()
        else:
            tg.inc(2)
            plain_g.inc(2)
        if i % 4 == 0:  # scrapes between the observations: each sees all before it
            assert _lines(ours) == _lines(reference)
    ours_lines = _lines(ours)
    assert ours_lines == _lines(reference)
    assert _lines(ours) == ours_lines  # a second scrape adds nothing
    assert b'h_seconds_bucket{k="a",le="0.01"} 4' in b"\n".join(ours_lines)
    assert b'h_seconds_count{k="a"} 14' in b"\n".join(ours_lines)
    assert b'c_total{k="a"} 14.0' in b"\n".join(ours_lines)
    assert b'g{k="a"} 7.0' in b"\n".join(ours_lines)  # 7 incs of 2, 7 decs
    assert sum(b"# {trace_id=" in line for line in ours_lines) == 5  # each of the 5 buckets got one: its last


def test_a_restricted_scrape_and_a_scrape_from_another_thread_fold_too(clock: list[float]) -> None:
    ours, tallies, h, c, g, reference, rh, rc, rg = _pair()
    th, tc = HistogramTally(h.labels("a")), CountTally(c.labels("a"))
    tallies.keep(th, tc)
    th.observe(0.5, {"trace_id": "f" * 32})
    tc.inc()
    restricted = generate_latest(ours.restricted_registry(["h_seconds_count", "c_total"]))
    assert b'h_seconds_count{k="a"} 1.0' in restricted and b'c_total{k="a"} 1.0' in restricted
    seen: list[float | None] = []

    def scrape() -> None:
        for _ in range(200):
            seen.append(ours.get_sample_value("c_total", {"k": "a"}))

    thread = threading.Thread(target=scrape)
    thread.start()
    for _ in range(2000):
        tc.inc()
    thread.join()
    assert seen == sorted(seen)  # only ever grows
    assert ours.get_sample_value("c_total", {"k": "a"}) == 2001.0


def _life(metrics: ServingMetrics, arrival: float) -> RequestLifecycle:
    return RequestLifecycle.start(
        metrics=metrics, logger=RequestLogger("logfmt"), tracer=None, parent=None, parent_ids=None,
        request_id="r", path="/v1/completions", endpoint="completions", requested_model="m", model_label="m",
        priority=0, priority_class=metrics.slos.classes[0], stream=True, arrival=arrival,
    )  # fmt: skip


def test_finished_requests_are_counted_through_the_tallies(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, load_slos(), "openai", "test")
    metrics.seed_model("m")
    cls = metrics.slos.classes[0]
    labels = {"model_name": "m", "priority_class": cls.name}
    genai = {"gen_ai_operation_name": "text_completion", "gen_ai_provider_name": "openai",
             "gen_ai_request_model": "m", "priority_class": cls.name}  # fmt: skip
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    lives = []
    for _ in range(3):
        life = _life(metrics, 100.0)
        life.admit()
        lives.append(life)
    assert registry.get_sample_value("loadlens_requests_in_flight", labels) == 3.0
    for i, life in enumerate(lives[:2]):
        life.on_event(100.0 + 0.05, 1, 10, 1)
        life.on_event(100.0 + 0.05 + 0.02 * (i + 1), 1, 10, 2)
        now[0] = 100.0 + 0.5 * (i + 1)
        life.finish_ok("length", RequestTiming())
    lives[2].finish_abort("client_disconnect", None)
    sample = registry.get_sample_value
    assert sample("loadlens_requests_in_flight", labels) == 0.0
    assert sample("loadlens_slo_eligible_requests_total", labels) == 2.0
    assert sample("loadlens_requests_total", {**labels, "code": "200"}) == 2.0
    assert sample("loadlens_requests_total", {**labels, "code": "499"}) == 1.0
    assert sample("gen_ai_server_time_to_first_token_seconds_count", genai) == 2.0
    assert sample("gen_ai_server_time_to_first_token_seconds_sum", genai) == pytest.approx(0.1)
    assert sample("gen_ai_server_time_per_output_token_seconds_sum", genai) == pytest.approx(0.06)
    assert sample("gen_ai_server_request_duration_seconds_sum", {**genai, "error_type": ""}) == 1.5
    assert sample("gen_ai_server_token_usage_sum", {**genai, "gen_ai_token_type": "output"}) == 4.0
    assert sample("gen_ai_server_token_usage_sum", {**genai, "gen_ai_token_type": "input"}) == 20.0
    # The packaged interactive class: TTFT 0.2 s, ITL 0.05 s, e2e 20 s; both requests met all three.
    assert (cls.ttft_seconds, cls.itl_seconds, cls.e2e_seconds) == (0.2, 0.05, 20.0)
    assert sample("loadlens_goodput_requests_total", labels) == 2.0
    assert [sample("loadlens_sla_breaches_total", {**labels, "slo": s}) for s in ("ttft", "itl", "e2e")] == [0.0] * 3
    exposition = generate_openmetrics(registry)
    # The last success's trace id is its buckets' exemplar in ttft, tpot and duration (the last in each bucket)
    assert exposition.count(f'# {{trace_id="{lives[1].trace_id}"}}'.encode()) == 3


def test_a_summary_tally_exposes_what_observe_does() -> None:
    ours, reference = CollectorRegistry(), CollectorRegistry()
    tallies = Tallies()
    folded = FoldingSummary("s_bytes", "s", ["k"], registry=ours)
    folded.before_collect = tallies.fold
    plain = Summary("s_bytes", "s", ["k"], registry=reference).labels("a")
    tally = SummaryTally(folded.labels("a"))
    tallies.keep(tally)
    for amount in [0, 512, 0.1, 0.2, 1e9, 3]:
        tally.observe(amount)
        plain.observe(amount)
        assert _lines(ours) == _lines(reference)
    assert b's_bytes_count{k="a"} 6.0' in b"\n".join(_lines(ours))
    assert ours.get_sample_value("s_bytes_sum", {"k": "a"}) == reference.get_sample_value("s_bytes_sum", {"k": "a"})


def test_http_metrics_expose_what_plain_inc_and_observe_do() -> None:
    """HttpMetrics.observe through its tallies against the same calls on its series' plain children."""
    ours, reference = CollectorRegistry(), CollectorRegistry()
    metrics, plain = HttpMetrics(ours), HttpMetrics(reference)
    calls = [
        ("POST", 200, "/v1/completions", 0.004, 600, 0),
        ("POST", 200, "/v1/completions", 0.5, 610, 0),
        ("POST", 400, "/v1/completions", 0.001, 12, 90),
        ("GET", 200, "/v1/models", 61.0, 0, 321),
        ("POST", 200, "/v1/chat/completions", 0.1, 800, 0),
    ]
    for method, status, handler, seconds, request_bytes, response_bytes in calls:
        metrics.observe(method, status, handler, seconds, request_bytes, response_bytes)
        plain.requests.labels(method, f"{str(status)[0]}xx", handler).inc()
        plain.request_size.labels(handler).observe(request_bytes)
        plain.response_size.labels(handler).observe(response_bytes)
        plain.duration_highr.observe(seconds)
        plain.duration.labels(method, handler).observe(seconds)
        assert _lines(ours) == _lines(reference)
    assert ours.get_sample_value("http_requests_total", {"method": "POST", "status": "2xx",
                                                         "handler": "/v1/completions"}) == 2.0  # fmt: skip
    assert ours.get_sample_value("http_request_duration_highr_seconds_count") == 5.0
