"""The per-token path's cheaper updates (exporters/serving/metrics.py ``adder`` and ``observer``) leave every
series as ``Counter.inc`` and ``Histogram.observe`` would: the same exposition, byte for byte."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from exporters.serving.metrics import ServingMetrics, adder, observer
from loadlens.contracts.slo import load_slos

BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1)
AMOUNTS = [0.0, 0.0004, 0.001, 0.0010001, 0.005, 0.007, 0.01, 0.05, 0.0999, 0.1, 0.1000001, 3.0, 1e9]


def _series(fast: bool) -> list[bytes]:
    """The exposition after the same updates, less the ``_created`` lines (times differ between registries)."""
    registry = CollectorRegistry()
    counter = Counter("c", "h", ["m"], registry=registry).labels("a")
    histogram = Histogram("h", "h", ["m"], buckets=BOUNDS, registry=registry).labels("a")
    add, observe = (adder(counter), observer(histogram)) if fast else (counter.inc, histogram.observe)
    for i, amount in enumerate(AMOUNTS):
        add(i + 1)
        observe(amount)
    return [line for line in generate_latest(registry).split(b"\n") if b"_created" not in line]


def test_adder_and_observer_expose_what_inc_and_observe_do() -> None:
    fast = _series(True)
    assert fast == _series(False)
    assert b'h_bucket{le="0.001",m="a"} 3.0' in fast  # 0.0, 0.0004 and 0.001 (a bound is in its own bucket)
    assert b'h_bucket{le="0.1",m="a"} 10.0' in fast
    assert b'h_bucket{le="+Inf",m="a"} 13.0' in fast
    assert b'c_total{m="a"} 91.0' in fast


def test_the_series_set_of_a_request_updates_its_own_children() -> None:
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, load_slos(), "openai", "test")
    series = metrics.series("text_completion", "m", load_slos().classes[0].name)
    series.add_output_tokens(3)
    series.observe_itl(0.02)
    assert series.output_tokens._value.get() == 3
    assert series.itl._sum.get() == 0.02
    assert sum(b.get() for b in series.itl._buckets) == 1
