"""slo-search: the highest load level (users or rate, a profile variable) that passes, found by bracketing
then bisection; each level runs ``repeats`` times and passes when most repeats pass.

A repeat passes when its goodput ratio (``overall.goodput_ratio``: requests meeting every SLO of their
class ÷ completed) is at least the target and, with ``every_slo``, its verdict passes (every SLO check of
every stage). A repeat below ``oversaturated_goodput`` is over-saturated: its level fails at once, without
the remaining repeats.

Bracketing from ``start``: double while the level passes (up to ``max``), halve while it fails (down to
``min``); then bisect between the highest passing and the lowest failing level until they are within
``tolerance`` (relative; adjacent integers for integer levels). The plan is a pure function of the
outcomes, so ``--resume`` replays it, reusing every level already measured.

Usage::

    levels = plan_next(search, outcomes)   # None: done
"""

from __future__ import annotations

import math
import time

from loadlens.contracts.experiment_result import ExperimentResult, Trial, TrialRun
from loadlens.experiment.figures import aggregate
from loadlens.experiment.models import Search, level_trial, search_value
from loadlens.experiment.runner import ExperimentRunner, Interrupted, _duration, _now
from loadlens.experiment.servers import ServerError


def repeat_passes(search: Search, figures: dict[str, float | None], verdict: str | None) -> bool:
    ratio = figures.get("goodput_ratio")
    if ratio is None or ratio < search.goodput_target:
        return False
    return not search.every_slo or verdict == "pass"


def oversaturated(search: Search, figures: dict[str, float | None]) -> bool:
    ratio = figures.get("goodput_ratio")
    return ratio is None or ratio < search.oversaturated_goodput


def level_outcome(search: Search, runs: list[TrialRun], repeats: int) -> bool | None:
    """Whether a level passes given its measured runs (in order), or None while runs are missing.

    Over-saturated in any run: fails. Else the first ``repeats`` runs decide by majority; a level they fail is
    confirmed by up to ``search.confirm_failures`` more runs, and passes if any of those passes.
    """
    runs = [r for r in runs if r.error is None]
    if any(oversaturated(search, r.figures) for r in runs):
        return False
    if len(runs) < repeats:
        return None
    first = [repeat_passes(search, r.figures, r.verdict_status) for r in runs[:repeats]]
    if sum(first) * 2 > len(first):
        return True
    extra = runs[repeats:]
    if any(repeat_passes(search, r.figures, r.verdict_status) for r in extra):
        return True
    return None if len(extra) < search.confirm_failures else False


def plan_next(search: Search, outcomes: dict[float, bool]) -> float | None:
    """The next level to measure given the outcomes so far (level -> passed), or None when the search is
    done."""
    if not outcomes:
        return float(search_value(search, search.start))
    passed = [lv for lv, ok in outcomes.items() if ok]
    failed = [lv for lv, ok in outcomes.items() if not ok]
    lo = max(passed) if passed else None
    hi = min((f for f in failed if lo is None or f > lo), default=None)
    if hi is None:  # everything passed so far: grow
        assert lo is not None
        if lo >= search.max:
            return None
        return float(search_value(search, min(lo * 2, search.max)))
    if lo is None:  # everything failed: shrink
        if hi <= search.min:
            return None
        return float(search_value(search, max(hi / 2, search.min)))
    if search.integer and hi - lo <= 1:
        return None
    if not search.integer and (hi - lo) / lo <= search.tolerance:
        return None
    mid = float(search_value(search, (lo + hi) / 2))
    if mid in outcomes or mid <= lo or mid >= hi:
        return None
    return mid


class SearchRunner(ExperimentRunner):
    """Runs the levels :func:`plan_next` asks for; ``self.trials`` grows as the search goes."""

    def same_trials(self, old: ExperimentResult) -> bool:
        return True  # the trials are the levels measured so far; the plan replays them

    def _search(self) -> Search:
        assert self.exp.spec.search is not None
        return self.exp.spec.search

    def _level(self, trial: Trial) -> float:
        return float(trial.params[self._search().var])  # type: ignore[arg-type]

    def _outcome(self, trial: Trial) -> bool | None:
        """Passed (most repeats passed), failed, or None while repeats are missing."""
        return level_outcome(self._search(), trial.runs, self.opts.repeats)

    def _eta(self, outcomes: dict[float, bool], level: float, repeat: int, run_times: list[float]) -> str:
        """Runs left × the mean run so far, once the bracket is known (levels to bisect: log2 of its width);
        while bracketing the count of levels is not known."""
        search = self._search()
        passed = [lv for lv, ok in outcomes.items() if ok]
        lo = max(passed) if passed else None
        hi = min((lv for lv, ok in outcomes.items() if not ok and (lo is None or lv > lo)), default=None)
        if lo is None or hi is None or not run_times:
            return "unknown while bracketing"
        width = (hi - lo) if search.integer else math.log2(max((hi - lo) / lo / search.tolerance, 1.0)) + 1
        levels = max(1, math.ceil(math.log2(width))) if search.integer and width > 1 else max(1, math.ceil(width))
        runs = levels * self.opts.repeats - (repeat - 1)
        return _duration(runs * sum(run_times) / len(run_times))

    def run(self) -> ExperimentResult:
        self.result = self.result or self._fresh()
        self.result.trials = [t for t in self.result.trials if t.status != "pending" or t.runs]
        self.result.interrupted = False
        self.result.end_time = None
        search = self._search()
        started = time.monotonic()
        run_times: list[float] = []
        self.write()
        try:
            while True:
                outcomes = {self._level(t): ok for t in self.result.trials if (ok := self._outcome(t)) is not None}
                level = plan_next(search, outcomes)
                if level is None:
                    break
                record = next((t for t in self.result.trials if self._level(t) == level), None)
                planned = level_trial(self.exp, level, record.index if record else len(self.result.trials))
                if record is None:
                    record = Trial(index=planned.index, name=planned.name, params=dict(planned.params),
                                   knobs=dict(planned.knobs), profile=planned.profile,
                                   adapters=list(planned.adapters))  # fmt: skip
                    self.result.trials.append(record)
                    self.trials.append(planned)
                self.write_profile(planned)
                done = {r.repeat for r in record.runs if r.error is None}
                record.runs = [r for r in record.runs if r.error is None]
                for repeat in range(1, self.opts.repeats + search.confirm_failures + 1):
                    if repeat > self.opts.repeats and self._outcome(record) is not None:
                        break  # passed, or its failure is confirmed
                    if repeat in done:
                        continue
                    which = (
                        f"repeat {repeat}/{self.opts.repeats}"
                        if repeat <= self.opts.repeats
                        else f"confirming a failure {repeat - self.opts.repeats}/{search.confirm_failures}"
                    )
                    self.say(
                        f"experiment {self.exp.spec.name}: {search.var}={search_value(search, level)} ({planned.name})"
                        f" {which}, {len(outcomes)} levels measured; elapsed"
                        f" {_duration(time.monotonic() - started)}, ETA {self._eta(outcomes, level, repeat, run_times)}"
                    )
                    t0 = time.monotonic()
                    try:
                        run = self.prepared_run(planned, record, repeat)
                    except ServerError as err:
                        record.status, record.error = "failed", str(err)
                        self.write()
                        raise SearchFailed(str(err)) from err
                    run_times.append(time.monotonic() - t0)
                    record.runs.append(run)
                    record.figures = aggregate(record.runs)
                    if run.error is not None:
                        record.status, record.error = "failed", run.error
                        self.write()
                        raise SearchFailed(f"level {planned.name}: {run.error}")
                    self.write()
                    if oversaturated(search, run.figures):
                        self.say(f"experiment {self.exp.spec.name}: {planned.name} is over-saturated; no more repeats")
                        break
                record.status, record.error = "done", None
                self.write()
        except (Interrupted, KeyboardInterrupt):  # Ctrl-C outside a load too (a server starting, a PATCH)
            self.result.interrupted = True
            self.result.end_time = _now()
            self.write()
            raise Interrupted from None
        self.result.completed = True
        self.result.end_time = _now()
        self.result = self.analyse(self.result)
        self.write()
        return self.result


class SearchFailed(RuntimeError):
    """A level's run failed (no results, the server went away): the search cannot go on."""


def outcome_of(search: Search, trial: Trial, repeats: int) -> tuple[int, int]:
    """(passing repeats, measured repeats) of a level."""
    runs = [r for r in trial.runs if r.error is None]
    return sum(repeat_passes(search, r.figures, r.verdict_status) for r in runs), len(runs)
