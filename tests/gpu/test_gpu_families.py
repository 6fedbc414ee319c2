"""What the row families rely on in prometheus_client, checked against the installed version: its consumers
read ``.samples`` as an attribute and get exactly the samples a plain family would give (text, OpenMetrics,
``get_sample_value``, restricted registries, equality); assignment keeps samples; ``add_sample`` is refused."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.samples import Sample

from exporters.gpu.exposition import text_exposition
from exporters.gpu.families import VERIFIED_PROMETHEUS_CLIENT, RowCounter, RowGauge


def row_families() -> list[Metric]:
    g = RowGauge("x_bytes", "X.", ["gpu"])
    g.add_metric(["0"], 1.0)
    g.add_metric(["1"], 3.0)
    c = RowCounter("y", "Y.", ["gpu"])
    c.add_metric(["0"], 2.0)
    return [g, c]


def plain_families() -> list[Metric]:
    g = GaugeMetricFamily("x_bytes", "X.", labels=["gpu"])
    g.add_metric(["0"], 1.0)
    g.add_metric(["1"], 3.0)
    c = CounterMetricFamily("y", "Y.", labels=["gpu"])
    c.add_metric(["0"], 2.0)
    return [g, c]


class Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families

    def describe(self) -> list[Metric]:  # names for restricted_registry
        return self._families


def registry_of(families: list[Metric]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(Fixed(families))
    return registry


def test_installed_prometheus_client_is_in_the_verified_range() -> None:
    # Fails on an upgrade past the range: rerun this file against it, then widen VERIFIED_PROMETHEUS_CLIENT.
    major, minor = (int(p) for p in version("prometheus_client").split(".")[:2])
    low, high = VERIFIED_PROMETHEUS_CLIENT
    assert low <= (major, minor) < high


def test_samples_read_as_an_attribute() -> None:
    g, c = row_families()
    assert g.samples == [Sample("x_bytes", {"gpu": "0"}, 1.0), Sample("x_bytes", {"gpu": "1"}, 3.0)]
    assert c.samples == [Sample("y_total", {"gpu": "0"}, 2.0)]
    assert RowGauge("z", "Z.", ["gpu"]).samples == []


def test_equal_to_plain_families() -> None:
    assert row_families() == plain_families()


def test_text_format_same_as_plain_families() -> None:
    ours = generate_latest(registry_of(row_families()))
    assert ours == generate_latest(registry_of(plain_families()))
    assert ours == (
        b'# HELP x_bytes X.\n# TYPE x_bytes gauge\nx_bytes{gpu="0"} 1.0\nx_bytes{gpu="1"} 3.0\n'
        b'# HELP y_total Y.\n# TYPE y_total counter\ny_total{gpu="0"} 2.0\n'
    )


def test_openmetrics_same_as_plain_families() -> None:
    ours = openmetrics_latest(registry_of(row_families()))  # type: ignore[no-untyped-call]
    assert ours == openmetrics_latest(registry_of(plain_families()))  # type: ignore[no-untyped-call]
    assert ours == (
        b'# HELP x_bytes X.\n# TYPE x_bytes gauge\nx_bytes{gpu="0"} 1.0\nx_bytes{gpu="1"} 3.0\n'
        b'# HELP y Y.\n# TYPE y counter\ny_total{gpu="0"} 2.0\n# EOF\n'
    )


def test_get_sample_value_and_restricted_registry() -> None:
    registry = registry_of(row_families())
    assert registry.get_sample_value("x_bytes", {"gpu": "1"}) == 3.0
    assert registry.get_sample_value("y_total", {"gpu": "0"}) == 2.0
    assert registry.get_sample_value("x_bytes", {"gpu": "2"}) is None
    restricted = list(registry.restricted_registry(["y_total"]).collect())
    assert [(m.name, m.samples) for m in restricted] == [("y", [Sample("y_total", {"gpu": "0"}, 2.0)])]


def test_assigned_samples_kept_ahead_of_rows() -> None:
    g, _ = row_families()
    first = Sample("x_bytes", {"gpu": "9"}, 9.0)
    g.samples = [first]
    assert g.samples == [first, Sample("x_bytes", {"gpu": "0"}, 1.0), Sample("x_bytes", {"gpu": "1"}, 3.0)]
    # The fast encoder then takes the generic path, so the assigned sample is encoded too.
    assert text_exposition([g]) == (
        b'# HELP x_bytes X.\n# TYPE x_bytes gauge\nx_bytes{gpu="9"} 9.0\nx_bytes{gpu="0"} 1.0\nx_bytes{gpu="1"} 3.0\n'
    )


@pytest.mark.parametrize("family", [RowGauge("x", "X.", ["gpu"]), RowCounter("y", "Y.", ["gpu"])])
def test_add_sample_refused(family: RowGauge | RowCounter) -> None:
    with pytest.raises(TypeError) as info:
        family.add_sample("x", {"gpu": "0"}, 1.0)
    assert str(info.value) == f"{type(family).__name__} takes add_metric rows, not add_sample"
    assert family.samples == []
