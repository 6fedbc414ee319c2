"""``benchmark_result.json``: versioned, documented (docs/loadgen.md), built from the store and stage boundaries.

Where a figure means what a ``vllm bench serve`` result key means, it has that key (``completed``, ``failed``,
``duration``, ``request_throughput``, ``request_goodput``, ``output_throughput``, ``total_token_throughput``,
``total_input_tokens``, ``total_output_tokens``, ``max_output_tokens_per_s``, ``{mean,median,std,pNN}_{ttft,
tpot,itl,e2el}_ms``), so scripts that compare vLLM results read ours unchanged.

Attribution: a request belongs to the stage in which it was scheduled to start. Warmup stages are reported
but never enter ``overall``; a request that began in the warmup and finished after it is a warmup request.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loadgen.profile import BASE_MODEL, Profile, Stage, Traffic
from loadgen.store import Series, Store
from loadgen.workload import workload_block
from loadlens.contracts.results import (
    RESULT_FILE,
    SCHEMA,
    SCHEMA_VERSION,
    BenchmarkResult,
    CountDistribution,
    Distribution,
    Figures,
    Overall,
    PrefixGroup,
    ProfileInfo,
    RunInfo,
    ServerFigures,
    SLOClass,
    SLOInfo,
    StageResult,
    StageSaturation,
    SummaryRow,
    TokenizerInfo,
    TraceSource,
    TrafficClass,
    TrafficConversation,
    TrafficPrefix,
    Validity,
    WorkloadFigures,
)
from loadlens.contracts.slo import SLOConfig

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
LATENCIES: tuple[tuple[str, str], ...] = (
    ("ttft", "ttft"),
    ("tpot", "tpot"),
    ("itl", "itl"),
    ("e2el", "e2el"),
    ("chunk_itl", "chunk_itl"),
    ("dispatch_lag", "dispatch_lag"),
)
"""(store distribution, key infix): ``mean_ttft_ms`` ... ``p99.9_dispatch_lag_ms``."""


def pkey(p: float) -> str:
    """vLLM's percentile key: 99 -> 'p99', 99.9 -> 'p99.9'."""
    return f"p{int(p)}" if p == int(p) else f"p{p:g}"


@dataclass(frozen=True)
class StageWindow:
    """When a stage really ran (wall clock, seconds since the epoch)."""

    index: int
    spec: Stage
    start: float
    end: float
    end_reason: str = "duration"  # duration | until_requests | max_duration | stopped

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _num(x: float | None) -> float | None:
    """JSON has no NaN: missing figures are null."""
    return None if x is None or not math.isfinite(x) else round(x, 6)


def block(series: Series, duration: float, max_tokens_per_s: int | None = None) -> dict[str, Any]:
    """The figures of one slice (a stage, a class, the whole run)."""
    rate = (lambda n: n / duration) if duration > 0 else (lambda n: math.nan)
    out: dict[str, Any] = {
        "completed": series.completed,
        "failed": series.failed,
        "cancelled": series.outcomes.get("cancelled", 0),
        "outcomes": {k: v for k, v in series.outcomes.items() if v},
        "failure_reasons": dict(series.reasons.most_common()),
        "duration": _num(duration),
        "total_input_tokens": series.input_tokens,
        "total_output_tokens": series.output_tokens,
        "request_throughput": _num(rate(series.completed)),
        "request_goodput": _num(rate(series.goodput)),
        "goodput_requests": series.goodput,
        "goodput_ratio": _num(series.goodput / series.completed) if series.completed else None,
        "output_throughput": _num(rate(series.output_tokens)),
        "total_token_throughput": _num(rate(series.input_tokens + series.output_tokens)),
        "max_output_tokens_per_s": max_tokens_per_s,
        "sla_breaches": dict(series.slo_breaches),
        "itl_fallback_requests": series.itl_fallback,
    }
    for dist_name, infix in LATENCIES:
        dist = series.dists[dist_name]
        out[f"mean_{infix}_ms"] = _num(dist.mean * 1e3)
        out[f"median_{infix}_ms"] = _num(dist.quantile(0.5) * 1e3)
        out[f"std_{infix}_ms"] = _num(dist.std * 1e3)
        for p in PERCENTILES:
            out[f"{pkey(p)}_{infix}_ms"] = _num(dist.quantile(p / 100.0) * 1e3)
        out[f"min_{infix}_ms"] = _num(dist.min * 1e3) if dist.count else None
        out[f"max_{infix}_ms"] = _num(dist.max * 1e3) if dist.count else None
        out[f"{infix}_samples"] = dist.count
    return out


def class_shares(profile: Profile, slos: SLOConfig) -> dict[str, float]:
    """Each priority class's share of the traffic mix (by weight)."""
    total = sum(t.weight for t in profile.traffic)
    shares: dict[str, float] = {}
    for t in profile.traffic:
        name = t.slo_class(slos).name
        shares[name] = shares.get(name, 0.0) + t.weight / total
    return shares


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes everything."""
    xs = list(values)
    sq = sum(x * x for x in xs)
    if len(xs) < 2 or sq == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * sq)


def fairness(store: Store, stages: set[str], classes: Iterable[str]) -> float | None:
    """Jain's index over the classes' normalised throughput within ``stages``.

    A class's normalised throughput is its output-token throughput divided by its mean concurrency, i.e.
    Σ output tokens / Σ request durations (E2E): the token rate one of its requests gets while in flight.
    Raw request counts would not do: in closed loop the traffic mix fixes each class's share of requests,
    whatever the server does. None with fewer than two classes or before both have completed requests.
    """
    names = list(classes)
    if len(names) < 2:
        return None
    tokens = dict.fromkeys(names, 0)
    busy = dict.fromkeys(names, 0.0)
    for (st, cls, _model), series in store.series.items():
        if st in stages and cls in tokens:
            tokens[cls] += series.output_tokens
            busy[cls] += series.dists["e2el"].sum
    if any(v <= 0 for v in busy.values()):
        return None
    return jain_index(tokens[c] / busy[c] for c in names)


def _lag(store: Store, stage: str) -> tuple[float | None, float | None]:
    """The event loop's lag in the stage's window, p99 and max in ms; None without samples."""
    dist = store.loop_lag.get(stage)
    if dist is None or not dist.count:
        return None, None
    return _num(dist.quantile(0.99) * 1e3), _num(dist.max * 1e3)


def _peak(tokens_by_second: Mapping[int, int], start: float, end: float) -> int | None:
    values = [v for s, v in tokens_by_second.items() if int(start) <= s <= int(end)]
    return max(values) if values else None


def _sliced(store: Store, stages: set[str], dim: int) -> dict[str, Series]:
    """Series merged by class (dim 1) or model (dim 2) over the given stages."""
    groups: dict[str, list[tuple[str, str, str]]] = {}
    for key in store.series:
        if key[0] in stages:
            groups.setdefault(key[dim], []).append(key)
    return {name: store.merged(keys) for name, keys in sorted(groups.items())}


def traffic_workload(t: Traffic) -> dict[str, Any]:
    """What an entry's requests share and continue: ``adapters`` (shares of the entry's requests; ``base`` =
    the base model), ``prefix`` (groups and shares), ``conversation`` (turns and think time), the output
    lengths asked and a closed-loop user's think time after an answer."""
    total = sum(w for _, w in t.adapters)
    prefix = None
    if t.prefix is not None:
        prefix = TrafficPrefix(
            count=t.prefix.count,
            tokens=t.prefix.tokens,
            groups=[
                PrefixGroup(share=share, tokens=t.prefix.group_tokens(i)) for i, share in enumerate(t.prefix.shares)
            ],
        )
    conversation = None
    if t.conversation is not None:
        conversation = TrafficConversation(
            turns=CountDistribution(**asdict(t.conversation.turns)),
            think_time_s=Distribution(**asdict(t.conversation.think_time_s)),
        )
    return {
        "adapters": {m or BASE_MODEL: round(w / total, 6) for m, w in t.adapters} if t.adapters else None,
        "prefix": prefix,
        "conversation": conversation,
        "output_tokens": None if t.output_tokens is None else CountDistribution(**asdict(t.output_tokens)),
        "think_time_s": None if t.think_time_s is None else Distribution(**asdict(t.think_time_s)),
    }


def _sig3(x: float | None) -> float | None:
    """A trace's mean offered rate to 3 significant digits (what the table's load column shows)."""
    return None if x is None else float(f"{x:.3g}")


def trace_source(stage: Stage, series: Series) -> TraceSource | None:
    """A trace stage's ``trace``: the file (its sha256), the rows selected and sent, the time scaling."""
    t = stage.trace
    if t is None:
        return None
    return TraceSource(
        path=t.path,
        format=t.data.format,
        sha256=t.data.sha256,
        rows=len(t.rows),
        rows_skipped=t.data.rows_skipped,
        rows_sent=series.completed + series.failed + series.outcomes.get("cancelled", 0),
        speedup=t.speedup,
        time_scale=t.time_scale,
        span_seconds=_num(t.span_s),
        start=t.start,
        end=t.end,
        limit=t.limit,
        model=t.model,
        block_size=t.block_size if t.data.format == "mooncake" else None,
        output_tokens="trace" if t.output_tokens is None else "distribution",
    )


M = TypeVar("M", bound=BaseModel)


def _given(model: type[M], doc: Mapping[str, Any], *where: str | int) -> M:
    """A block the caller built as a mapping (run, validity, server figures, saturation), validated; an error
    names its key by its place in the document (``run.hostnme``), as the whole document's validation would."""
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        errors: list[Any] = [
            {
                "type": e["type"],
                "loc": (*where, *e["loc"]),
                "input": e["input"],
                **({"ctx": e["ctx"]} if "ctx" in e else {}),
            }
            for e in err.errors()
        ]
        raise ValidationError.from_exception_data(BenchmarkResult.__name__, errors) from None


def _stage(
    position: int,
    w: StageWindow,
    store: Store,
    profile: Profile,
    shares: Mapping[str, float],
    server: Mapping[str, Mapping[str, Any]] | None,
    saturation: Mapping[str, Mapping[str, Any]] | None,
) -> StageResult:
    name = w.spec.name
    names = {name}
    keys = [k for k in store.series if k[0] == name]
    lag_p99, lag_max = _lag(store, name)
    stage = StageResult(
        name=name,
        index=w.index,
        warmup=w.spec.warmup,
        kind="open" if w.spec.open_loop else "closed",
        target_users=w.spec.users,
        target_rate=w.spec.rate if w.spec.trace is None else _sig3(w.spec.trace.mean_rate),
        arrival=("trace" if w.spec.trace is not None else w.spec.arrival) if w.spec.open_loop else None,
        max_concurrency=w.spec.max_concurrency if w.spec.open_loop else None,
        start_time=iso(w.start),
        end_time=iso(w.end),
        start_timestamp=round(w.start, 3),
        end_timestamp=round(w.end, 3),
        end_reason=w.end_reason,
        **block(store.merged(keys), w.duration, _peak(store.tokens_by_second, w.start, w.end)),
        delivered_output_throughput=_num(store.window_tokens.get(name, 0) / w.duration) if w.duration > 0 else None,
        loadgen_loop_lag_p99_ms=lag_p99,
        loadgen_loop_lag_max_ms=lag_max,
        loadgen_cpu_seconds=_num(store.cpu_seconds.get(name, 0.0)),
        loadgen_cpu_ratio=_num(store.cpu_seconds.get(name, 0.0) / w.duration) if w.duration > 0 else None,
        jain_fairness_index=_num(fairness(store, names, shares)),
        classes={c: Figures(**block(s, w.duration)) for c, s in _sliced(store, names, 1).items()},
        models={m: Figures(**block(s, w.duration)) for m, s in _sliced(store, names, 2).items()},
        workload=WorkloadFigures(**workload_block(store.workload, names, profile.cache_block_size)),
        trace=trace_source(w.spec, store.merged(keys)),
    )
    # Set only when given: a stage without them has no such key (an assignment counts as set, like the keywords).
    if server is not None:
        stage.server = _given(ServerFigures, server.get(name, {}), "stages", position, "server")
    if saturation is not None and name in saturation:
        stage.saturation = _given(StageSaturation, saturation[name], "stages", position, "saturation")
    return stage


def _overall(
    windows: Sequence[StageWindow],
    store: Store,
    profile: Profile,
    shares: Mapping[str, float],
    saturation: Mapping[str, Mapping[str, Any]] | None,
) -> Overall:
    measured = [w for w in windows if not w.spec.warmup]
    verdicts = {name: block.get("verdict") for name, block in (saturation or {}).items()}
    names = {w.spec.name for w in measured}
    duration = sum(w.duration for w in measured)
    peaks = [p for w in measured if (p := _peak(store.tokens_by_second, w.start, w.end)) is not None]
    cpu = sum(store.cpu_seconds.get(n, 0.0) for n in names)
    return Overall(
        stages=[w.spec.name for w in measured],
        over_saturated_stages=[w.spec.name for w in measured if verdicts.get(w.spec.name) == "over_saturated"],
        loadgen_cpu_seconds=_num(cpu),
        loadgen_cpu_ratio=_num(cpu / duration) if duration > 0 else None,
        **block(store.merged([k for k in store.series if k[0] in names]), duration, max(peaks) if peaks else None),
        jain_fairness_index=_num(fairness(store, names, shares)),
        classes={c: Figures(**block(s, duration)) for c, s in _sliced(store, names, 1).items()},
        models={m: Figures(**block(s, duration)) for m, s in _sliced(store, names, 2).items()},
        workload=WorkloadFigures(**workload_block(store.workload, names, profile.cache_block_size)),
    )


def _profile(profile: Profile, slos: SLOConfig) -> ProfileInfo:
    total = sum(x.weight for x in profile.traffic)
    tok = profile.tokenizer
    return ProfileInfo(
        name=profile.name,
        description=profile.description,
        source=profile.source,
        sha256=profile.sha256,
        users_scale=profile.users_scale,
        time_scale=profile.time_scale,
        traffic=[
            TrafficClass(
                name=t.name,
                weight=t.weight,
                share=round(t.weight / total, 6),
                endpoint=t.endpoint,
                model=t.model,
                priority=t.priority,
                priority_class=t.slo_class(slos).name,
                images=t.images.count,
                **traffic_workload(t),
            )
            for t in profile.traffic
        ],
        cache_block_size=profile.cache_block_size,
        tokenizer=None
        if tok is None
        else TokenizerInfo(path=str(tok.path), sha256=tok.sha256, chat_template=tok.has_chat_template),
    )


def _slo(slos: SLOConfig) -> SLOInfo:
    return SLOInfo(
        source=slos.source,
        classes={
            c.name: SLOClass(
                priority_min=c.priority_min,
                priority_max=c.priority_max,
                ttft_seconds=c.ttft_seconds,
                itl_seconds=c.itl_seconds,
                e2e_seconds=c.e2e_seconds,
            )
            for c in slos.classes
        },
    )


def result_model(
    *,
    run: Mapping[str, Any],
    profile: Profile,
    slos: SLOConfig,
    store: Store,
    windows: Sequence[StageWindow],
    validity: Mapping[str, Any],
    server: Mapping[str, Mapping[str, Any]] | None = None,
    saturation: Mapping[str, Mapping[str, Any]] | None = None,
) -> BenchmarkResult:
    """The typed result. ``server`` maps stage name -> server-side figures (``--prometheus``); ``saturation``
    maps stage name -> its over-saturation judgement (``loadgen/saturation.py``)."""
    shares = class_shares(profile, slos)
    stages = [_stage(i, w, store, profile, shares, server, saturation) for i, w in enumerate(windows)]
    return BenchmarkResult(
        schema=SCHEMA,
        schema_version=SCHEMA_VERSION,
        run=_given(RunInfo, run, "run"),
        profile=_profile(profile, slos),
        slo=_slo(slos),
        validity=_given(Validity, validity, "validity"),
        stages=stages,
        overall=_overall(windows, store, profile, shares, saturation),
        summary_table=[
            SummaryRow(
                stage=s.name,
                mean_ttft_ms=s.mean_ttft_ms,
                output_throughput=s.output_throughput,
                peak_vram_gib=s.server.peak_vram_gib if s.server is not None else None,
            )
            for s in stages
            if not s.warmup
        ],
    )


def document(result: BenchmarkResult) -> dict[str, Any]:
    """The file's document: every key the builder set, in the model's declared order (a key it did not set,
    such as a stage's ``server`` without ``--prometheus``, is absent, not null)."""
    return result.model_dump(by_alias=True, exclude_unset=True)


def build_result(
    *,
    run: Mapping[str, Any],
    profile: Profile,
    slos: SLOConfig,
    store: Store,
    windows: Sequence[StageWindow],
    validity: Mapping[str, Any],
    server: Mapping[str, Mapping[str, Any]] | None = None,
    saturation: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The whole document, as :func:`write_result` writes it (the arguments are :func:`result_model`'s)."""
    return document(
        result_model(
            run=run,
            profile=profile,
            slos=slos,
            store=store,
            windows=windows,
            validity=validity,
            server=server,
            saturation=saturation,
        )
    )


def write_result(directory: Path, doc: Mapping[str, Any]) -> Path:
    """Write atomically (a reader never sees half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILE
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".benchmark_result.", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, allow_nan=False)
        fh.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
    os.replace(tmp, path)
    return path
