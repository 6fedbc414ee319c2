"""Serving-layer series, emitted in every engine mode: ``gen_ai_*`` (OTel GenAI semconv, Prometheus form)
and ``loadlens_*``. Engines emit their own series (the sim: ``vllm:*``); no name is emitted twice.

Label values are bounded: the model label only ever holds served names (capped, overflow ``other``),
``priority_class`` comes from the SLO file, reasons and outcomes are enums. Per-label-set children are
bound once and cached (:class:`SeriesSet`). The per-token path takes no lock and calls nothing of
prometheus_client: a request's output tokens and inter-token gaps go to its own :class:`StreamTally` (plain
numbers), which :class:`Tallies` folds into the shared children when the request finishes and before every collect
of the two series, so every scrape sees every token delivered before it (``tallies.FoldingCounter``,
``tallies.FoldingHistogram``). What a request adds when it is admitted and when it ends goes to its series set's
tallies the same way (``tallies.CountTally``, ``tallies.HistogramTally``), folded before every collect.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from exporters.serving.errors import REJECT_REASONS
from exporters.serving.tallies import (
    CountTally,
    FoldingCounter,
    FoldingGauge,
    FoldingHistogram,
    HistogramTally,
    SummaryTally,
)
from loadlens.contracts import buckets
from loadlens.contracts.slo import SLOConfig

MAX_MODEL_LABELS = 64
OVERFLOW_MODEL = "other"

ABORT_REASONS = ("client_disconnect", "engine_error", "shutdown")
SLO_NAMES = ("ttft", "itl", "e2e")


class ModelLabeler:
    """Maps a requested model name to a bounded label value: served names only, at most MAX_MODEL_LABELS."""

    def __init__(self, limit: int = MAX_MODEL_LABELS) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, served_name: str) -> str:
        if served_name in self._seen:
            return served_name
        with self._lock:
            if len(self._seen) >= self._limit:
                return OVERFLOW_MODEL
            self._seen.add(served_name)
        return served_name


@dataclass(slots=True)
class SeriesSet:
    """Children bound to one (operation, model, priority class): everything the request path touches. What a
    request adds when it is admitted and when it finishes goes to plain-number tallies of the children
    (:class:`CountTally`, :class:`HistogramTally`), folded in before every collect."""

    ttft: HistogramTally
    tpot: HistogramTally
    itl: Histogram
    duration_ok: HistogramTally
    tokens_in: HistogramTally
    tokens_out: HistogramTally
    output_tokens: Counter
    in_flight: CountTally
    goodput: CountTally
    finished: CountTally
    breach: dict[str, CountTally]
    lora_blocking: Histogram
    lora_delayed: Counter
    ok: CountTally | None = None
    """``loadlens_requests{code="200"}`` of this model and class, once a request of this set succeeded."""


class StreamTally:
    """One request's per-token updates, kept as plain numbers: output tokens for ``loadlens_output_tokens``, and
    the ITL histogram's bucket counts (``counts[i]``: observations whose first bound >= the gap is
    ``bounds[i]``, as ``Histogram.observe`` finds it) and sum. Only the task that runs the request writes them,
    without a lock (:meth:`observe_itl`, ``tokens +=``); :class:`Tallies` reads them and adds what it has not
    added yet to the shared children. The numbers only grow, so a fold in another thread misses nothing: an
    update it does not see goes in at the next fold."""

    __slots__ = ("_folded_counts", "_folded_sum", "_folded_tokens", "bounds", "counts", "itl_sum", "series", "tokens")

    def __init__(self, series: SeriesSet) -> None:
        self.series = series
        self.bounds: tuple[float, ...] = tuple(series.itl._upper_bounds)
        self.tokens: float = 0
        self.itl_sum = 0.0
        self.counts = [0] * len(self.bounds)
        self._folded_tokens: float = 0
        self._folded_sum = 0.0
        self._folded_counts = [0] * len(self.bounds)

    def observe_itl(self, gap: float) -> None:
        """``itl.observe(gap)`` for a finite gap, into this tally. Runs once per streamed read."""
        self.itl_sum += gap
        self.counts[bisect_left(self.bounds, gap)] += 1

    def fold(self) -> None:
        """Add to the children what this tally counted since the last fold. Only under :class:`Tallies`' lock.

        The sum goes in as the difference of this stream's running sums: the same real sum as one ``observe``
        per gap, its float rounding in another order (as the interleaving of streams already changes it)."""
        series = self.series
        tokens = self.tokens
        if tokens != self._folded_tokens:
            series.output_tokens._value.inc(tokens - self._folded_tokens)
            self._folded_tokens = tokens
        total = self.itl_sum
        if total != self._folded_sum:
            series.itl._sum.inc(total - self._folded_sum)
            self._folded_sum = total
        folded = self._folded_counts
        buckets = series.itl._buckets
        for i, count in enumerate(self.counts):
            if count != folded[i]:
                buckets[i].inc(count - folded[i])
                folded[i] = count


# StreamTally reaches into prometheus_client's private attributes (a histogram's ``_upper_bounds``, ``_buckets``
# and ``_sum``, a counter's ``_value``). tests/serving/test_serving_metrics.py pins the exposition tallies leave
# byte for byte against ``Counter.inc`` and ``Histogram.observe``: a prometheus_client release that changes
# those attributes fails there, not silently in production.


class Tallies:
    """The :class:`StreamTally` of every request in flight: opened at admission, folded into the children and
    dropped when the request finishes, and all folded before every collect of the two series they feed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[StreamTally] = set()
        self._kept: list[CountTally | HistogramTally | SummaryTally] = []
        """The series sets' tallies: folded before every collect, for as long as the metrics live."""

    def keep(self, *tallies: CountTally | HistogramTally | SummaryTally) -> None:
        with self._lock:
            self._kept.extend(tallies)

    def open(self, series: SeriesSet) -> StreamTally:
        tally = StreamTally(series)
        with self._lock:
            self._live.add(tally)
        return tally

    def close(self, tally: StreamTally) -> None:
        """Fold ``tally`` in and stop following it: what it counts later is not counted."""
        with self._lock:
            tally.fold()
            self._live.discard(tally)

    def fold(self) -> None:
        """Fold every live tally and every kept one in (before a collect)."""
        with self._lock:
            for tally in self._live:
                tally.fold()
            for kept in self._kept:
                kept.fold()


class ServingMetrics:
    """All serving-layer series on one registry. Create one per app (tests: a fresh registry each)."""

    def __init__(self, registry: CollectorRegistry, slos: SLOConfig, provider: str, version: str) -> None:
        self.slos = slos
        self.provider = provider
        self.model_label = ModelLabeler()
        self._sets: dict[tuple[str, str, str], SeriesSet] = {}
        self._lock = threading.Lock()
        self.tallies = Tallies()
        genai = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "priority_class"]
        ll = ["model_name", "priority_class"]

        self.ttft = FoldingHistogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from request arrival at the serving layer to the first output token sent (successful requests).",
            genai,
            buckets=buckets.with_boundaries(buckets.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, slos.all_thresholds("ttft")),
            registry=registry,
        )
        self.tpot = FoldingHistogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Per request: (duration - time to first token) / (output tokens - 1); requests with >1 output token.",
            genai,
            buckets=buckets.with_boundaries(buckets.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, slos.all_thresholds("itl")),
            registry=registry,
        )
        self.duration = FoldingHistogram(
            "gen_ai_server_request_duration_seconds",
            "Time from request arrival to the last byte of the response; error_type is set on failures.",
            [*genai, "error_type"],
            buckets=buckets.with_boundaries(buckets.GEN_AI_SERVER_REQUEST_DURATION, slos.all_thresholds("e2e")),
            registry=registry,
        )
        self.token_usage = FoldingHistogram(
            "gen_ai_server_token_usage",
            "Tokens per request by gen_ai_token_type (input, output); server-side mirror of gen_ai.client.token.usage.",
            [*genai, "gen_ai_token_type"],
            buckets=buckets.GEN_AI_TOKEN_USAGE,
            registry=registry,
        )
        self.itl = FoldingHistogram(
            "loadlens_inter_token_latency_seconds",
            "Gap between consecutive streamed output events of one request, as sent by the serving layer.",
            ll,
            buckets=buckets.with_boundaries(buckets.VLLM_INTER_TOKEN_LATENCY, slos.all_thresholds("itl")),
            registry=registry,
        )
        self.output_tokens = FoldingCounter(
            "loadlens_output_tokens",
            "Output tokens sent to clients (counted as they stream, so rate() is smooth).",
            ll,
            registry=registry,
        )
        self.requests = FoldingCounter(
            "loadlens_requests",
            "Finished generation requests by HTTP status code (after the response completed or failed).",
            ["model_name", "priority_class", "code"],
            registry=registry,
        )
        self.in_flight = FoldingGauge(
            "loadlens_requests_in_flight",
            "Generation requests admitted and not yet finished.",
            ll,
            registry=registry,
        )
        self.rejections = Counter(
            "loadlens_request_rejections",
            "Requests refused before generation started, by reason.",
            ["model_name", "reason"],
            registry=registry,
        )
        self.aborts = Counter(
            "loadlens_request_aborts",
            "Requests aborted after admission, by reason (client_disconnect frees the engine slot and KV blocks).",
            ["model_name", "reason"],
            registry=registry,
        )
        self.sla_breaches = FoldingCounter(
            "loadlens_sla_breaches",
            "Finished requests that missed one SLO of their priority class (ttft, itl judged on TPOT, e2e).",
            ["model_name", "priority_class", "slo"],
            registry=registry,
        )
        self.goodput = FoldingCounter(
            "loadlens_goodput_requests",
            "Successfully finished requests that met every SLO of their priority class.",
            ll,
            registry=registry,
        )
        self.finished = FoldingCounter(
            "loadlens_slo_eligible_requests",
            "Successfully finished requests judged against the SLOs (the denominator of goodput and breaches).",
            ll,
            registry=registry,
        )
        self.slo_threshold = Gauge(
            "loadlens_slo_threshold_seconds",
            "The configured SLO thresholds (from the SLO file), for dashboards' SLO lines.",
            ["priority_class", "slo"],
            registry=registry,
        )
        self.slo_objective = Gauge(
            "loadlens_slo_objective_ratio",
            "The configured objective (share of requests that must meet the SLOs) per priority class.",
            ["priority_class"],
            registry=registry,
        )
        self.lora_blocking = Histogram(
            "loadlens_lora_swap_blocking_seconds",
            "Per request: time spent blocked behind adapter loads (hot swaps); engines that report it.",
            ll,
            buckets=buckets.with_boundaries(buckets.LORA_SWAP_BLOCKING, [slos.lora_swap.delay_seconds]),
            registry=registry,
        )
        self.lora_delayed = Counter(
            "loadlens_lora_swap_delayed_requests",
            "Requests delayed by hot swaps longer than the lora_swap.delay_seconds SLO (guide 2.4: 200 ms).",
            ll,
            registry=registry,
        )
        self.adapter_ops = Counter(
            "loadlens_lora_adapter_operations",
            "Runtime adapter load/unload calls by outcome.",
            ["operation", "outcome"],
            registry=registry,
        )
        self.adapter_op_duration = Histogram(
            "loadlens_lora_adapter_operation_duration_seconds",
            "Duration of runtime adapter load/unload calls.",
            ["operation"],
            buckets=buckets.LORA_SWAP_BLOCKING,
            registry=registry,
        )
        self.spans_dropped = Counter(
            "loadlens_trace_spans_dropped",
            "Spans that never reached the collector: export queue full (exporting never blocks requests), "
            "or export failed after the exporter's retries.",
            ["reason"],
            registry=registry,
        )
        for reason in ("queue_full", "export_failed"):
            self.spans_dropped.labels(reason)
        for folding in (
            self.ttft, self.tpot, self.duration, self.token_usage, self.itl, self.output_tokens, self.requests,
            self.in_flight, self.sla_breaches, self.goodput, self.finished,
        ):  # fmt: skip
            folding.before_collect = self.tallies.fold
        self.build_info = Gauge(
            "loadlens_build_info",
            "Always 1; labels carry the loadlens version and the engine in use.",
            ["version", "engine"],
            registry=registry,
        )
        self.build_info.labels(version, provider).set(1)
        for cls in slos.classes:
            self.slo_objective.labels(cls.name).set(cls.objective_ratio)
            for slo, threshold in cls.thresholds().items():
                self.slo_threshold.labels(cls.name, slo).set(threshold)
        self.slo_threshold.labels("all", "lora_swap_delay").set(slos.lora_swap.delay_seconds)
        for op in ("load", "unload"):
            for outcome in ("success", "error"):
                self.adapter_ops.labels(op, outcome)

    def series(self, operation: str, model: str, priority_class: str) -> SeriesSet:
        key = (operation, model, priority_class)
        found = self._sets.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._sets.get(key)
            if found is None:
                found = self._bind(operation, model, priority_class)
                self._sets[key] = found
        return found

    def _bind(self, operation: str, model: str, cls: str) -> SeriesSet:
        g = (operation, self.provider, model, cls)
        ll = (model, cls)
        breach = {slo: CountTally(self.sla_breaches.labels(model, cls, slo)) for slo in SLO_NAMES}
        found = SeriesSet(
            ttft=HistogramTally(self.ttft.labels(*g)),
            tpot=HistogramTally(self.tpot.labels(*g)),
            itl=self.itl.labels(*ll),
            duration_ok=HistogramTally(self.duration.labels(*g, "")),
            tokens_in=HistogramTally(self.token_usage.labels(*g, "input")),
            tokens_out=HistogramTally(self.token_usage.labels(*g, "output")),
            output_tokens=self.output_tokens.labels(*ll),
            in_flight=CountTally(self.in_flight.labels(*ll)),
            goodput=CountTally(self.goodput.labels(*ll)),
            finished=CountTally(self.finished.labels(*ll)),
            breach=breach,
            lora_blocking=self.lora_blocking.labels(*ll),
            lora_delayed=self.lora_delayed.labels(*ll),
        )
        self.tallies.keep(
            found.ttft, found.tpot, found.duration_ok, found.tokens_in, found.tokens_out, found.in_flight,
            found.goodput, found.finished, *breach.values(),
        )  # fmt: skip
        return found

    def bind_ok(self, series: SeriesSet, model: str, cls: str) -> CountTally:
        """``loadlens_requests{code="200"}`` of ``series``' model and class, bound (and its series made) at the
        first success, as ``labels`` there would: no 200 series before one."""
        ok = series.ok
        if ok is None:
            ok = series.ok = CountTally(self.requests.labels(model, cls, "200"))
            self.tallies.keep(ok)
        return ok

    def seed_model(self, model: str) -> None:
        """Create every class's series for a served model at zero, so rate() has a baseline from the start."""
        label = self.model_label(model)
        for op in ("chat", "text_completion"):
            for cls in self.slos.class_names:
                self.series(op, label, cls)
        for reason in REJECT_REASONS:
            self.rejections.labels(label, reason)
        for reason in ABORT_REASONS:
            self.aborts.labels(label, reason)
