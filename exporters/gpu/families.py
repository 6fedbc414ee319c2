"""Gauge and counter families that keep their samples as rows until someone reads ``.samples``.

A scrape of 8 GPUs x 64 processes adds ~1000 samples; ``GaugeMetricFamily.add_metric`` builds a label dict
and a ``Sample`` for each, which the fast encoder (:mod:`exporters.gpu.exposition`) never needs: it formats
the rows directly. Anything that reads ``.samples`` - ``generate_latest``, ``get_sample_value``, OpenMetrics -
gets ordinary ``Sample`` objects built on demand, so these are drop-in ``*MetricFamily`` objects::

    g = RowGauge("loadlens_gpu_power_watts", "Power draw.", ["gpu", "uuid", "model"])
    g.add_metric(["0", "GPU-...", "NVIDIA H100"], 412.5)
    g.samples    # [Sample(name='loadlens_gpu_power_watts', labels={...}, value=412.5, ...)]
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.samples import Exemplar, Sample, Timestamp

Row = tuple[Sequence[str], float]


class RowGauge(GaugeMetricFamily):
    def __init__(self, name: str, documentation: str, labels: Sequence[str], unit: str = "") -> None:
        self.rows: list[Row] = []
        self.label_names: tuple[str, ...] = tuple(labels)
        super().__init__(name, documentation, labels=labels, unit=unit)

    @property
    def sample_name(self) -> str:
        return self.name

    def add_metric(self, labels: Sequence[str], value: float, timestamp: Timestamp | float | None = None) -> None:
        if timestamp is not None:
            raise ValueError("RowGauge does not support timestamps")
        self.rows.append((labels, value))

    @property
    def samples(self) -> list[Sample]:
        built = [Sample(self.sample_name, dict(zip(self.label_names, lv, strict=True)), v) for lv, v in self.rows]
        extra: list[Sample] = self.__dict__.get("_extra_samples", [])
        return extra + built

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        # Metric.__init__ assigns an empty list; anything else assigned is kept ahead of the rows.
        self.__dict__["_extra_samples"] = value


class RowCounter(CounterMetricFamily):
    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.rows: list[Row] = []
        self.label_names: tuple[str, ...] = tuple(labels)
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

    @property
    def samples(self) -> list[Sample]:
        built = [Sample(self.sample_name, dict(zip(self.label_names, lv, strict=True)), v) for lv, v in self.rows]
        extra: list[Sample] = self.__dict__.get("_extra_samples", [])
        return extra + built

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self.__dict__["_extra_samples"] = value
