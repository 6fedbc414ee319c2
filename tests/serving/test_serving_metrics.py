"""The per-token path's tallies (exporters/serving/metrics.py ``StreamTally``, ``Tallies``) leave every series as
``Counter.inc`` and ``Histogram.observe`` would: the same exposition, byte for byte, at every scrape, including
one in the middle of a stream."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from exporters.serving.engine import RequestTiming
from exporters.serving.lifecycle import RequestLifecycle
from exporters.serving.metrics import ServingMetrics
from exporters.serving.request_log import RequestLogger
from loadlens.contracts.slo import load_slos

AMOUNTS = [0.0, 0.004, 0.01, 0.0100001, 0.025, 0.03, 0.05, 0.0999, 0.1, 0.1000001, 3.0, 80.0, 1e9]
"""Gaps on, just below and just above bounds of the ITL histogram (a bound is in its own bucket: 0.01, 0.1, 80),
and past the last."""
DYADIC = [0.0, 0.5, 0.25, 0.125, 0.0625, 2.0, 4.0, 0.03125, 1024.0]
"""Gaps whose sums are exact in any order and grouping: the sum is then the same float however it was folded."""
MODEL = "m"
ITL = "loadlens_inter_token_latency_seconds"
TOKENS = "loadlens_output_tokens"


def _metrics() -> tuple[CollectorRegistry, ServingMetrics]:
    registry = CollectorRegistry()
    return registry, ServingMetrics(registry, load_slos(), "openai", "test")


def _life(metrics: ServingMetrics, request_id: str = "r") -> RequestLifecycle:
    life = RequestLifecycle.start(
        metrics=metrics, logger=RequestLogger("logfmt"), tracer=None, parent=None, parent_ids=None,
        request_id=request_id, path="/v1/completions", endpoint="completions", requested_model=MODEL,
        model_label=MODEL, priority=0, priority_class=metrics.slos.classes[0], stream=True, arrival=0.0,
    )  # fmt: skip
    life.admit()
    return life


def _ours(registry: CollectorRegistry) -> list[bytes]:
    """The exposition's lines of the two series the tallies feed, less ``_created`` (times differ)."""
    return [
        line
        for line in generate_latest(registry).split(b"\n")
        if line.startswith((ITL.encode(), TOKENS.encode())) and b"_created" not in line
    ]


def _reference(gaps: list[list[float]], tokens: list[int]) -> list[bytes]:
    """What ``Counter.inc`` and ``Histogram.observe`` expose after ``tokens`` and ``gaps`` (each stream's in
    turn), on a registry of their own with the same series."""
    registry, metrics = _metrics()
    cls = metrics.slos.classes[0].name
    itl, counter = metrics.itl.labels(MODEL, cls), metrics.output_tokens.labels(MODEL, cls)
    for amount in tokens:
        counter.inc(amount)
    for stream in gaps:
        for gap in stream:
            itl.observe(gap)
    return _ours(registry)


def _feed(life: RequestLifecycle, gaps: list[float], start: float = 100.0) -> float:
    """One event of one token at ``start``, then one per gap: ``gaps`` observed, ``len(gaps) + 1`` tokens counted.
    Returns the last event's time."""
    now = start
    life.on_event(now, 1, 10, 1)
    for i, gap in enumerate(gaps):
        now += gap
        life.on_event(now, 1, 10, i + 2)
    return now


def _gaps_as_fed(gaps: list[float], start: float = 100.0) -> list[float]:
    """The gaps ``on_event`` computes from ``_feed``'s times (differences of the sums, as floats)."""
    out, now = [], start
    for gap in gaps:
        later = now + gap
        out.append(later - now)
        now = later
    return out


def test_one_tally_exposes_what_inc_and_observe_do() -> None:
    registry, metrics = _metrics()
    life = _life(metrics)
    tally = life.tally
    assert tally is not None
    for i, amount in enumerate(AMOUNTS):
        tally.tokens += i + 1
        tally.observe_itl(amount)
    life.finish_abort("client_disconnect", None)
    ours = _ours(registry)
    assert ours == _reference([AMOUNTS], [i + 1 for i in range(len(AMOUNTS))])
    cls = metrics.slos.classes[0].name
    assert f'{TOKENS}_total{{model_name="{MODEL}",priority_class="{cls}"}} 91.0'.encode() in ours
    assert f'{ITL}_count{{model_name="{MODEL}",priority_class="{cls}"}} 13.0'.encode() in ours
    assert f'{ITL}_bucket{{le="0.01",model_name="{MODEL}",priority_class="{cls}"}} 3.0'.encode() in ours
    assert f'{ITL}_bucket{{le="0.1",model_name="{MODEL}",priority_class="{cls}"}} 9.0'.encode() in ours
    assert f'{ITL}_bucket{{le="80.0",model_name="{MODEL}",priority_class="{cls}"}} 12.0'.encode() in ours
    assert f'{ITL}_bucket{{le="+Inf",model_name="{MODEL}",priority_class="{cls}"}} 13.0'.encode() in ours


def test_the_events_of_a_request_are_what_its_tally_counts() -> None:
    registry, metrics = _metrics()
    life = _life(metrics)
    _feed(life, AMOUNTS)
    life.on_event(200.0, 0, 10, 14)  # no new token: nothing counted, no gap
    life.finish_abort("client_disconnect", None)
    assert _ours(registry) == _reference([_gaps_as_fed(AMOUNTS)], [1] * (len(AMOUNTS) + 1))


def test_a_scrape_mid_stream_sees_exactly_the_tokens_delivered_so_far() -> None:
    registry, metrics = _metrics()
    a, b = _life(metrics, "a"), _life(metrics, "b")
    cls = metrics.slos.classes[0].name
    labels = {"model_name": MODEL, "priority_class": cls}
    assert _ours(registry) == _reference([], [])
    now_a = _feed(a, DYADIC[:4])
    assert _ours(registry) == _reference([DYADIC[:4]], [5])
    now_b = _feed(b, DYADIC[4:6])
    assert _ours(registry) == _reference([DYADIC[:4], DYADIC[4:6]], [5, 3])
    a.on_event(now_a + DYADIC[6], 2, 10, 7)  # two tokens in one event: one gap
    b.on_event(now_b + DYADIC[7], 1, 10, 4)
    assert _ours(registry) == _reference([DYADIC[:4], DYADIC[4:6], DYADIC[6:8]], [5, 3, 2, 1])
    assert registry.get_sample_value(f"{TOKENS}_total", labels) == 11
    a.finish_abort("client_disconnect", None)
    b.on_event(now_b + DYADIC[7] + DYADIC[8], 1, 10, 5)
    expected = _reference([DYADIC[:4], DYADIC[4:6], DYADIC[6:8], DYADIC[8:]], [5, 3, 2, 1, 1])
    assert _ours(registry) == expected
    assert _ours(registry) == expected  # a second scrape adds nothing
    b.finish_abort("client_disconnect", None)
    assert _ours(registry) == expected  # nor does the end of a stream already scraped
    assert registry.get_sample_value(f"{ITL}_count", labels) == 9
    assert registry.get_sample_value(f"{ITL}_sum", labels) == sum(DYADIC)


def test_a_whole_answer_counts_its_tokens_at_once() -> None:
    registry, metrics = _metrics()
    life = _life(metrics)
    life.on_whole(10, 7)
    labels = {"model_name": MODEL, "priority_class": metrics.slos.classes[0].name}
    assert registry.get_sample_value(f"{TOKENS}_total", labels) == 7
    assert registry.get_sample_value(f"{ITL}_count", labels) == 0
    life.withdraw()
    assert registry.get_sample_value(f"{TOKENS}_total", labels) == 7


def test_a_restricted_scrape_folds_the_tallies_too() -> None:
    registry, metrics = _metrics()
    _feed(_life(metrics), [0.5, 0.25])
    only = registry.restricted_registry([f"{ITL}_count", f"{TOKENS}_total"])
    body = generate_latest(only)
    cls = metrics.slos.classes[0].name
    assert f'{ITL}_count{{model_name="{MODEL}",priority_class="{cls}"}} 2.0'.encode() in body
    assert f'{TOKENS}_total{{model_name="{MODEL}",priority_class="{cls}"}} 3.0'.encode() in body


def test_scrapes_from_another_thread_lose_nothing() -> None:
    """A writer with no lock and a scraper in another thread: every scrape sees counts that only grow, and the
    last, after the writer is done, sees every one of them. Holds however the two threads interleave."""
    registry, metrics = _metrics()
    labels = {"model_name": MODEL, "priority_class": metrics.slos.classes[0].name}
    n = 20_000
    done = threading.Event()
    seen: list[tuple[float, float]] = []

    def scrape() -> None:
        while not done.is_set():
            seen.append(
                (
                    registry.get_sample_value(f"{TOKENS}_total", labels) or 0.0,
                    registry.get_sample_value(f"{ITL}_count", labels) or 0.0,
                )
            )

    scraper = threading.Thread(target=scrape)
    scraper.start()
    life = _life(metrics)
    try:
        _feed(life, [0.25] * (n - 1))
    finally:
        done.set()
        scraper.join()
    tokens_seen, counts_seen = [t for t, _ in seen], [c for _, c in seen]
    assert tokens_seen == sorted(tokens_seen) and counts_seen == sorted(counts_seen)
    assert all(tokens <= n and count <= n - 1 for tokens, count in seen)
    assert registry.get_sample_value(f"{TOKENS}_total", labels) == n
    assert registry.get_sample_value(f"{ITL}_count", labels) == n - 1
    assert registry.get_sample_value(f"{ITL}_sum", labels) == 0.25 * (n - 1)
    life.finish_abort("client_disconnect", None)
    assert registry.get_sample_value(f"{TOKENS}_total", labels) == n


def test_reference_is_prometheus_clients_own() -> None:
    """``_reference`` is plain ``inc``/``observe`` on plain children: the comparison above is against them."""
    _, metrics = _metrics()
    cls = metrics.slos.classes[0].name
    assert type(metrics.itl.labels(MODEL, cls)).observe is Histogram.observe
    assert type(metrics.output_tokens.labels(MODEL, cls)).inc is Counter.inc


def test_the_200_series_appears_with_the_first_success() -> None:
    """``finish_ok`` binds ``loadlens_requests{code="200"}`` once per series set, at its first success: absent
    before it, as when each success called ``labels``."""
    registry, metrics = _metrics()
    metrics.seed_model(MODEL)
    labels = {"model_name": MODEL, "priority_class": metrics.slos.classes[0].name, "code": "200"}
    assert registry.get_sample_value("loadlens_requests_total", labels) is None
    for n in (1, 2):
        life = _life(metrics)
        life.on_event(1.0, 1, 10, 1)
        life.finish_ok("length", RequestTiming())
        assert registry.get_sample_value("loadlens_requests_total", labels) == n
