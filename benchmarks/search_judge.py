"""The judgement behind ``benchmarks/search_compare.py``: the workload and objectives it compares the searches
under, a search's outcome, the server-side judgement of a run from the sim's request log, the ground truth's
capacity and band, how an answer stands to it, and the printed report. Pure: no process is started here
(tests/benchmarks/test_search_compare.py).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TOOLS = ("loadlens", "aiperf", "guidellm")


@dataclass(frozen=True)
class Workload:
    """The sim and the request shape, read from the packaged slo-search experiment."""

    model_profile: str
    gpu_profile: str
    speed: float
    prompt_mean: int
    prompt_stdev: int
    prompt_min: int
    prompt_max: int
    output_tokens: int
    warmup_s: float
    measure_s: float


@dataclass(frozen=True)
class Objectives:
    """The SLO file's interactive class, goodput bound and error budget."""

    ttft_ms: float
    itl_ms: float
    e2e_ms: float
    ratio: float
    goodput_min: float
    error_max: float

    def percentile(self) -> str:
        return f"p{self.ratio * 100:g}"


@dataclass
class Outcome:
    tool: str
    answer: float | None = None
    next_failing: float | None = None
    uncertainty: str = ""
    levels: list[tuple[float, bool]] = field(default_factory=list)
    trials: int = 0
    requests: int = 0
    wall_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class Served:
    """One generation request as the sim's request log has it."""

    end: float
    status: int
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None

    @property
    def start(self) -> float:
        return self.end - (self.e2e_ms or 0.0) / 1000.0


# --- judging a run, the truth and an answer ---------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 1]."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def parse_served(lines: Sequence[str]) -> list[Served]:
    """The request lines of ``loadlens serve --log-format json`` (other lines skipped)."""
    out = []
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if doc.get("msg") != "request":
            continue
        ts = datetime.fromisoformat(str(doc["ts"]).replace("Z", "+00:00")).timestamp()
        out.append(Served(ts, int(doc.get("status") or 0), doc.get("ttft_ms"), doc.get("tpot_ms"), doc.get("e2e_ms")))
    return out


def judge_served(requests: Sequence[Served], obj: Objectives) -> dict[str, Any]:
    """A run judged from the server's side: p99 TTFT/TPOT/E2E against the thresholds, the share of requests
    meeting all three (goodput ratio) against the goodput bound, the error ratio against the error budget."""
    ok = [r for r in requests if r.status == 200 and r.ttft_ms is not None and r.e2e_ms is not None]
    failed = sum(1 for r in requests if r.status >= 500)
    if not ok:
        return {"n": 0, "passes": False}
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    good = sum(
        1
        for r in ok
        if (r.ttft_ms or 0.0) <= obj.ttft_ms and (r.tpot_ms or 0.0) <= obj.itl_ms and (r.e2e_ms or 0.0) <= obj.e2e_ms
    )
    row: dict[str, Any] = {
        "n": len(ok),
        "ttft_p99": percentile(ttft, obj.ratio),
        "tpot_p99": percentile(tpot, obj.ratio) if tpot else 0.0,
        "e2e_p99": percentile(e2e, obj.ratio),
        "goodput_ratio": good / len(ok),
        "error_ratio": failed / (len(ok) + failed),
    }
    row["passes"] = (
        row["ttft_p99"] <= obj.ttft_ms
        and row["tpot_p99"] <= obj.itl_ms
        and row["e2e_p99"] <= obj.e2e_ms
        and row["goodput_ratio"] >= obj.goodput_min
        and row["error_ratio"] <= obj.error_max
    )
    return row


def capacity(passes: dict[int, list[bool]]) -> tuple[int | None, list[int]]:
    """The highest level whose runs mostly pass with every lower measured level mostly passing, and the band:
    the levels whose runs disagree."""
    best: int | None = None
    for level in sorted(passes):
        runs = passes[level]
        if sum(runs) * 2 > len(runs):
            best = level
        else:
            break
    band = [lv for lv in sorted(passes) if 0 < sum(passes[lv]) < len(passes[lv])]
    return best, band


def agreement(answer: float | None, truth: int | None, band: Sequence[int], censored: bool = False) -> str:
    """How an answer stands to the truth: ``same``, ``in band`` (the levels whose runs disagree, or just below
    them), or the difference; with ``censored`` (the truth's highest level passed) an answer below it is at
    least that far off."""
    if answer is None or truth is None:
        return "-"
    if censored and answer < truth:
        return f"<={answer - truth:+g}"
    if int(answer) == truth:
        return "same"
    if int(answer) in band or (band and min(band) - 1 <= answer <= max(band)):
        return "in band"
    return f"{answer - truth:+g}"


def bracket(levels: Sequence[tuple[float, bool]]) -> tuple[float | None, float | None]:
    """(highest passing level below the lowest failing one, that failing level) from a search's outcomes."""
    failing = [lv for lv, ok in levels if not ok]
    passing = [lv for lv, ok in levels if ok]
    hi = min(failing) if failing else None
    below = [lv for lv in passing if hi is None or lv < hi]
    return (max(below) if below else None), hi


# --- the report --------------------------------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(x: float | None, spec: str = "g") -> str:
    return "-" if x is None else format(x, spec)


def report(
    rounds: list[list[Outcome]], truth: list[dict[str, Any]], obj: Objectives, work: Workload, truth_s: float
) -> None:
    by_tool: dict[str, list[Outcome]] = {}
    for outcomes in rounds:
        for o in outcomes:
            by_tool.setdefault(o.tool, []).append(o)
    passes: dict[int, list[bool]] = {}
    censored = False
    for row in truth:
        passes.setdefault(int(row["level"]), []).append(bool(row["passes"]))
    true_cap, band = capacity(passes)
    if truth:
        print(f"\nground truth (server-side, {len(truth) // max(1, len(passes))} x {truth_s:g} s per level):")
        print(f"  {'level':>5} {'runs':>4} {'pass':>4} {'TTFT p99 ms':>12} {'TPOT p99 ms':>12} {'goodput':>8} "
              f"{'client verdicts':>16}")  # fmt: skip
        for level in sorted(passes):
            rows = [r for r in truth if r["level"] == level]
            print(f"  {level:>5} {len(rows):>4} {sum(passes[level]):>4} "
                  f"{statistics.median(r.get('ttft_p99', math.nan) for r in rows):>12.1f} "
                  f"{statistics.median(r.get('tpot_p99', math.nan) for r in rows):>12.1f} "
                  f"{statistics.median(r.get('goodput_ratio', 0.0) for r in rows):>8.3f} "
                  f"{'/'.join(r['client_verdict'] for r in rows):>16}")  # fmt: skip
        censored = true_cap is not None and true_cap == max(passes)
        print(f"  capacity {'at least ' if censored else ''}{true_cap} users; runs disagree at {band or 'no level'}")
    print(f"\nSLO search, {len(rounds)} round(s), medians: {work.model_profile}@{work.gpu_profile} --speed "
          f"{work.speed:g}; trials warm ~{work.warmup_s:g} s and measure {work.measure_s:g} s; "
          f"TTFT/ITL/E2E {obj.percentile()} <= {obj.ttft_ms:g}/{obj.itl_ms:g}/{obj.e2e_ms:g} ms, goodput >= "
          f"{obj.goodput_min:g}")  # fmt: skip
    head = f"  {'procedure':<9} {'answer':>6} {'fails at':>8} {'vs truth':>8} {'trials':>6} {'requests':>8} " \
           f"{'wall s':>7} {'x trials':>8} {'x wall':>7}  uncertainty"  # fmt: skip
    print(head)
    base = [o for o in by_tool.get("loadlens", []) if o.error is None]
    base_trials = _median([o.trials for o in base]) if base else None
    base_wall = _median([o.wall_s for o in base]) if base else None
    for tool in TOOLS:
        outs = by_tool.get(tool)
        if not outs:
            continue
        ok = [o for o in outs if o.error is None]
        if not ok:
            print(f"  {tool:<9} failed: {outs[0].error}")
            continue
        answer = _median([o.answer for o in ok])
        trials = _median([o.trials for o in ok])
        wall = _median([o.wall_s for o in ok])
        answers = ",".join(_fmt(o.answer) for o in ok)
        print(f"  {tool:<9} {_fmt(answer):>6} {_fmt(_median([o.next_failing for o in ok])):>8} "
              f"{agreement(answer, true_cap, band, censored):>8} {_fmt(trials):>6} "
              f"{_fmt(_median([o.requests for o in ok]), '.0f'):>8} {_fmt(wall, '.0f'):>7} "
              f"{_fmt(trials / base_trials if trials and base_trials else None, '.2f'):>8} "
              f"{_fmt(wall / base_wall if wall and base_wall else None, '.2f'):>7}  "
              f"{ok[-1].uncertainty}" + (f" (answers {answers})" if len(ok) > 1 else ""))  # fmt: skip
