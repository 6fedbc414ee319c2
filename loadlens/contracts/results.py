"""``benchmark_result.json`` as typed models: the load generator builds what it writes as them (in their
fields' order, which is the file's key order), the report (and any later reader) parses with them.
docs/loadgen.md says what every key means.

Every figure is optional here: a reader gets ``None`` for a figure a document lacks (an older or partial
file) instead of a fake 0, and the writer always sets them all. Unknown keys are refused, so a writer that
adds a key without adding it here (and to the docs) fails its tests. ``schema_version`` changes when a key's
meaning changes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA = "loadlens.benchmark_result"
SCHEMA_VERSION = 1
RESULT_FILE = "benchmark_result.json"

Ms = float | None  # milliseconds; None where there were no samples
Count = int | None
Rate = float | None  # per second over the slice's duration


class ResultsError(ValueError):
    """The document is not a loadlens benchmark result of this schema (the message names the key)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Figures(_Model):
    """The figures of one slice (a stage, a class, a model, the whole run); vLLM's bench keys where they mean
    the same."""

    completed: Count = None
    failed: Count = None
    cancelled: Count = None
    outcomes: dict[str, int] = Field(default_factory=dict)
    failure_reasons: dict[str, int] = Field(default_factory=dict)
    duration: float | None = None
    total_input_tokens: Count = None
    total_output_tokens: Count = None
    request_throughput: Rate = None
    request_goodput: Rate = None
    goodput_requests: Count = None
    goodput_ratio: float | None = None
    output_throughput: Rate = None
    total_token_throughput: Rate = None
    max_output_tokens_per_s: Count = None
    sla_breaches: dict[str, int] = Field(default_factory=dict)
    itl_fallback_requests: Count = None
    mean_ttft_ms: Ms = None
    median_ttft_ms: Ms = None
    std_ttft_ms: Ms = None
    p50_ttft_ms: Ms = None
    p90_ttft_ms: Ms = None
    p95_ttft_ms: Ms = None
    p99_ttft_ms: Ms = None
    p99_9_ttft_ms: Ms = Field(None, alias="p99.9_ttft_ms")
    min_ttft_ms: Ms = None
    max_ttft_ms: Ms = None
    ttft_samples: Count = None
    mean_tpot_ms: Ms = None
    median_tpot_ms: Ms = None
    std_tpot_ms: Ms = None
    p50_tpot_ms: Ms = None
    p90_tpot_ms: Ms = None
    p95_tpot_ms: Ms = None
    p99_tpot_ms: Ms = None
    p99_9_tpot_ms: Ms = Field(None, alias="p99.9_tpot_ms")
    min_tpot_ms: Ms = None
    max_tpot_ms: Ms = None
    tpot_samples: Count = None
    mean_itl_ms: Ms = None
    median_itl_ms: Ms = None
    std_itl_ms: Ms = None
    p50_itl_ms: Ms = None
    p90_itl_ms: Ms = None
    p95_itl_ms: Ms = None
    p99_itl_ms: Ms = None
    p99_9_itl_ms: Ms = Field(None, alias="p99.9_itl_ms")
    min_itl_ms: Ms = None
    max_itl_ms: Ms = None
    itl_samples: Count = None
    mean_e2el_ms: Ms = None
    median_e2el_ms: Ms = None
    std_e2el_ms: Ms = None
    p50_e2el_ms: Ms = None
    p90_e2el_ms: Ms = None
    p95_e2el_ms: Ms = None
    p99_e2el_ms: Ms = None
    p99_9_e2el_ms: Ms = Field(None, alias="p99.9_e2el_ms")
    min_e2el_ms: Ms = None
    max_e2el_ms: Ms = None
    e2el_samples: Count = None
    mean_chunk_itl_ms: Ms = None
    median_chunk_itl_ms: Ms = None
    std_chunk_itl_ms: Ms = None
    p50_chunk_itl_ms: Ms = None
    p90_chunk_itl_ms: Ms = None
    p95_chunk_itl_ms: Ms = None
    p99_chunk_itl_ms: Ms = None
    p99_9_chunk_itl_ms: Ms = Field(None, alias="p99.9_chunk_itl_ms")
    min_chunk_itl_ms: Ms = None
    max_chunk_itl_ms: Ms = None
    chunk_itl_samples: Count = None
    mean_dispatch_lag_ms: Ms = None
    median_dispatch_lag_ms: Ms = None
    std_dispatch_lag_ms: Ms = None
    p50_dispatch_lag_ms: Ms = None
    p90_dispatch_lag_ms: Ms = None
    p95_dispatch_lag_ms: Ms = None
    p99_dispatch_lag_ms: Ms = None
    p99_9_dispatch_lag_ms: Ms = Field(None, alias="p99.9_dispatch_lag_ms")
    min_dispatch_lag_ms: Ms = None
    max_dispatch_lag_ms: Ms = None
    dispatch_lag_samples: Count = None


class ServerFigures(_Model):
    """Server-side figures of a stage from Prometheus (``--prometheus``); ``errors`` says why one is None."""

    window_seconds: Count = None
    queries: dict[str, str] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    peak_vram_gib: float | None = None
    mean_gpu_utilization_ratio: float | None = None
    gpu_utilization_peak_to_trough_ratio: float | None = None
    server_mean_ttft_ms: Ms = None
    server_p99_ttft_ms: Ms = None
    server_output_throughput: Rate = None
    server_peak_waiting_requests: float | None = None
    # The hot-swap SLA's counts over the stage (increase(), so extrapolated, not integers); None without the series.
    lora_swap_blocked_requests: float | None = None
    lora_swap_delayed_requests: float | None = None
    slo_eligible_requests: float | None = None
    # The server's prefix cache over the stage, in tokens (vLLM's vllm:prefix_cache_{hits,queries}_total;
    # increase(), so extrapolated): hits / queries is the ratio beside the workload's expected one.
    prefix_cache_hit_ratio: float | None = None
    prefix_cache_hit_tokens: float | None = None
    prefix_cache_query_tokens: float | None = None


class TurnFigures(_Model):
    """Successful requests of one turn number of the stage's conversations (``1`` … ``31``, ``32+``)."""

    completed: Count = None
    mean_prompt_tokens: float | None = None  # the context the turn carried (usage.prompt_tokens)
    mean_ttft_ms: Ms = None
    p50_ttft_ms: Ms = None
    p99_ttft_ms: Ms = None


class WorkloadFigures(_Model):
    """What the traffic shared and continued (docs/loadgen.md, *Conversations*, *Shared prefixes*)."""

    cache_block_size: Count = None  # tokens per KV block the expectation assumes (profile cache_block_size)
    prompt_tokens: Count = None  # usage.prompt_tokens of the successful requests
    expected_prefix_cache_hit_tokens: Count = None  # what a perfect prefix cache of whole blocks would hit
    expected_prefix_cache_hit_ratio: float | None = None  # the two above divided; None without requests
    conversations_started: Count = None  # first turns sent in the slice
    conversations_completed: Count = None  # last turns that succeeded in the slice
    conversations_ended_early: Count = None  # turns that failed in the slice (each ends its conversation)
    turns: dict[str, TurnFigures] = Field(default_factory=dict)


class SliceFigures(Figures):
    """A stage's or the whole run's figures beyond one slice's: load generator health, fairness, breakdowns."""

    delivered_output_throughput: Rate = None
    loadgen_loop_lag_p99_ms: Ms = None
    loadgen_loop_lag_max_ms: Ms = None
    loadgen_cpu_seconds: float | None = None
    loadgen_cpu_ratio: float | None = None
    jain_fairness_index: float | None = None
    classes: dict[str, Figures] = Field(default_factory=dict)
    models: dict[str, Figures] = Field(default_factory=dict)
    workload: WorkloadFigures | None = None  # absent in older files


class TraceSource(_Model):
    """Where a trace stage's requests came from (docs/loadgen.md, *Trace replay*)."""

    path: str  # as the profile names it
    format: str  # mooncake | burstgpt | azure
    sha256: str  # of the whole trace file
    rows: int  # rows selected for the replay (start, end, limit, model; zero lengths skipped)
    rows_skipped: int = 0  # rows inside the selection left out: a zero length or another BurstGPT model
    rows_sent: Count = None  # requests the stage sent (every outcome): rows replayed before the stage ended
    speedup: float = 1.0
    time_scale: float = 1.0  # the run's --time-scale, which stretches the instants too
    span_seconds: float | None = None  # first to last replayed row, as replayed (trace span / speedup x time_scale)
    start: float = 0.0  # trace seconds after the file's first row where the selection begins
    end: float | None = None
    limit: Count = None
    model: str | None = None  # BurstGPT rows of this model only
    block_size: Count = None  # Mooncake tokens per hash id
    output_tokens: str = "trace"  # trace: each row's recorded length; distribution: drawn from trace.output_tokens


class SaturationTrend(_Model):
    """One series of the over-saturation test (docs/loadgen.md, *Over-saturation*)."""

    series: str  # ttft_seconds | outstanding_requests | output_tokens_per_second
    direction: Literal["increase", "decrease"]  # the direction tested
    points: int  # seconds with data in the window (averaged into at most 240 bins)
    mann_kendall_s: int  # Σ sign(y_j − y_i) over i < j
    z: float | None = None  # continuity- and tie-corrected
    p_value: float | None = None  # one-sided, in the tested direction
    slope_per_s: float | None = None  # Theil–Sen: the median pairwise slope, the series' unit per second
    level: float | None = None  # the series' median in the window
    growth: float | None = None  # slope_per_s × span_s
    span_s: float | None = None  # first to last point


class StageSaturation(_Model):
    """Whether the stage's queue and TTFT grew without bound (docs/loadgen.md, *Over-saturation*)."""

    verdict: Literal["over_saturated", "stable", "not_judged"]
    reason: str  # why: the figures that decided, or what was missing
    mode: Literal["open", "closed"]  # which load series was tested
    alpha: float  # one-sided significance level of each test
    window_start_s: float | None = None  # seconds from the stage's start: the window judged at its end
    window_end_s: float | None = None
    detected_at_s: float | None = None  # first detection (live check or stage end), seconds into the stage
    latency: SaturationTrend | None = None  # None when not judged
    load: SaturationTrend | None = None


# Key order. A model is written (loadgen/results.py) in the order its fields are declared, a base class's
# before its own, so the keys that lead a stage's or the overall block in the file are declared in a base
# listed after SliceFigures: Python puts it before SliceFigures' bases in the fields' order.


class _StageHead(_Model):
    """What a stage is and when it ran: the keys before its figures."""

    name: str
    index: Count = None
    warmup: bool = False
    kind: str | None = None  # open | closed
    target_users: Count = None
    target_rate: float | None = None
    arrival: str | None = None
    max_concurrency: Count = None
    start_time: str | None = None
    end_time: str | None = None
    start_timestamp: float | None = None
    end_timestamp: float | None = None
    end_reason: str | None = None  # duration | until_requests | max_duration | stopped


class StageResult(SliceFigures, _StageHead):
    trace: TraceSource | None = None  # a trace stage's source; None for the others and in older files
    server: ServerFigures | None = None  # absent without --prometheus
    saturation: StageSaturation | None = None  # absent in older files


class _OverallHead(_Model):
    """The keys before the overall figures. The load generator's CPU keys are SliceFigures' own, declared here
    again (same type and default) so that they keep this place in the overall block."""

    stages: list[str] = Field(default_factory=list)
    over_saturated_stages: list[str] = Field(default_factory=list)  # measured stages judged over-saturated
    loadgen_cpu_seconds: float | None = None
    loadgen_cpu_ratio: float | None = None


class Overall(SliceFigures, _OverallHead):
    pass


class Versions(_Model):
    loadlens: str | None = None
    locust: str | None = None
    python: str | None = None


class RunInfo(_Model):
    run_id: str = ""
    target: str | None = None
    model: str = ""
    profile: str = ""
    seed: int | None = None
    users_scale: float | None = None
    time_scale: float | None = None
    start_time: str | None = None
    end_time: str | None = None
    start_timestamp: float | None = None
    end_timestamp: float | None = None
    duration_s: float | None = None
    completed: bool | None = None
    mode: str | None = None  # local | distributed
    workers: Count = None
    hostname: str | None = None
    argv: list[str] = Field(default_factory=list)
    versions: Versions = Field(default_factory=Versions)


class Distribution(_Model):
    """A profile distribution: normal(mean, stdev) truncated to [min, max]."""

    mean: float
    stdev: float = 0.0
    min: float
    max: float


class CountDistribution(Distribution):
    """A distribution of a whole number (turns): its bounds are integers."""

    min: int
    max: int


class PrefixGroup(_Model):
    share: float  # of the entry's requests (conversations: of its conversations)
    tokens: int


class TrafficPrefix(_Model):
    count: int  # distinct shared prefixes
    tokens: int
    groups: list[PrefixGroup] = Field(default_factory=list)  # [] = a random pick among count prefixes


class TrafficConversation(_Model):
    turns: CountDistribution
    think_time_s: Distribution


class TrafficClass(_Model):
    name: str
    weight: float
    share: float
    endpoint: str
    model: str | None = None
    priority: int | None = None
    priority_class: str
    images: int = 0
    adapters: dict[str, float] | None = None  # model -> share of the entry's requests ("base": the base model)
    prefix: TrafficPrefix | None = None
    conversation: TrafficConversation | None = None
    output_tokens: CountDistribution | None = None  # the lengths asked (max_tokens); None: the dataset's own
    think_time_s: Distribution | None = None  # a closed-loop user's wait after an answer; None: none


class TokenizerInfo(_Model):
    """The tokenizer the prompts were counted with (the profile's ``tokenizer``)."""

    path: str  # the file or directory the profile named
    sha256: str  # of its tokenizer.json
    chat_template: bool = False  # whether chat prompts were counted through its chat template


class ProfileInfo(_Model):
    name: str
    description: str = ""
    source: str | None = None
    sha256: str | None = None
    users_scale: float | None = None
    time_scale: float | None = None
    traffic: list[TrafficClass] = Field(default_factory=list)
    cache_block_size: int | None = None
    tokenizer: TokenizerInfo | None = None  # None: the word scheme (a word a token), or an older file


class SLOClass(_Model):
    priority_min: int
    priority_max: int
    ttft_seconds: float
    itl_seconds: float
    e2e_seconds: float


class SLOInfo(_Model):
    source: str | None = None
    classes: dict[str, SLOClass] = Field(default_factory=dict)


class Validity(_Model):
    results_valid: bool
    reasons: list[str] = Field(default_factory=list)
    loadgen_cpu_peak_ratio: float | None = None
    loadgen_cpu_mean_ratio: float | None = None
    cpu_threshold_ratio: float | None = None


class SummaryRow(_Model):
    """The guide's chapter-1 table: one row per measured stage."""

    stage: str
    mean_ttft_ms: Ms = None
    output_throughput: Rate = None
    peak_vram_gib: float | None = None


class VerdictWindow(_Model):
    """The run's window the verdict looked at, and how long it waited afterwards for alerts to settle."""

    start: str | None = None  # ISO 8601 UTC: the run's start
    end: str | None = None  # the run's end (the last stage's end)
    start_timestamp: float | None = None  # Unix seconds
    end_timestamp: float | None = None
    checked_until: str | None = None  # alerts and pages were read up to here (end + the wait)
    waited_seconds: float | None = None  # how long it waited after the end for pending alerts and their pages
    wait_limit_seconds: float | None = None  # the bound on that wait (--alert-wait)
    unsettled: list[str] = Field(default_factory=list)  # what the wait still waited for when it hit the bound


class SLOCheck(_Model):
    """One SLO of the SLO file judged on one stage (or ``overall``) and, for per-class SLOs, one class."""

    slo: str  # ttft | itl | e2e | goodput | error_ratio | lora_swap
    priority_class: str | None = None  # None for whole-stage SLOs (error_ratio, lora_swap)
    stage: str  # a stage name or "overall"
    statistic: str  # what `observed` is: p99 (the class objective's percentile) or ratio
    comparison: Literal["<=", ">="] = "<="  # passed = observed <comparison> threshold
    threshold: float
    observed: float | None = None  # None: nothing to judge (no samples, or no such percentile in the result)
    unit: str  # ms | ratio
    passed: bool | None = None  # None when observed is None


class VerdictAlert(_Model):
    """An alert that fired (Prometheus ALERTS{alertstate="firing"}) in the window, or was still pending."""

    alertname: str
    severity: str | None = None
    state: Literal["firing", "resolved", "pending"]  # at checked_until
    starts_at: str | None = None  # first firing evaluation (pending: when it became pending)
    ends_at: str | None = None  # last firing evaluation if it resolved, else None
    labels: dict[str, str] = Field(default_factory=dict)  # its other labels (slo, priority_class, model_name, ...)


class VerdictPage(_Model):
    """An alert inside a notification the pager received in the window (the alert's startsAt in the window)."""

    alertname: str
    severity: str | None = None
    receiver: str  # Alertmanager receiver (pager, ticket)
    status: str  # firing | resolved
    at: str  # when the pager received it (ISO 8601 UTC)


class Verdict(_Model):
    """Pass/fail of a run against its SLO file, with the alerts and pages of its window (docs/loadgen.md)."""

    status: Literal["pass", "fail", "unknown"]  # fail: some check failed; unknown: none could be judged
    headline: str  # one line: "FAIL: TTFT p99 (interactive) at c16/c32 above 200 ms; 2 pages"
    slos: list[SLOCheck] = Field(default_factory=list)
    stages: dict[str, Literal["pass", "fail", "unknown"]] = Field(default_factory=dict)  # each measured stage
    # and "overall", in run order: fail if one of its checks failed, pass if all judged ones passed
    alerts: list[VerdictAlert] = Field(default_factory=list)
    pages: list[VerdictPage] = Field(default_factory=list)
    window: VerdictWindow = Field(default_factory=VerdictWindow)
    alerts_source: str | None = None  # the Prometheus URL alerts came from; None: alerts not checked
    pages_source: str | None = None  # the pager URL or pages.jsonl the pages came from; None: not checked
    errors: list[str] = Field(default_factory=list)  # why alerts or pages could not be read


class BenchmarkResult(_Model):
    schema_: str = Field(SCHEMA, alias="schema")
    schema_version: int = SCHEMA_VERSION
    run: RunInfo = Field(default_factory=RunInfo)
    profile: ProfileInfo | None = None
    slo: SLOInfo | None = None
    validity: Validity | None = None
    stages: list[StageResult]
    overall: Overall | None = None
    summary_table: list[SummaryRow] = Field(default_factory=list)
    verdict: Verdict | None = None  # absent in files written before the verdict existed


def parse_result(doc: Any, source: str = "<memory>") -> BenchmarkResult:
    """A parsed document, or :class:`ResultsError` naming the file and the first bad key."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultsError(f"{source}: not a loadlens benchmark_result.json (schema is not {SCHEMA})")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(
            f"{source}: schema_version {doc.get('schema_version')!r} is not {SCHEMA_VERSION} (written by another "
            "loadlens version)"
        )
    try:
        return BenchmarkResult.model_validate(doc)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ResultsError(f"{source}: {where}: {first['msg']}") from None
