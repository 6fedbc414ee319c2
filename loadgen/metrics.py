"""The load generator's /metrics: client-side series and load-generator state, rendered fresh per scrape.

A custom collector (no client objects, no state of its own): each scrape reads the run's :class:`Store` and
:class:`LiveState`. In distributed mode only the master serves it, from the store merged from all workers
(updated every Locust report interval, 3 s). Names and labels are documented in docs/loadgen.md.

Usage::

    registry = CollectorRegistry()
    LoadgenCollector(state, registry=registry)
    prometheus_client.generate_latest(registry)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from loadgen.record import OUTCOMES, SLO_NAMES
from loadgen.store import Store
from loadlens.contracts import buckets as B
from loadlens.contracts.ports import PORT
from loadlens.contracts.slo import SLOConfig

DEFAULT_METRICS_PORT = PORT["loadgen"]  # loadlens/contracts/ports.py, the one table of ports
"""The port of the community Locust exporter (ContainerSolutions/locust_exporter), which this replaces."""

HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("ttft", "loadlens_client_time_to_first_token_seconds", "Intended send to first non-empty content chunk."),
    (
        "itl",
        "loadlens_client_inter_token_latency_seconds",
        "Per-token gap from usage.completion_tokens deltas (chunk gaps when the server sends no continuous usage).",
    ),
    (
        "chunk_itl",
        "loadlens_client_inter_chunk_latency_seconds",
        "Gap between consecutive non-empty content chunks, whatever number of tokens they carry.",
    ),
    ("tpot", "loadlens_client_time_per_output_token_seconds", "Per request (E2E - TTFT) / (output tokens - 1)."),
    ("e2el", "loadlens_client_request_duration_seconds", "Intended send to end of stream ([DONE]), successful."),
    (
        "dispatch_lag",
        "loadlens_client_dispatch_lag_seconds",
        "Open-loop stages: actual send minus scheduled send (all outcomes).",
    ),
)


def bucket_bounds(slos: SLOConfig) -> dict[str, tuple[float, ...]]:
    """Bucket bounds per distribution, with every SLO threshold as an exact boundary."""
    ttft = B.with_boundaries(B.LOADGEN_TIME_TO_FIRST_TOKEN, slos.all_thresholds("ttft"))
    itl = B.with_boundaries(B.LOADGEN_INTER_TOKEN_LATENCY, slos.all_thresholds("itl"))
    e2e = B.with_boundaries(B.LOADGEN_REQUEST_DURATION, slos.all_thresholds("e2e"))
    return {
        "ttft": ttft,
        "itl": itl,
        "chunk_itl": itl,
        "tpot": itl,
        "e2el": e2e,
        "dispatch_lag": tuple(B.LOADGEN_DISPATCH_LAG),
    }


@dataclass
class LiveState:
    """What the collector shows besides the store; the runtime updates it, the collector only reads it."""

    profile: str
    version: str
    locust_version: str
    stages: Sequence[str]
    store: Store
    current_stage: str | None = None
    users: int = 0
    target_users: int = 0
    target_rate: float = 0.0
    in_flight: int = 0
    cpu_ratio: float = 0.0
    results_valid: bool = True
    workers: int = 0
    fairness: dict[str, float] = field(default_factory=dict)
    """Jain's index per stage (only when the profile mixes priority classes)."""
    over_saturated: set[str] = field(default_factory=set)
    """Stages the live over-saturation check has found over-saturated (``loadgen/saturation.py``)."""


class LoadgenCollector(Collector):
    def __init__(self, state: LiveState, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.state = state
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on nothing, but an empty describe keeps registration cheap

    def collect(self) -> Iterable[Metric]:
        s = self.state
        labels = ["stage", "priority_class", "model_name"]
        series = sorted(s.store.series.items())
        for metric, name, doc in HISTOGRAMS:
            fam = HistogramMetricFamily(name, doc, labels=labels, unit="")
            for key, ser in series:
                dist = ser.dists[metric]
                if metric == "dispatch_lag" and not dist.count:
                    continue  # closed-loop stages have no schedule to lag behind
                cum = dist.cumulative()
                pairs = [(repr(float(b)), float(c)) for b, c in zip(dist.bounds, cum, strict=False)]
                pairs.append(("+Inf", float(cum[-1])))
                fam.add_metric(list(key), pairs, dist.sum)
            yield fam

        requests = CounterMetricFamily(
            "loadlens_client_requests",
            "Finished requests by outcome (stage = stage at intended send).",
            labels=[*labels, "outcome"],
        )
        prompt = CounterMetricFamily(
            "loadlens_client_prompt_tokens", "Prompt tokens of successful requests (server usage).", labels=labels
        )
        output = CounterMetricFamily(
            "loadlens_client_output_tokens",
            "Output tokens of successful requests, counted when the request completes.",
            labels=labels,
        )
        goodput = CounterMetricFamily(
            "loadlens_client_goodput_requests",
            "Successful requests that met every SLO of their priority class (TTFT, TPOT vs itl, E2E).",
            labels=labels,
        )
        breaches = CounterMetricFamily(
            "loadlens_client_sla_breaches", "Successful requests that missed one SLO.", labels=[*labels, "slo"]
        )
        for key, ser in series:
            lv = list(key)
            for outcome in OUTCOMES:
                requests.add_metric([*lv, outcome], float(ser.outcomes.get(outcome, 0)))
            prompt.add_metric(lv, float(ser.input_tokens))
            output.add_metric(lv, float(ser.output_tokens))
            goodput.add_metric(lv, float(ser.goodput))
            for slo in SLO_NAMES:
                breaches.add_metric([*lv, slo], float(ser.slo_breaches.get(slo, 0)))
        yield requests
        yield prompt
        yield output
        yield goodput
        yield breaches

        lag = HistogramMetricFamily(
            "loadlens_loadgen_event_loop_lag_seconds",
            "How late the load generator's event loop wakes from 5 ms sleeps (its own timestamp delay).",
            labels=["stage"],
        )
        for stage_name, dist in sorted(s.store.loop_lag.items()):
            cum = dist.cumulative()
            pairs = [(repr(float(b)), float(c)) for b, c in zip(dist.bounds, cum, strict=False)]
            pairs.append(("+Inf", float(cum[-1])))
            lag.add_metric([stage_name], pairs, dist.sum)
        yield lag

        streamed = CounterMetricFamily(
            "loadlens_client_streamed_tokens",
            "Output tokens as they arrive; stage = the stage current at arrival (rate() = live output tok/s).",
            labels=["stage"],
        )
        for stage in s.stages:
            streamed.add_metric([stage], float(s.store.window_tokens.get(stage, 0)))
        yield streamed

        if s.fairness:
            fair = GaugeMetricFamily(
                "loadlens_client_jain_fairness_index",
                "Jain's index over per-class output tokens per second of request time (1 = every class served alike).",
                labels=["stage"],
            )
            for stage, value in s.fairness.items():
                fair.add_metric([stage], value)
            yield fair

        current = GaugeMetricFamily(
            "loadlens_loadgen_stage", "1 for the current stage, 0 for the others.", labels=["stage"]
        )
        for name in s.stages:
            current.add_metric([name], 1.0 if name == s.current_stage else 0.0)
        yield current
        saturated = GaugeMetricFamily(
            "loadlens_loadgen_over_saturated",
            "1 once the stage's queue and TTFT were found growing without bound (Mann-Kendall), else 0.",
            labels=["stage"],
        )
        for name in s.stages:
            saturated.add_metric([name], 1.0 if name in s.over_saturated else 0.0)
        yield saturated
        yield GaugeMetricFamily("loadlens_loadgen_users", "Locust users running now.", value=float(s.users))
        yield GaugeMetricFamily(
            "loadlens_loadgen_target_users",
            "Users (or open-loop sender pool) the current stage asks for.",
            value=float(s.target_users),
        )
        yield GaugeMetricFamily(
            "loadlens_loadgen_target_rate_requests_per_second",
            "Open-loop arrival rate of the current stage; 0 in closed-loop stages.",
            value=s.target_rate,
        )
        yield GaugeMetricFamily(
            "loadlens_loadgen_in_flight_requests", "Requests sent and not yet finished.", value=float(s.in_flight)
        )
        yield GaugeMetricFamily(
            "loadlens_loadgen_cpu_ratio",
            "CPU of the busiest load-generator process (5 s average; 1 = one core). Above 0.9 results are invalid.",
            value=s.cpu_ratio,
        )
        yield GaugeMetricFamily(
            "loadlens_loadgen_results_valid",
            "1 while the results are trustworthy; 0 once the load generator's CPU exceeded the threshold.",
            value=1.0 if s.results_valid else 0.0,
        )
        yield GaugeMetricFamily(
            "loadlens_loadgen_workers", "Connected Locust workers (0 when not distributed).", value=float(s.workers)
        )
        info = GaugeMetricFamily(
            "loadlens_loadgen_info",
            "Always 1; the profile and versions.",
            labels=["profile", "version", "locust_version"],
        )
        info.add_metric([s.profile, s.version, s.locust_version], 1.0)
        yield info
