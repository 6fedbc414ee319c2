"""The step-time fit of ``loadlens calibrate`` (docs/calibration.md, *Method*).

The model of one engine step is the sim's own (docs/sim-engine.md §2), with one fixed cost per step:

    t = step_overhead + per_seq · seqs + max(s_per_flop · FLOPs, s_per_byte · bytes) + insertion · admits

FLOPs and bytes are the roofline's for the model profile (2·P per token, the LM head per sampled row,
attention pairs; the weights streamed once per step plus K and V read and written). Each stage gives two
rows, both the server's own means over the stage (vLLM's histograms' ``_sum / _count``):

- the mean prefill time (scheduled → first token): the admitting steps, k prompts of P tokens beside R − k
  decodes, R the stage's mean running requests, for each group size k vLLM's ``iteration_tokens_total``
  buckets show, weighted by the prompts each admitted;
- the mean inter-token latency: the admitting steps and the decode-only step (R decodes at the mean context
  P + (N − 1)/2), weighted by the decodes each carried over the stage.

Weighted least squares on relative residuals (each row divided by its observation). The max is fitted by
regimes: each step of a row is compute-bound or memory-bound, the linear fit is solved with that assignment,
the steps are reassigned by the fitted terms and the fit repeated until nothing moves; from three starts
(every step compute-bound, decode-only steps memory-bound, every step memory-bound), keeping the fit whose
own formula leaves the smallest relative residuals; a start that ends in another regime with a residual within
``CLOSE_RESIDUAL`` of it is reported (the data do not tell the two apart). A parameter is *not
identified* when its column is constant (one with the intercept; a term no step is bound by has a column of
zeros), collinear with others (a singular value of the column-normalised design under ``COLLINEAR``), fitted
below zero, or not determined by the data (its standard error above its value); it is then fixed at 0, the
rest refitted, and reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from exporters.serving.calibrate.observations import Stage
from exporters.serving.engines.sim import roofline
from loadlens.contracts.engine_counters import bucket_counts
from loadlens.contracts.model_profile import ModelProfile

CLOSE_RESIDUAL = 1.25
"""A fit of another regime whose RMS residual is at most this times the kept one's is named as fitting nearly as
well (the regimes not told apart by the data)."""
PARAMS = ("step_overhead_s", "per_seq_s", "s_per_flop", "s_per_byte", "insertion_s")
COLLINEAR = 1e-6
"""Smallest singular value (over the largest) of the column-normalised design that counts as independent."""
MAX_REGIME_ROUNDS = 10
LOG_GAP = "log_gap_s"
"""With rows from vLLM's iteration log (iteration_log.py): the part of a step its logged elapsed time leaves out
(the engine loop's scheduling and output handling around the model's run), fitted as a constant per step so
the log's rows and the stages' own (which hold the whole step) can stand in one fit. Not a sim parameter."""


@dataclass(frozen=True, slots=True)
class StepShape:
    """One step: sequences, FLOPs, bytes moved, whether it admits (fractions allowed: means over steps)."""

    seqs: float
    flops: float
    bytes: float
    admits: float

    def features(self, memory_bound: bool) -> list[float]:
        return [1.0, self.seqs, 0.0 if memory_bound else self.flops, self.bytes if memory_bound else 0.0,
                self.admits]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Row:
    """An observable: the weighted mean of one or more steps' durations."""

    parts: tuple[tuple[float, StepShape], ...]
    logged: bool = False
    """A step as vLLM's iteration log times it: without the ``LOG_GAP`` the sim's step holds."""

    def features(self, bound: Sequence[bool], gap_column: bool = False) -> list[float]:
        total = sum(w for w, _ in self.parts)
        out = [0.0] * len(PARAMS)
        for (w, shape), memory in zip(self.parts, bound, strict=True):
            for i, f in enumerate(shape.features(memory)):
                out[i] += w / total * f
        return out + ([-1.0 if self.logged else 0.0] if gap_column else [])


def _decode_seq(model: ModelProfile, context: float) -> tuple[float, float]:
    """FLOPs and KV bytes of one decoding sequence at ``context`` cached tokens."""
    flops = (
        2.0 * roofline.linear_params(model)
        + 2.0 * roofline.lm_head_params(model)
        + 4.0 * model.layers * model.heads * model.head_dim * (context + 1)
    )
    return flops, roofline.kv_bytes_per_token(model) * (context + 1)


def _prefill(model: ModelProfile, prompt: float) -> tuple[float, float]:
    flops = (
        2.0 * roofline.linear_params(model) * prompt
        + 2.0 * roofline.lm_head_params(model)
        + 4.0 * model.layers * model.heads * model.head_dim * prompt * (prompt + 1) / 2
    )
    return flops, roofline.kv_bytes_per_token(model) * prompt


def mixed_step(model: ModelProfile, decodes: float, prefills: float, prompt: float, context: float) -> StepShape:
    df, db = _decode_seq(model, context)
    pf, pb = _prefill(model, prompt)
    weights = float(roofline.streamed_weight_bytes(model, images=False))
    admits = 1.0 if prefills > 0 else 0.0
    return StepShape(decodes + prefills, decodes * df + prefills * pf, weights + decodes * db + prefills * pb, admits)


def running(stage: Stage) -> float:
    """Mean running requests: Little's law over vLLM's inference time (its gauge, sampled every 0.25 s, read
    near 0 on the CPU rig between its short requests), else the users."""
    return stage.server_figures().get("mean_running", float(stage.users))


def admission_groups(stage: Stage) -> tuple[float, list[tuple[float, float]]]:
    """(steps, [(prompts k, admitting steps with k prompts), ...]) over the stage. Equal requests in a closed
    loop move in groups, and not in groups of one size: at 4 users the rig's admitting steps took 1, 2 or 3
    prompts, a request's prefill is the step of its group, and a mean over requests weights the large groups
    by their size, so one mean group size misprices the prefill mean. vLLM's ``iteration_tokens_total``
    buckets give the sizes: a step of k prompts of P tokens beside the other running requests' decodes
    carries k·P + (R − k) tokens, so each bucket above the smallest edge that holds a decode-only step (at
    most ``users`` tokens) names the k that fit in it. A bucket that holds several (or none) takes the prompts
    the unambiguous ones leave, per step, within its range. Where that edge does not separate the admitting
    steps (a prompt shorter than it), one prompt per admitting step is assumed."""
    steps = stage.counters.get("vllm:iteration_tokens_total_count") or 0.0
    done = stage.counters.get("vllm:request_prefill_time_seconds_count") or 0.0
    if not steps or not done:
        return steps, []
    p, users, r = stage.prompt_tokens, stage.users, running(stage)
    cumulative = bucket_counts(stage.counters)
    edges = [(edge, count) for edge, count in cumulative if edge >= users]
    if not edges or edges[0][0] >= p or steps <= edges[0][1]:
        return steps, [(1.0, done)]
    classes: list[tuple[list[int], float]] = []  # (candidate k, admitting steps in the bucket)
    lo, below = edges[0]
    for hi, count in edges[1:]:
        if count - below > 0:
            ks = [k for k in range(1, users + 1) if lo < k * p + max(r - k, 0.0) <= hi]
            classes.append((ks or list(range(1, users + 1)), count - below))
        lo, below = hi, count
    fixed = sum(ks[0] * n for ks, n in classes if len(ks) == 1)
    open_steps = sum(n for ks, n in classes if len(ks) > 1)
    per_open = (done - fixed) / open_steps if open_steps else 0.0
    groups = [(float(ks[0]) if len(ks) == 1 else min(max(per_open, ks[0]), ks[-1]), n) for ks, n in classes]
    return steps, groups


def admissions(stage: Stage) -> tuple[float, float]:
    """(prompts admitted per step, mean prompts per admitting step), from :func:`admission_groups`."""
    steps, groups = admission_groups(stage)
    if not steps or not groups:
        return 0.0, 1.0
    admitting = sum(n for _, n in groups)
    prompts = sum(k * n for k, n in groups)
    return prompts / steps, prompts / admitting


def stage_rows(model: ModelProfile, stage: Stage) -> list[tuple[str, Row, float]]:
    """(observable, row, observed seconds) of a stage. A request's prefill is the admitting step of its group
    (k prompts beside R − k decodes), the mean over requests weighting each group size by its prompts. An
    inter-token interval is one step that carried the request as a decode: the mean ITL weights each admitting
    step and the decode-only step (R decodes) by how many decodes each carried over the stage."""
    r = running(stage)
    steps, groups = admission_groups(stage)
    p, n = stage.prompt_tokens, stage.output_tokens
    context = p + (n - 1) / 2
    decoding = mixed_step(model, r, 0.0, p, context)
    admitting = [(k, count, mixed_step(model, max(r - k, 0.0), k, p, context)) for k, count in groups]
    decode_only = max(steps - sum(count for _, count, _ in admitting), 0.0)
    rows: list[tuple[str, Row, float]] = []
    itl = stage.server_mean("vllm:inter_token_latency_seconds")
    if itl is not None:
        weighted = [(count * max(r - k, 0.0), shape) for k, count, shape in admitting] + [(decode_only * r, decoding)]
        parts = tuple((w, shape) for w, shape in weighted if w > 0) or ((1.0, decoding),)
        rows.append(("mean ITL", Row(parts), itl))
    prefill = stage.server_mean("vllm:request_prefill_time_seconds")
    if prefill is not None and admitting:
        rows.append(("mean prefill", Row(tuple((k * count, shape) for k, count, shape in admitting)), prefill))
    return rows


@dataclass(slots=True)
class FitResult:
    values: dict[str, float]
    """Every parameter; those not identified are 0."""
    stderr: dict[str, float]
    not_identified: dict[str, str] = field(default_factory=dict)
    """Parameter -> why the data could not identify it."""
    rows: list[tuple[str, str, float, float]] = field(default_factory=list)
    """(stage, observable, observed s, fitted s)."""
    memory_bound_steps: int = 0
    """Steps of the rows the fitted terms make memory-bound (the rest compute-bound)."""
    starts: list[tuple[str, float, int]] = field(default_factory=list)
    """Each regime start: (its label, the RMS relative residual of the fit it converged to, that fit's
    memory-bound steps)."""

    def close_regimes(self) -> list[tuple[str, float, int]]:
        """The starts that converged to another regime (another count of memory-bound steps) whose residual is
        within ``CLOSE_RESIDUAL`` of the kept fit's: the data do not tell those regimes apart."""
        best = min(r for _, r, _ in self.starts) if self.starts else 0.0
        return [(label, r, m) for label, r, m in self.starts
                if m != self.memory_bound_steps and r <= best * CLOSE_RESIDUAL]  # fmt: skip

    def step(self, shape: StepShape) -> float:
        v = self.values
        busy = max(v["s_per_flop"] * shape.flops, v["s_per_byte"] * shape.bytes)
        return v["step_overhead_s"] + v["per_seq_s"] * shape.seqs + busy + v["insertion_s"] * shape.admits

    def predict(self, row: Row) -> float:
        total = sum(w for w, _ in row.parts)
        gap = self.values.get(LOG_GAP, 0.0) if row.logged else 0.0
        return sum(w / total * self.step(shape) for w, shape in row.parts) - gap

    def bound(self, row: Row) -> list[bool]:
        v = self.values
        return [v["s_per_byte"] * shape.bytes > v["s_per_flop"] * shape.flops for _, shape in row.parts]


def _solve(x: np.ndarray, y: np.ndarray, free: list[int]) -> tuple[np.ndarray, np.ndarray]:
    xs = x[:, free]
    coef, *_ = np.linalg.lstsq(xs, y, rcond=None)
    dof = len(y) - len(free)
    resid = y - xs @ coef
    sigma2 = float(resid @ resid) / dof if dof > 0 else float("nan")
    try:
        cov = np.linalg.inv(xs.T @ xs) * sigma2
        se = np.sqrt(np.abs(np.diag(cov)))
    except np.linalg.LinAlgError:
        se = np.full(len(free), float("inf"))
    return coef, se


def _settled_residual(x: np.ndarray, y: np.ndarray, free: tuple[int, ...]) -> float:
    """The residual sum of squares of the fit on the ``free`` columns once every coefficient below zero has gone,
    choosing at each step the removal that ends best (at most a few hundred solves for six parameters)."""
    if not free:
        return float(y @ y)
    coef, *_ = np.linalg.lstsq(x[:, list(free)], y, rcond=None)
    negative = [k for k, c in enumerate(coef) if c < 0]
    if not negative:
        resid = y - x[:, list(free)] @ coef
        return float(resid @ resid)
    return min(_settled_residual(x, y, free[:k] + free[k + 1 :]) for k in negative)


def linear_fit(
    x: np.ndarray,
    y: np.ndarray,
    fixed: Sequence[str],
    say: Callable[[str], None],
    names: Sequence[str] = PARAMS,
    zero_column: str = "no step of the data is bound by this term (its column is 0)",
) -> FitResult:
    """The identification rounds on one design whose rows are divided by their weights (column 0, the fixed
    cost ``names[0]``, is 1 / weight), ``y`` the weighted observations. Every parameter, the fixed cost too,
    must be at least 0."""
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xn = x / scale
    why: dict[str, str] = {p: "held at 0 (--fix)" for p in fixed}
    free = [i for i, p in enumerate(names) if p not in why]
    for i in [i for i in free if i != 0]:
        col = x[:, i] / x[:, 0]  # the rows' own values (column 0 is 1 / weight)
        if not col.any():
            why[names[i]] = zero_column
            free.remove(i)
        elif 0 in free and np.allclose(col, col[0], rtol=1e-9, atol=0.0):
            why[names[i]] = f"its column is constant ({col[0]:.4g} in every row): one with {names[0]}"
            free.remove(i)
    rounds = 0
    while free:
        rounds += 1
        say(f"calibrate: fit round {rounds}: {len(free)} parameters, {len(y)} rows")
        if len(free) >= len(y) and len(free) > 1:
            # No residual left to judge a parameter by: the last one goes until there is (the fixed cost last).
            drop = max(free)
            why[names[drop]] = f"not determined by the data ({len(y)} rows for {len(free)} parameters)"
            free.remove(drop)
            continue
        _, s, vt = np.linalg.svd(xn[:, free], full_matrices=False)
        if s[-1] < COLLINEAR * s[0]:
            weakest = np.abs(vt[-1]) * (np.array(free) != 0)
            drop = free[int(np.argmax(weakest))]
            along = [names[free[j]] for j in np.argsort(-np.abs(vt[-1])) if abs(vt[-1][j]) > 0.1]
            why[names[drop]] = f"collinear with {', '.join(n for n in along if n != names[drop]) or 'the rest'}"
            free.remove(drop)
            continue
        coef, se = _solve(xn, y, free)
        negative = [j for j, c in enumerate(coef) if c < 0]
        if negative:
            # Near-collinear columns can push several below zero at once, the most negative not always the one
            # to go: the one goes whose removal ends (once the rest are at least 0) with the smallest residual.
            j = min(negative, key=lambda k: (_settled_residual(xn, y, tuple(free[:k] + free[k + 1 :])), k))
            why[names[free[j]]] = f"fitted below zero ({coef[j] / scale[free[j]]:.3g}): set to 0"
            free.pop(j)
            continue
        loose = [(se[j] / c, j) for j, c in enumerate(coef) if free[j] != 0 and c > 0 and se[j] > c]
        if loose:
            _, j = max(loose)
            value, err = coef[j] / scale[free[j]], se[j] / scale[free[j]]
            why[names[free[j]]] = f"not determined by the data ({value:.3g} ± {err:.3g})"
            free.pop(j)
            continue
        break
    values = dict.fromkeys(names, 0.0)
    stderr = dict.fromkeys(names, 0.0)
    if free:
        coef, se = _solve(xn, y, free)
        for j, i in enumerate(free):
            values[names[i]] = float(coef[j] / scale[i])
            stderr[names[i]] = float(se[j] / scale[i])
    return FitResult(values, stderr, {p: why[p] for p in names if p in why})


def fit(
    model: ModelProfile,
    stages: Sequence[Stage],
    fixed: Sequence[str] = (),
    say: Callable[[str], None] = lambda _: None,
    extra: Sequence[tuple[str, str, Row, float]] = (),
) -> FitResult:
    """Least squares over the stages' rows in the sim's formula; ``fixed`` parameters are held at 0. ``extra``:
    more (stage, observable, row, observed seconds), as vLLM's iteration log gives (iteration_log.py)."""
    labelled = [(s.name, obs, row, y) for s in stages for obs, row, y in stage_rows(model, s)] + list(extra)
    y = np.array([obs for *_, obs in labelled], dtype=float)
    rows = [row for _, _, row, _ in labelled]
    gap = any(r.logged for r in rows)
    names = (*PARAMS, LOG_GAP) if gap else PARAMS
    starts = {
        "every step compute-bound": [[False] * len(r.parts) for r in rows],
        "decode-only steps memory-bound": [[shape.admits == 0 for _, shape in r.parts] for r in rows],
        "every step memory-bound": [[True] * len(r.parts) for r in rows],
    }
    best: tuple[float, FitResult] | None = None
    tried: list[tuple[str, float, int]] = []
    for label, bound in starts.items():
        seen: list[list[list[bool]]] = []
        for regime_round in range(1, MAX_REGIME_ROUNDS + 1):
            if bound in seen:
                break
            seen.append(bound)
            say(f"calibrate: start '{label}', regime round {regime_round}: {sum(map(sum, bound))} memory-bound steps")
            x = np.array([r.features(b, gap) for r, b in zip(rows, bound, strict=True)])
            result = linear_fit(x / y[:, None], np.ones(len(y)), fixed, say, names)
            bound = [result.bound(r) for r in rows]
        residual = sum((result.predict(r) / yv - 1) ** 2 for r, yv in zip(rows, y, strict=True))
        tried.append((label, (residual / len(rows)) ** 0.5, sum(map(sum, (result.bound(r) for r in rows)))))
        if best is None or residual < best[0] - 1e-12:
            best = (residual, result)
    assert best is not None
    result = best[1]
    result.memory_bound_steps = sum(map(sum, (result.bound(r) for r in rows)))
    result.starts = tried
    result.rows = [(name, obs, yv, result.predict(row)) for name, obs, row, yv in labelled]
    return result
