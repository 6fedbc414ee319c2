from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from exporters.gpu.exposition import float_text, text_exposition
from exporters.gpu.families import RowCounter, RowGauge


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0.0"),
        (1, "1.0"),
        (0.62, "0.62"),
        (77309411328.0, "77309411328.0"),
        (1e21, "1e+21"),
        (-3.5, "-3.5"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_float_text(value: float, text: str) -> None:
    assert float_text(value) == text
    if not math.isnan(value):
        assert float(text.replace("Inf", "inf")) == value  # what Prometheus parses back


def test_rows_and_plain_families_encode_alike() -> None:
    rows = RowGauge("a_bytes", "Rows.", ["gpu", "name"])
    plain = GaugeMetricFamily("a_bytes", "Rows.", labels=["gpu", "name"])
    for fam in (rows, plain):
        fam.add_metric(["0", 'say "hi"\\n'], 1.5)
        fam.add_metric(["1", "x\ny"], 2.0)
    assert text_exposition([rows]) == text_exposition([plain])
    text = text_exposition([rows]).decode()
    assert 'a_bytes{gpu="0",name="say \\"hi\\"\\\\n"} 1.5\n' in text
    assert 'a_bytes{gpu="1",name="x\\ny"} 2.0\n' in text


def test_unlabelled_and_counter_rows() -> None:
    g = RowGauge("up", "Up.", [])
    g.add_metric([], 1.0)
    c = RowCounter("events_total", "Events.", ["gpu"])
    c.add_metric(["0"], 3.0)
    assert text_exposition([g, c]).decode() == (
        "# HELP up Up.\n# TYPE up gauge\nup 1.0\n"
        '# HELP events_total Events.\n# TYPE events_total counter\nevents_total{gpu="0"} 3.0\n'
    )


def test_row_families_behave_like_prometheus_client_families() -> None:
    g = RowGauge("x", "X.", ["gpu"])
    g.add_metric(["0"], 1.0)
    c = RowCounter("y", "Y.", ["gpu"])
    c.add_metric(["0"], 2.0)

    class C:
        def collect(self) -> list[Metric]:
            return [g, c]

    registry = CollectorRegistry()
    registry.register(C())
    assert registry.get_sample_value("x", {"gpu": "0"}) == 1.0
    assert registry.get_sample_value("y_total", {"gpu": "0"}) == 2.0
    ours = {(f.name, s.name, tuple(s.labels.items()), s.value) for f in text_string_to_metric_families(
        text_exposition([g, c]).decode()) for s in f.samples}  # fmt: skip
    reference = {(f.name, s.name, tuple(s.labels.items()), s.value) for f in text_string_to_metric_families(
        generate_latest(registry).decode()) for s in f.samples}  # fmt: skip
    assert ours == reference


def test_row_families_reject_what_they_cannot_encode() -> None:
    with pytest.raises(ValueError):
        RowGauge("x", "X.", []).add_metric([], 1.0, timestamp=5.0)
    with pytest.raises(ValueError):
        RowCounter("y", "Y.", []).add_metric([], 1.0, created=5.0)
    assert RowGauge("x", "X.", ["a"]).samples == []


def test_info_family_uses_the_generic_path() -> None:
    info = InfoMetricFamily("loadlens_gpu", "Identity.", labels=["gpu"])
    info.add_metric(["0"], {"uuid": "GPU-1"})
    assert text_exposition([info]).decode() == (
        "# HELP loadlens_gpu_info Identity.\n# TYPE loadlens_gpu_info gauge\n"
        'loadlens_gpu_info{gpu="0",uuid="GPU-1"} 1.0\n'
    )


def test_timestamps_are_refused_on_plain_families() -> None:
    g = GaugeMetricFamily("x", "X.", labels=[])
    g.add_metric([], 1.0, timestamp=3.0)
    with pytest.raises(ValueError, match="timestamps and exemplars"):
        text_exposition([g])
