"""What ``loadlens calibrate`` reads: one :class:`Stage` per finished trial of an ``experiment_result.json``
(``loadlens experiment calibration-sweep``, or any experiment whose trials are closed-loop stages of a fixed
prompt length), with the client's figures, the server's engine counter increases
(loadlens/contracts/engine_counters.py) and what each user drew per request (the spread of its output lengths,
its think time: the trial's ``output_stdev``, ``think_s`` and ``think_stdev_s``). docs/calibration.md, *Input*."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from exporters.serving.calibrate.user_draws import NO_THINK, Clamped
from loadlens.contracts.engine_counters import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, SPAN
from loadlens.contracts.experiment_result import ExperimentResult
from loadlens.contracts.kv_capacity import KvCapacity

MIN_REQUESTS = 20
"""A stage with fewer completed requests is refused: its medians and means say too little."""

CLIENT_FIGURES = (
    "mean_ttft_ms", "mean_e2el_ms", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms",
    "median_e2el_ms", "p99_e2el_ms", "output_throughput",
)  # fmt: skip
"""The client's figures read per stage (``benchmark_result.json``'s ``overall``)."""


class CalibrationInputError(ValueError):
    """Unusable input: one line, the CLI exits 2."""


@dataclass(frozen=True, slots=True)
class LeadIn:
    """What ran before a measured stage in each of its runs: the users of the stage before it (the warmup) and
    its mean duration. At the measured stage's start the load generator spawns the users it adds all at once
    (or stops those it drops), and it measures every request begun in the stage to its end; the replay does
    the same (replay.py), so the stage's first seconds carry the same burst of first requests."""

    users: int
    duration_s: float
    requests: int | None = None
    """Where every run's lead-in ended on its count of answered requests (``until_requests``, read from the run's
    profile), that count: the replay ends its lead-in on the same count, so the lead-in's users are where the
    load generator left them (just answered, together where they started together); None: on its duration."""


def _until_requests(experiment_dir: Path, doc: dict[str, Any], index: int) -> int | None:
    """The ``until_requests`` of stage ``index`` of the profile a run names (its ``profile.source``, or the
    file of that name under the experiment's ``profiles/``: a copied directory); None where none is found."""
    profile = doc.get("profile")
    source = profile.get("source") if isinstance(profile, dict) else None
    if not isinstance(source, str):
        return None
    for path in (Path(source), experiment_dir / "profiles" / Path(source).name):
        try:
            stages = yaml.safe_load(path.read_text(encoding="utf-8"))["stages"]
            count = stages[index].get("until_requests")
        except (OSError, yaml.YAMLError, KeyError, TypeError, IndexError, AttributeError):
            continue
        return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None
    return None


def lead_in_before(base_dir: Path, doc: dict[str, Any], index: int) -> LeadIn | None:
    """The lead-in of stage ``index`` of a ``benchmark_result.json`` document: the stage before it, where that
    one ran closed-loop users (its users, its duration and, where it ended on its count of requests, that count
    from the run's profile, looked for beside ``base_dir`` too); None for the first stage or one after an
    open-loop stage."""
    if index < 1:
        return None
    before = doc["stages"][index - 1]
    users = before.get("target_users")
    if not isinstance(users, int) or isinstance(users, bool) or users < 1:
        return None
    ended = before.get("end_reason")
    count = _until_requests(base_dir, doc, index - 1) if ended == "until_requests" else None
    return LeadIn(users, float(before["duration"]), count)


def read_lead_in(experiment_dir: Path, result_paths: list[str]) -> LeadIn | None:
    """The lead-in of a trial's runs from their ``benchmark_result.json`` files (:func:`lead_in_before` of the
    first measured stage): the users (the last run's), the duration (the mean) and, where every run's ended on
    the same count of requests, that count; None where a file is missing or unreadable, or a run has none."""
    found: list[LeadIn] = []
    for rel in result_paths:
        try:
            doc = json.loads((experiment_dir / rel).read_text(encoding="utf-8"))
            first = next(i for i, s in enumerate(doc["stages"]) if not s.get("warmup"))
            lead = lead_in_before(experiment_dir, doc, first)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
            return None
        if lead is None:
            return None
        found.append(lead)
    if not found:
        return None
    counts = {lead.requests for lead in found}
    count = counts.pop() if len(counts) == 1 else None
    return LeadIn(found[-1].users, sum(lead.duration_s for lead in found) / len(found), count)


@dataclass(slots=True)
class Stage:
    name: str
    users: int
    prompt_tokens: float
    """Mean prompt tokens per request as the server counted them (usage)."""
    output_tokens: float
    duration_s: float
    """One run's measured seconds (the mean over the trial's runs)."""
    completed: int
    """Requests completed over all the trial's runs."""
    figures: dict[str, float] = field(default_factory=dict)
    """CLIENT_FIGURES present in the run (ms, tok/s, requests)."""
    counters: dict[str, float] = field(default_factory=dict)
    """Engine counter increases over the measured window (vLLM's names)."""
    kv_capacity: KvCapacity | None = None
    """The KV capacity the server stated during the stage (``vllm:cache_config_info``), None where it states none."""
    runs: int = 1
    """The trial's runs (repeats) read into this stage: its counters and ``completed`` are their sums."""
    output_stdev: float = 0.0
    """The standard deviation of the requests' output lengths (tokens), from the trial's ``output_stdev``
    parameter; 0 where the trial has none (every request asked the same length)."""
    think_time: Clamped = NO_THINK
    """The users' think time after each answer (seconds), from the trial's ``think_s`` and ``think_stdev_s``
    parameters; none where the trial has neither."""
    windows: tuple[tuple[float, float], ...] = ()
    """The (start, end) epoch seconds of each run of the stage, where the run recorded them: where to look for
    the stage in the server's own log (iteration_log.py)."""
    lead_in: LeadIn | None = None
    """The load before the measured stage (the warmup) as the runs' ``benchmark_result.json`` recorded it; None
    where they are not found (the replay then starts every user at once and measures after a warmup of its own)."""

    def server_figures(self) -> dict[str, float]:
        """The server's own figures over the window: vLLM's histogram means (ms), its output token rate
        and Little's law's mean running requests (inference time over the window)."""
        return server_figures(self.counters, self.counters.get(SPAN, self.duration_s * self.runs))

    def prefix_hit_ratio(self) -> float | None:
        """The share of the prompt tokens looked up in the server's prefix cache that it served from there
        (``vllm:prefix_cache_hits_total`` / ``..._queries_total`` increases); None where the server does not
        count them."""
        queries, hits = self.counters.get(PREFIX_CACHE_QUERIES), self.counters.get(PREFIX_CACHE_HITS)
        return hits / queries if queries and hits is not None else None

    def server_mean(self, histogram: str) -> float | None:
        """``_sum / _count`` of a vLLM histogram's increase, seconds; None without samples."""
        total, count = self.counters.get(f"{histogram}_sum"), self.counters.get(f"{histogram}_count")
        return total / count if total is not None and count else None


PREFIX_HIT_LIMIT = 0.02
"""Above this share of prompt tokens served from the prefix cache a stage's prefills were shorter than its
prompts: the fit prices every prompt token as computed, so calibrate warns (docs/calibration.md)."""


def prefix_cache_warnings(stages: list[Stage]) -> list[str]:
    """One line per stage whose prompts hit the server's prefix cache above ``PREFIX_HIT_LIMIT``."""
    out = []
    for s in stages:
        ratio = s.prefix_hit_ratio()
        if ratio is not None and ratio > PREFIX_HIT_LIMIT:
            out.append(
                f"stage {s.name}: {ratio * 100:.1f} % of its prompt tokens came from the server's prefix cache, "
                "where the fit prices every prompt token as computed (its prompts were sent before: rerun the "
                "sweep with another --run-id or --seed, or against a restarted server)"
            )
    return out


SERVER_FIGURES = {
    "server_mean_ttft_ms": "vllm:time_to_first_token_seconds",
    "server_mean_itl_ms": "vllm:inter_token_latency_seconds",
    "server_mean_e2el_ms": "vllm:e2e_request_latency_seconds",
    "server_mean_queue_ms": "vllm:request_queue_time_seconds",
    "server_mean_prefill_ms": "vllm:request_prefill_time_seconds",
}
"""Figure -> the vLLM histogram whose mean (``_sum / _count``, ms) it is."""


def server_figures(counters: dict[str, float], duration_s: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, hist in SERVER_FIGURES.items():
        total, count = counters.get(f"{hist}_sum"), counters.get(f"{hist}_count")
        if total is not None and count:
            out[key] = total / count * 1000
    gen = counters.get("vllm:generation_tokens_total")
    if gen is not None and duration_s > 0:
        out["server_output_throughput"] = gen / duration_s
    inference = counters.get("vllm:request_inference_time_seconds_sum")
    if inference is not None and duration_s > 0:
        out["mean_running"] = inference / duration_s
    return out


DRAWN = (("output_stdev", "tokens"), ("think_s", "seconds"), ("think_stdev_s", "seconds"))
"""The trial parameters that say what each user drew per request (the calibration sweep records them)."""


def _param(path: Path, trial: str, params: Mapping[str, object], key: str, unit: str) -> float:
    """A drawn quantity's parameter (0 where the trial has none); raises for one that is not a number >= 0."""
    value = params.get(key, 0.0)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise CalibrationInputError(f"{path}: trial {trial}: {key!r} is {value!r}, not a number of {unit} >= 0")
    return float(value)


def _stat(trial_figures: dict[str, object], key: str) -> float | None:
    stat = trial_figures.get(key)
    mean = getattr(stat, "mean", None)
    return float(mean) if isinstance(mean, int | float) else None


def read_stages(path: Path) -> list[Stage]:
    """The stages of one experiment result; raises :class:`CalibrationInputError` for a file that is not one,
    one without finished trials, or a trial that is not a closed-loop stage (no ``users`` parameter)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CalibrationInputError(f"{path}: no such file") from None
    except (OSError, ValueError) as err:
        raise CalibrationInputError(f"{path}: not valid JSON ({err})") from None
    if isinstance(doc, dict) and "trials" not in doc and "stages" in doc:
        raise CalibrationInputError(
            f"{path}: a benchmark_result.json; calibrate reads an experiment_result.json "
            "(loadlens experiment calibration-sweep), whose runs carry the server's counters"
        )
    try:
        result = ExperimentResult.model_validate(doc)
    except ValueError as err:
        first = str(err).splitlines()[0]
        raise CalibrationInputError(f"{path}: not an experiment_result.json ({first})") from None
    stages: list[Stage] = []
    for trial in result.trials:
        runs = [r for r in trial.runs if r.error is None and r.completed]
        if trial.status != "done" or not runs:
            continue
        users = trial.params.get("users")
        if not isinstance(users, int | float):
            raise CalibrationInputError(
                f"{path}: trial {trial.name} has no 'users' parameter (not a closed-loop stage)"
            )
        spread, think, think_stdev = (_param(path, trial.name, trial.params, key, unit) for key, unit in DRAWN)
        figs: dict[str, float] = {}
        for key in CLIENT_FIGURES:
            value = _stat(dict(trial.figures), key)
            if value is not None:
                figs[key] = value
        counters: dict[str, float] = {}
        for run in runs:
            for name, value in run.server.engine_counters.items():
                counters[name] = counters.get(name, 0.0) + value
        stated = [
            KvCapacity(r.server.kv_cache_blocks, r.server.kv_cache_block_size)
            for r in runs
            if r.server.kv_cache_blocks is not None and r.server.kv_cache_block_size is not None
        ]
        completed = int(sum(r.figures.get("completed") or 0 for r in runs))
        prompt = sum(r.figures.get("total_input_tokens") or 0 for r in runs)
        output = sum(r.figures.get("total_output_tokens") or 0 for r in runs)
        duration = sum(r.figures.get("duration") or 0 for r in runs)
        stages.append(
            Stage(
                name=trial.name,
                users=int(users),
                prompt_tokens=prompt / completed if completed else 0.0,
                output_tokens=output / completed if completed else 0.0,
                duration_s=duration / len(runs),
                completed=completed,
                figures=figs,
                counters=counters,
                kv_capacity=stated[-1] if stated else None,
                runs=len(runs),
                output_stdev=spread,
                think_time=Clamped(think, think_stdev),
                windows=tuple((r.start_timestamp, r.end_timestamp) for r in runs),
                lead_in=read_lead_in(path.parent, [r.result_path for r in runs]),
            )
        )
    if not stages:
        raise CalibrationInputError(f"{path}: no finished stage (no trial with a completed run)")
    return stages


def check_usable(stages: list[Stage]) -> None:
    """Every stage has server series and enough requests; raises :class:`CalibrationInputError`."""
    for s in stages:
        if s.completed < MIN_REQUESTS:
            raise CalibrationInputError(
                f"stage {s.name}: {s.completed} completed requests, too few (at least {MIN_REQUESTS})"
            )
        if s.server_mean("vllm:inter_token_latency_seconds") is None or (
            s.server_mean("vllm:request_prefill_time_seconds") is None
        ):
            raise CalibrationInputError(
                f"stage {s.name}: no server series (vllm:inter_token_latency_seconds and "
                "vllm:request_prefill_time_seconds increases); run the sweep against a server exporting vLLM's /metrics"
            )
        if s.output_tokens < 2:
            raise CalibrationInputError(f"stage {s.name}: fewer than 2 output tokens per request (no decode steps)")
