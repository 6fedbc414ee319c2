"""Hot-swap figures (guide 2.4) from a server's own ``/metrics``: the serving layer's per-request blocking
histogram and its counters, the sim's adapter-load histogram, vLLM's proposed load-time histogram and the
proxy's probe-fed swap windows, read by the experiment's ``/metrics`` sampler.

Every figure is an *increase* over the measured window: for each measured stage, the last sample inside it
minus the first (a label set missing from the first sample counts 0 there: prometheus_client creates a child at
its first use), summed over the stages. What that makes exact and what is interpolated:

- counts and sums are exact for the requests that ended between those two samples (a request is observed when
  it ends; one ending before the first or after the last sample of a stage is not in it);
- the mean blocking per blocked request is exact: ``_sum`` / ``_count``;
- the requests delayed longer than ``delay_seconds`` are ``_count`` minus the cumulative bucket at that edge,
  exact when the histogram has the edge (the serving layer adds the SLO's threshold to its buckets, and
  ``loadlens.contracts.buckets.LORA_SWAP_BLOCKING`` holds 0.2 s); otherwise the bucket is interpolated and
  ``delay_exact`` is false;
- the P99 is interpolated as Prometheus' ``histogram_quantile`` does: linearly between the edges of the
  bucket holding rank 0.99 × count (from 0 for the first bucket); in the ``+Inf`` bucket it is the highest
  finite edge.

Usage::

    keep = parse_swap_series(text)                      # one sample's values
    figures = swap_figures(samples, windows, 0.2)       # samples: [(unix_ts, keep), ...]
"""

from __future__ import annotations

import math
from collections import defaultdict

from loadlens.contracts.experiment_result import LoraSwapFigures, LoraSwapSample
from loadlens.contracts.exposition_labels import parse_labels

Labels = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, Labels]

BLOCKING = "loadlens_lora_swap_blocking_seconds"
DELAYED = "loadlens_lora_swap_delayed_requests_total"
ELIGIBLE = "loadlens_slo_eligible_requests_total"
ADAPTER_OPS = "loadlens_lora_adapter_operations_total"
SIM_LOAD = "loadlens_sim_adapter_load_seconds"
VLLM_LOAD = "vllm:lora_adapter_load_seconds"
PROBE_WINDOWS = "loadlens_proxy_probe_swap_windows_total"

KEPT = frozenset({
    f"{BLOCKING}_bucket", f"{BLOCKING}_sum", f"{BLOCKING}_count", DELAYED, ELIGIBLE, ADAPTER_OPS,
    f"{SIM_LOAD}_sum", f"{SIM_LOAD}_count", f"{VLLM_LOAD}_sum", f"{VLLM_LOAD}_count", PROBE_WINDOWS,
})  # fmt: skip
"""The exposed sample names read (histograms by their ``_bucket``/``_sum``/``_count`` samples)."""


def _labels(text: str) -> Labels:
    """``a="x",b="y"`` (the inside of the braces) as sorted pairs, escapes undone."""
    return tuple(sorted(parse_labels(text)))


def parse_swap_series(text: str) -> dict[SeriesKey, float]:
    """The :data:`KEPT` samples of a Prometheus or OpenMetrics exposition, by name and label set."""
    out: dict[SeriesKey, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        labels: Labels = ()
        brace = line.find("{")
        space = line.find(" ")
        if brace < 0 or 0 <= space < brace:
            if space < 0:
                continue
            name, rest = line[:space], line[space:]
        else:
            name = line[:brace]
            if name not in KEPT:
                continue
            close = brace + 1
            quoted = False
            while close < len(line):
                c = line[close]
                if quoted and c == "\\":
                    close += 1
                elif c == '"':
                    quoted = not quoted
                elif c == "}" and not quoted:
                    break
                close += 1
            labels, rest = _labels(line[brace + 1 : close]), line[close + 1 :]
        if name not in KEPT:
            continue
        fields = rest.split()
        try:
            out[(name, labels)] = float(fields[0])
        except (IndexError, ValueError):
            continue
    return out


def increases(
    samples: list[tuple[float, dict[SeriesKey, float]]], windows: list[tuple[float, float]]
) -> tuple[dict[SeriesKey, float], set[str]]:
    """Each series' increase over ``windows`` (last minus first sample inside each, summed), and the names
    seen in any sample inside them (an exported family with no increase is 0; one never seen is absent)."""
    total: dict[SeriesKey, float] = defaultdict(float)
    seen: set[str] = set()
    for lo, hi in windows:
        inside = [s for ts, s in samples if lo <= ts <= hi]
        for s in inside:
            seen.update(name for name, _ in s)
        if len(inside) < 2:
            continue
        first, last = inside[0], inside[-1]
        for key, value in last.items():
            total[key] += value - first.get(key, 0.0)
    return dict(total), seen


def _le(labels: Labels) -> float:
    return math.inf if dict(labels)["le"] in ("+Inf", "inf", "Inf") else float(dict(labels)["le"])


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """``histogram_quantile(q, ...)`` over cumulative ``(le, count)`` pairs (sorted by ``le``)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = (le if not math.isinf(le) else lower), count
    return lower


def count_above(threshold: float, buckets: list[tuple[float, float]]) -> tuple[float | None, bool]:
    """Observations above ``threshold`` and whether that is exact (an edge at it) or interpolated."""
    if not buckets:
        return None, True
    total = buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if le == threshold:
            return total - count, True
        if le > threshold:
            if math.isinf(le):
                return total - below, False
            at = below + (count - below) * (threshold - lower) / (le - lower)
            return total - at, False
        lower, below = le, count
    return 0.0, True


def _has(labels: Labels, want: dict[str, str]) -> bool:
    d = dict(labels)
    return all(d.get(k) == v for k, v in want.items())


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _figures(inc: dict[SeriesKey, float], keep: dict[str, str], delay: float, exported: bool) -> LoraSwapFigures:
    """The figures of the label sets whose labels include every pair of ``keep`` (summed over the others)."""
    if not exported:
        return LoraSwapFigures()

    def match(labels: Labels) -> bool:
        return _has(labels, keep)

    def total(name: str) -> float:
        return sum(v for (n, labels), v in inc.items() if n == name and match(labels))

    cumulative: dict[float, float] = defaultdict(float)
    for (n, labels), v in inc.items():
        if n == f"{BLOCKING}_bucket" and match(labels):
            cumulative[_le(labels)] += v
    buckets = sorted(cumulative.items())
    blocked, blocked_s, requests = total(f"{BLOCKING}_count"), total(f"{BLOCKING}_sum"), total(ELIGIBLE)
    delayed, _ = count_above(delay, buckets) if buckets else (0.0, True)
    p99 = quantile(0.99, buckets)
    return LoraSwapFigures(
        requests=requests,
        blocked_requests=blocked,
        blocked_ratio=_ratio(blocked, requests),
        mean_blocked_ms=1000.0 * blocked_s / blocked if blocked > 0 else None,
        p99_blocked_ms=1000.0 * p99 if p99 is not None else None,
        delayed_requests=delayed,
        delayed_ratio=_ratio(delayed, requests),
        delayed_counter=total(DELAYED),
    )


def swap_figures(
    samples: list[tuple[float, dict[SeriesKey, float]]], windows: list[tuple[float, float]], delay_seconds: float
) -> LoraSwapSample | None:
    """The hot-swap figures over ``windows``; ``None`` when no sample inside them holds any of the series. A
    server without the serving layer's (a vLLM read directly) gives only its own load figures, the request
    figures ``None``."""
    inc, seen = increases(samples, windows)
    if not seen:
        return None
    exported = ELIGIBLE in seen
    edges = {_le(labels) for (n, labels) in inc if n == f"{BLOCKING}_bucket"}
    overall = _figures(inc, {}, delay_seconds, exported)
    models = sorted({dict(labels).get("model_name", "") for (n, labels) in inc if n == ELIGIBLE})
    out = LoraSwapSample(
        **overall.model_dump(),
        delay_seconds=delay_seconds if exported else None,
        delay_exact=(delay_seconds in edges if edges else None) if exported else None,
        models={m: _figures(inc, {"model_name": m}, delay_seconds, True) for m in models if m},
    )

    def summed(name: str, **want: str) -> float | None:
        if name not in seen:
            return None
        return sum(v for (n, labels), v in inc.items() if n == name and _has(labels, want))

    out.adapter_load_calls = summed(ADAPTER_OPS, operation="load", outcome="success")
    out.sim_adapter_loads = summed(f"{SIM_LOAD}_count")
    sim_s = summed(f"{SIM_LOAD}_sum")
    if out.sim_adapter_loads and sim_s is not None:
        out.sim_adapter_load_mean_ms = 1000.0 * sim_s / out.sim_adapter_loads
    if f"{VLLM_LOAD}_count" in seen:
        transitions = sorted({dict(labels).get("transition", "") for (n, labels) in inc if n == f"{VLLM_LOAD}_count"})
        for t in transitions:
            count = summed(f"{VLLM_LOAD}_count", transition=t) or 0.0
            seconds = summed(f"{VLLM_LOAD}_sum", transition=t) or 0.0
            out.vllm_adapter_loads[t] = count
            out.vllm_adapter_load_mean_ms[t] = 1000.0 * seconds / count if count else None
    out.probe_swap_windows = summed(PROBE_WINDOWS)
    out.probe_on_demand_windows = summed(PROBE_WINDOWS, on_demand="true")
    for source, value in (
        ("sim_adapter_loads", out.sim_adapter_loads),
        ("probe_swap_windows", out.probe_swap_windows),
        ("vllm_adapter_loads", sum(out.vllm_adapter_loads.values()) if out.vllm_adapter_loads else None),
        ("adapter_load_calls", out.adapter_load_calls),
    ):
        if value is not None:
            out.swaps, out.swaps_source = value, source
            break
    return out


FIGURES = ("requests", "blocked_requests", "blocked_ratio", "mean_blocked_ms", "p99_blocked_ms", "delayed_requests",
           "delayed_ratio", "delayed_counter")  # fmt: skip
"""The per-model and overall keys a trial aggregates as ``swap.KEY`` and ``swap.models.MODEL.KEY``."""


def swap_values(sample: LoraSwapSample | None) -> dict[str, float | None]:
    """A run's hot-swap figures as flat experiment figures (``swap.*``); none without the series."""
    if sample is None:
        return {}
    out: dict[str, float | None] = {f"swap.{k}": getattr(sample, k) for k in FIGURES}
    out["swap.swaps"] = sample.swaps
    out["swap.driver_loads"] = float(sample.driver_loads) if sample.driver_loads is not None else None
    out["swap.sim_adapter_load_mean_ms"] = sample.sim_adapter_load_mean_ms
    out["swap.probe_swap_windows"] = sample.probe_swap_windows
    for transition, mean in sample.vllm_adapter_load_mean_ms.items():
        out[f"swap.vllm_adapter_load_mean_ms.{transition}"] = mean
    for model, figs in sample.models.items():
        out.update({f"swap.models.{model}.{k}": getattr(figs, k) for k in FIGURES})
    return out
