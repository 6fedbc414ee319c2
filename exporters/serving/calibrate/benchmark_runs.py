"""Calibration stages from ``loadlens load`` runs: each closed-loop stage of a ``benchmark_result.json`` with the
client's figures of that stage, and the server's engine counters over the stage's window read from the
Prometheus that scraped the server (``loadlens calibrate RUN --prometheus URL``, docs/calibration.md, *Input*),
or, for a run of one measured stage without warm-up, from the server's ``/metrics`` saved before and after the
run (``--metrics-before FILE --metrics-after FILE``).

A counter's increase over a stage is ``sum(NAME)`` at the stage's end minus ``sum(NAME)`` at its start, two
instant queries: each reads the newest scrape at or before that instant, so the window is the scrapes', up to
one scrape interval earlier at each end than the stage's (its length, ``SPAN``, is the stage's). A counter reset
inside a stage (a server restart) makes the difference wrong; such a run is not calibration data. The KV capacity
is ``vllm:cache_config_info``'s at the stage's end (loadlens/contracts/kv_capacity.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporters.serving.calibrate.observations import (
    CLIENT_FIGURES,
    CalibrationInputError,
    LeadIn,
    Stage,
    lead_in_before,
)
from exporters.serving.calibrate.user_draws import Clamped
from loadlens.contracts.engine_counters import BUCKETED, ENGINE_COUNTERS, SPAN, bucket_key, parse_engine_counters
from loadlens.contracts.kv_capacity import SERIES as KV_SERIES
from loadlens.contracts.kv_capacity import KvCapacity, parse_kv_capacity, stated_capacity
from loadlens.contracts.results import BenchmarkResult, StageResult, parse_result
from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable, QueryError


def is_benchmark_result(doc: object) -> bool:
    return isinstance(doc, dict) and "trials" not in doc and "stages" in doc


def window_increases(prom: PrometheusClient, start: float, end: float) -> dict[str, float]:
    """Every engine counter's increase between two instants (absent when the server never exported it), and the
    iteration-token buckets' increases by edge."""
    out: dict[str, float] = {}
    for name in sorted(ENGINE_COUNTERS):
        before, after = prom.value_at(f"sum({name})", start), prom.value_at(f"sum({name})", end)
        if before is not None and after is not None:
            out[name] = after - before
    edges = {labels["le"]: v for labels, v in prom.vector_at(f"sum by (le) ({BUCKETED})", start) if "le" in labels}
    for labels, value in prom.vector_at(f"sum by (le) ({BUCKETED})", end):
        le = labels.get("le")
        if le is not None and le in edges:
            out[bucket_key(le)] = value - edges[le]
    out[SPAN] = end - start
    return out


def _exposition(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise CalibrationInputError(f"{flag} {path}: {err.strerror}") from None


def snapshot_increases(before: Path, after: Path) -> tuple[dict[str, float], KvCapacity | None]:
    """Every engine counter's increase between two saved ``/metrics`` expositions of the server (``curl
    URL/metrics > FILE`` before and after a run), and the KV capacity the later one states; raises
    :class:`CalibrationInputError` for files without vLLM's series or a counter that went down (a restart)."""
    first = parse_engine_counters(_exposition(before, "--metrics-before"))
    text = _exposition(after, "--metrics-after")
    last = parse_engine_counters(text)
    if not first or not last:
        empty = before if not first else after
        raise CalibrationInputError(f"{empty}: no vLLM engine series in it (save the server's /metrics exposition)")
    out = {name: last[name] - first[name] for name in sorted(set(first) & set(last))}
    fell = [name for name, value in out.items() if value < 0]
    if fell:
        raise CalibrationInputError(
            f"{fell[0]} is lower in {after} than in {before}: the server restarted between the snapshots"
        )
    return out, parse_kv_capacity(text)


def read_benchmark_stages(
    path: Path, prometheus: str | None, snapshots: tuple[Path, Path] | None = None
) -> list[Stage]:
    """The closed-loop stages of one run (warm-up stages left out), the server's counters from ``prometheus`` or
    from a ``/metrics`` snapshot pair taken before and after the run; raises :class:`CalibrationInputError`."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CalibrationInputError(f"{path}: not valid JSON ({err})") from None
    if prometheus is None and snapshots is None:
        raise CalibrationInputError(
            f"{path}: a benchmark_result.json carries no server counters; give --prometheus URL (the Prometheus "
            "that scraped the server during the run) or --metrics-before/--metrics-after (the server's /metrics "
            "saved before and after it), or calibrate from loadlens experiment calibration-sweep"
        )
    try:
        result: BenchmarkResult = parse_result(doc, str(path))
    except ValueError as err:
        raise CalibrationInputError(str(err).splitlines()[0]) from None
    if snapshots is not None:
        return [_snapshot_stage(path, result, snapshots)]
    assert prometheus is not None
    prom = PrometheusClient(prometheus)
    drawn = profile_draws(result)
    stages: list[Stage] = []
    for index, st in enumerate(result.stages):
        if st.warmup:
            continue
        users, figures = _client_stage(path, st)
        if st.start_timestamp is None or st.end_timestamp is None:
            raise CalibrationInputError(f"{path}: stage {st.name} has no start and end timestamps")
        completed = st.completed or 0
        try:
            counters = window_increases(prom, st.start_timestamp, st.end_timestamp)
            capacity = stated_capacity(labels for labels, _ in prom.vector_at(KV_SERIES, st.end_timestamp))
        except (PrometheusUnreachable, QueryError) as err:
            raise CalibrationInputError(f"--prometheus {prometheus}: {err}") from None
        stages.append(
            Stage(
                name=st.name,
                users=users,
                prompt_tokens=(st.total_input_tokens or 0) / completed if completed else 0.0,
                output_tokens=(st.total_output_tokens or 0) / completed if completed else 0.0,
                duration_s=st.duration or (st.end_timestamp - st.start_timestamp),
                completed=completed,
                figures=figures,
                counters=counters,
                kv_capacity=capacity,
                windows=((st.start_timestamp, st.end_timestamp),),
                lead_in=_lead_in(path, doc, index),
                **drawn,
            )
        )
    if not stages:
        raise CalibrationInputError(f"{path}: no measured stage")
    return stages


def _lead_in(path: Path, doc: dict[str, Any], index: int) -> LeadIn | None:
    """The stage before a run's stage ``index`` (a warm-up or a measured one) as its lead-in
    (observations.lead_in_before); None where that is not a closed-loop stage of users or the document lacks
    what it needs."""
    try:
        return lead_in_before(path.parent, doc, index)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None


def profile_draws(result: BenchmarkResult) -> dict[str, Any]:
    """What each user drew per request, as the run's profile recorded it (``profile.traffic``): the spread of
    its output lengths and its think time; nothing where the profile has several entries (or none) or the
    run's file predates these keys (then every request is replayed with the mean length, no think time)."""
    traffic = result.profile.traffic if result.profile is not None else []
    if len(traffic) != 1:
        return {}
    entry = traffic[0]
    out: dict[str, Any] = {}
    if entry.output_tokens is not None:
        out["output_stdev"] = entry.output_tokens.stdev
    if entry.think_time_s is not None:
        t = entry.think_time_s
        out["think_time"] = Clamped(t.mean, t.stdev, t.min, t.max)
    return out


def _client_stage(path: Path, st: StageResult) -> tuple[int, dict[str, float]]:
    if st.kind != "closed" or not st.target_users:
        raise CalibrationInputError(f"{path}: stage {st.name} is not a closed-loop stage of users")
    figures = {k: float(v) for k in CLIENT_FIGURES if isinstance(v := getattr(st, k, None), int | float)}
    return int(st.target_users), figures


def _snapshot_stage(path: Path, result: BenchmarkResult, snapshots: tuple[Path, Path]) -> Stage:
    """The one stage a snapshot pair can stand for: the counters cover the whole run, so the run must be one
    measured stage with no warm-up before it."""
    if len(result.stages) != 1 or result.stages[0].warmup:
        names = ", ".join(f"{s.name}{' (warm-up)' if s.warmup else ''}" for s in result.stages)
        raise CalibrationInputError(
            f"{path}: a /metrics snapshot pair covers the whole run, which has {len(result.stages)} stages "
            f"({names}); give a run of one measured stage without warm-up per pair, or --prometheus"
        )
    st = result.stages[0]
    users, figures = _client_stage(path, st)
    counters, capacity = snapshot_increases(*snapshots)
    completed = st.completed or 0
    duration = st.duration or ((st.end_timestamp or 0.0) - (st.start_timestamp or 0.0))
    counters[SPAN] = duration
    return Stage(
        name=st.name,
        users=users,
        prompt_tokens=(st.total_input_tokens or 0) / completed if completed else 0.0,
        output_tokens=(st.total_output_tokens or 0) / completed if completed else 0.0,
        duration_s=duration,
        completed=completed,
        figures=figures,
        counters=counters,
        kv_capacity=capacity,
        **profile_draws(result),
    )
