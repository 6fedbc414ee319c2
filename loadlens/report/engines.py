"""Which serving views a report draws: the serving dashboard in the metric dialect of the engine Prometheus
scraped in the window (``vllm:`` series: vLLM or the sim; ``sglang:`` series: sglang), found by asking which
dialect's engine series (those of loadlens/contracts/engine_series.py, the one mapping) the serving job has
samples of there.

- vLLM's series only, or neither (no engine series: an upstream that is not scraped, llama.cpp, TGI): the
  load-test dashboards as they are, ``loadlens-serving`` among them (it also draws loadlens's own serving
  series).
- sglang's only: ``loadlens-serving-sglang`` in its place; its engine panels read sglang's counterparts
  (loadlens/contracts/engine_series.py), its other panels the same loadlens series.
- Both (a model served by a vLLM and an sglang replica): both views; the sglang view's panels whose every
  query the vLLM view has too are left out, so no chart is drawn twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from loadlens.contracts.engine_series import DIALECTS, ENGINE_SERIES, Dialect
from loadlens.contracts.ports import SERVE_JOB, job_selector
from loadlens.dashboards.catalog import LOAD_TEST_DASHBOARDS, SERVING_VIEWS
from loadlens.dashboards.model import Dashboard
from loadlens.util.prometheus import PrometheusClient, QueryError


def dialect_series(dialect: Dialect) -> list[str]:
    """The dialect's exposed names of the mapped engine series (a histogram by its ``_count``)."""
    out = []
    for entry in ENGINE_SERIES:
        name = entry.vllm if dialect == "vllm" else entry.sglang.name if entry.sglang is not None else None
        if name is not None:
            out.append(name + "_count" if entry.kind == "histogram" else name)
    return out


def dialect_query(dialect: Dialect, seconds: int) -> str:
    """Non-empty when the serving job had a sample of one of the dialect's mapped series in the ``seconds``
    up to the query's time. One ``count`` per name joined by ``or``: a range function drops the metric
    name, so one selector over several names would collide on their equal label sets."""
    sel = job_selector(SERVE_JOB)
    return " or ".join(f"count(count_over_time({name}{{{sel}}}[{seconds}s]))" for name in dialect_series(dialect))


def engine_dialects(client: PrometheusClient, start: float, end: float) -> tuple[Dialect, ...]:
    """The dialects with at least one series of the serving job in ``[start, end]``, in DIALECTS order (a
    refused query counts as none found). Unreachable Prometheus propagates."""
    seconds = max(1, math.ceil(end - start))
    found: list[Dialect] = []
    for dialect in DIALECTS:
        try:
            count = client.value_at(dialect_query(dialect, seconds), end)
        except QueryError:
            continue
        if count:
            found.append(dialect)
    return tuple(found)


def report_boards(boards: Mapping[str, Dashboard], dialects: Sequence[Dialect]) -> dict[str, Dashboard]:
    """The load-test dashboards with the serving views of ``dialects`` in the vLLM view's place (the module
    docstring says which); ``boards`` is every dashboard by stem (``loadlens.dashboards.catalog``)."""
    views = [d for d in DIALECTS if d in dialects] or ["vllm"]
    out: dict[str, Dashboard] = {}
    for stem in LOAD_TEST_DASHBOARDS:
        if stem != SERVING_VIEWS["vllm"]:
            out[stem] = boards[stem]
            continue
        for dialect in views:
            out[SERVING_VIEWS[dialect]] = boards[SERVING_VIEWS[dialect]]
    if "vllm" in views and "sglang" in views:
        out[SERVING_VIEWS["sglang"]] = _without_shared(out[SERVING_VIEWS["sglang"]], out[SERVING_VIEWS["vllm"]])
    return out


def _without_shared(board: Dashboard, other: Dashboard) -> Dashboard:
    drawn = {t.expr for p in other.panels() for t in p.targets}
    rows = []
    for row in board.rows:
        panels = tuple(p for p in row.panels if not all(t.expr in drawn for t in p.targets))
        if panels:
            rows.append(replace(row, panels=panels))
    return replace(board, rows=tuple(rows))
