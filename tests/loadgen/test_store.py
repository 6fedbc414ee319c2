"""Store and Dist: exact counters and sums, HDR quantiles within 0.05 %, exact merges across processes."""

from __future__ import annotations

import random

import pytest

from loadgen.dist import Dist
from loadgen.metrics import bucket_bounds
from loadgen.record import RequestRecord
from loadgen.store import Store
from loadlens.contracts.slo import load_slos

SLOS = load_slos()
BOUNDS = bucket_bounds(SLOS)
INTERACTIVE = SLOS.class_for_priority(0)


def test_dist_exact_moments_buckets_and_tight_quantiles() -> None:
    rng = random.Random(1)
    values = [rng.uniform(0.005, 0.5) for _ in range(20_000)]
    dist = Dist(BOUNDS["ttft"])
    for v in values:
        dist.record(v)
    assert dist.count == len(values)
    assert dist.mean == pytest.approx(sum(values) / len(values), rel=1e-12)
    assert dist.min == min(values) and dist.max == max(values)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = ordered[int(q * len(ordered)) - 1]
        assert dist.quantile(q) == pytest.approx(exact, rel=5e-4, abs=2e-6), q
    # Bucket counts are exact: each sample is placed by bisect on the same bounds Prometheus shows.
    cum = dist.cumulative()
    for bound, count in zip(dist.bounds, cum, strict=False):
        assert count == sum(1 for v in values if v <= bound)
    assert cum[-1] == len(values)


def test_dist_weighted_samples_and_clamping() -> None:
    dist = Dist(BOUNDS["itl"])
    dist.record(0.01, 3)
    dist.record(5000.0)  # beyond an hour: clamped in the HDR, exact elsewhere
    assert dist.count == 4
    assert dist.sum == pytest.approx(0.03 + 5000.0)
    assert dist.clamped == 1
    assert dist.quantile(0.5) == pytest.approx(0.01, rel=5e-4)


def test_merge_equals_recording_everything_in_one_place() -> None:
    rng = random.Random(2)
    a, b, both = Dist(BOUNDS["e2el"]), Dist(BOUNDS["e2el"]), Dist(BOUNDS["e2el"])
    for i in range(5000):
        v = rng.expovariate(1.0)
        (a if i % 3 else b).record(v)
        both.record(v)
    a.merge(Dist.from_wire(BOUNDS["e2el"], b.to_wire()))  # through the worker -> master wire format
    assert a.count == both.count
    assert a.buckets == both.buckets
    assert a.sum == pytest.approx(both.sum)
    for q in (0.5, 0.99, 0.999):
        assert a.quantile(q) == both.quantile(q)


def ok_record(ttft: float, e2e: float, n: int) -> RequestRecord:
    gap = (e2e - ttft) / (n - 1)
    return RequestRecord(ttft=ttft, e2e=e2e, output_tokens=n, prompt_tokens=10, itl=[(gap, n - 1)], chunk_gaps=[gap])


def test_series_goodput_breaches_and_failures() -> None:
    store = Store(BOUNDS)
    key = ("s1", "interactive", "m")
    assert store.record(ok_record(0.05, 0.5, 11), key, INTERACTIVE) == []  # TPOT 45 ms
    assert store.record(ok_record(0.3, 0.7, 11), key, INTERACTIVE) == ["ttft"]  # TTFT SLO 200 ms
    assert store.record(ok_record(0.05, 6.0, 11), key, INTERACTIVE) == ["itl"]  # TPOT 595 ms > 50 ms
    store.record(RequestRecord(outcome="rate_limited", reason="HTTP 429 RateLimitError"), key, INTERACTIVE)
    store.record(RequestRecord(outcome="cancelled"), key, INTERACTIVE)
    s = store.series[key]
    assert (s.completed, s.failed, s.goodput) == (3, 1, 1)
    assert s.slo_breaches == {"ttft": 1, "itl": 1, "e2e": 0}
    assert s.reasons == {"HTTP 429 RateLimitError": 1}
    assert s.output_tokens == 33 and s.input_tokens == 30
    assert s.dists["itl"].count == 30  # per token: 10 gaps per request
    assert store.finished("s1") == 4  # cancelled requests are not finished requests


def test_take_delta_round_trip_and_reset() -> None:
    store = Store(BOUNDS)
    store.record(ok_record(0.05, 1.0, 5), ("a", "interactive", "m"), INTERACTIVE)
    store.window_tokens["a"] += 5
    store.tokens_by_second[100] += 5
    wire = store.take_delta()
    assert store.series == {} and not store.window_tokens
    master = Store(BOUNDS)
    master.merge(Store.from_wire(BOUNDS, wire))
    master.merge(Store.from_wire(BOUNDS, wire))
    s = master.series[("a", "interactive", "m")]
    assert s.completed == 2 and s.dists["ttft"].count == 2
    assert master.window_tokens["a"] == 10 and master.tokens_by_second[100] == 10
