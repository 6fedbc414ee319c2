"""Gauge and counter families that keep their samples as rows until someone reads ``.samples``.

A scrape of 8 GPUs x 64 processes adds ~1000 samples; ``GaugeMetricFamily.add_metric`` builds a label dict
and a ``Sample`` for each, which the fast encoder (:mod:`exporters.gpu.exposition`) never needs: it formats
the rows directly. Anything that reads ``.samples`` - ``generate_latest``, ``get_sample_value``, OpenMetrics -
gets ordinary ``Sample`` objects built on demand, so these are drop-in ``*MetricFamily`` objects::

    g = RowGauge("loadlens_gpu_power_watts", "Power draw.", ["gpu", "uuid", "model"])
    g.add_metric(["0", "GPU-...", "NVIDIA H100"], 412.5)
    g.samples    # [Sample(name='loadlens_gpu_power_watts', labels={...}, value=412.5, ...)]

What this relies on in prometheus_client, beyond its documented API (``tests/gpu/test_gpu_families.py``
checks each point against the installed version, and that it lies in :data:`VERIFIED_PROMETHEUS_CLIENT`):

- ``Metric.__init__`` may assign ``self.samples``; a property on the subclass takes that assignment (the
  setter below), so it does not matter whether it does.
- Encoders and the registry read ``metric.samples`` as an attribute and never append to the list they get.
  ``Metric.add_sample`` would (it is internal to prometheus_client); here it raises instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.samples import Exemplar, Sample, Timestamp

Row = tuple[Sequence[str], float]

# [low, high) of prometheus_client (major, minor) versions the points above were verified against (0.20.0 and
# 0.26.0); widen it after running tests/gpu/test_gpu_families.py on a new release.
VERIFIED_PROMETHEUS_CLIENT: tuple[tuple[int, int], tuple[int, int]] = ((0, 23), (0, 27))


class _RowSamples:
    """``rows`` and ``samples`` for the row families; the subclass supplies ``sample_name``."""

    rows: list[Row]
    label_names: tuple[str, ...]

    def _init_rows(self, labels: Sequence[str]) -> None:
        self.rows = []
        self.label_names = tuple(labels)

    @property
    def sample_name(self) -> str:
        raise NotImplementedError

    @property
    def extra_samples(self) -> list[Sample]:
        """``Sample`` objects assigned to ``.samples``; they come ahead of the rows."""
        extra: list[Sample] = self.__dict__.get("_extra_samples", [])
        return extra

    @property
    def samples(self) -> list[Sample]:
        names, name = self.label_names, self.sample_name
        built = [Sample(name, dict(zip(names, lv, strict=True)), v) for lv, v in self.rows]
        return self.extra_samples + built

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        # Metric.__init__ assigns an empty list; anything else assigned is kept ahead of the rows.
        self.__dict__["_extra_samples"] = value

    def add_sample(self, *args: Any, **kwargs: Any) -> None:
        # Metric.add_sample (internal to prometheus_client) appends to self.samples, which here is a fresh
        # list on every read: the sample would vanish without a word.
        raise TypeError(f"{type(self).__name__} takes add_metric rows, not add_sample")


class RowGauge(_RowSamples, GaugeMetricFamily):
    def __init__(self, name: str, documentation: str, labels: Sequence[str], unit: str = "") -> None:
        self._init_rows(labels)
        super().__init__(name, documentation, labels=labels, unit=unit)

    @property
    def sample_name(self) -> str:
        return self.name

    def add_metric(self, labels: Sequence[str], value: float, timestamp: Timestamp | float | None = None) -> None:
        if timestamp is not None:
            raise ValueError("RowGauge does not support timestamps")
        self.rows.append((labels, value))


class RowCounter(_RowSamples, CounterMetricFamily):
    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self._init_rows(labels)
        super().__init__(name, documentation, labels=labels)

    @property
    def sample_name(self) -> str:
        return self.name + "_total"

    def add_metric(
        self,
        labels: Sequence[str],
        value: float,
        created: float | None = None,
        timestamp: Timestamp | float | None = None,
        exemplar: Exemplar | None = None,
    ) -> None:
        if created is not None or timestamp is not None or exemplar is not None:
            raise ValueError("RowCounter does not support created, timestamps or exemplars")
        self.rows.append((labels, value))
