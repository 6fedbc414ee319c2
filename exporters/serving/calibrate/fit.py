"""The step-time fit of ``loadlens calibrate`` (docs/calibration.md, *Method*).

Model of one engine step, in the sim's own terms (docs/sim-engine.md §2), summed rather than max'ed:

    t = step_overhead + per_seq · seqs + s_per_flop · FLOPs + s_per_kv_byte · KV bytes + insertion · admits

FLOPs and KV bytes are the roofline's for the model profile (2·P per token, the LM head per sampled row,
attention pairs; K and V read and written). Each stage gives two rows, both the server's own means over the
stage (vLLM's histograms' ``_sum / _count``):

- the mean inter-token latency: the step a decoding request sees on average, with the stage's mean running
  requests R, of which a (admissions per step = requests / steps) are prefilling a prompt of P tokens, the
  rest decoding at the mean context P + (N − 1)/2;
- the mean prefill time (scheduled → first token): the step that admits one prompt beside R − 1 decodes.

Weighted least squares on relative residuals (each row divided by its observation). A parameter is *not
identified* when its column is constant (then it is one with the intercept), collinear with others (a
singular value of the column-normalised design under ``COLLINEAR``), fitted below zero, or not determined by
the data (its standard error above its value); it is then fixed at 0, the rest refitted, and reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from exporters.serving.calibrate.observations import Stage
from exporters.serving.engines.sim import roofline
from loadlens.contracts.model_profile import ModelProfile

PARAMS = ("step_overhead_s", "per_seq_s", "s_per_flop", "s_per_kv_byte", "insertion_s")
COLLINEAR = 1e-6
"""Smallest singular value (over the largest) of the column-normalised design that counts as independent."""


@dataclass(frozen=True, slots=True)
class StepShape:
    """One (mean) step: sequences, FLOPs, KV bytes, admissions (fractions allowed: means over steps)."""

    seqs: float
    flops: float
    kv_bytes: float
    admits: float

    def row(self) -> list[float]:
        return [1.0, self.seqs, self.flops, self.kv_bytes, self.admits]


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
    return StepShape(decodes + prefills, decodes * df + prefills * pf, decodes * db + prefills * pb, min(prefills, 1.0))


def running(stage: Stage) -> float:
    """Mean running requests: Little's law over vLLM's inference time (its gauge, sampled every 0.25 s, read
    near 0 on the CPU rig between its short requests), else the users."""
    return stage.server_figures().get("mean_running", float(stage.users))


def admissions_per_step(stage: Stage) -> float:
    steps = stage.counters.get("vllm:iteration_tokens_total_count") or 0.0
    done = stage.counters.get("vllm:request_prefill_time_seconds_count") or 0.0
    return min(1.0, done / steps) if steps else 0.0


def stage_rows(model: ModelProfile, stage: Stage) -> list[tuple[str, StepShape, float]]:
    """(observable, step shape, observed seconds) of a stage."""
    r, a = running(stage), admissions_per_step(stage)
    p, n = stage.prompt_tokens, stage.output_tokens
    context = p + (n - 1) / 2
    rows: list[tuple[str, StepShape, float]] = []
    itl = stage.server_mean("vllm:inter_token_latency_seconds")
    if itl is not None:
        rows.append(("mean ITL", mixed_step(model, max(r - a, 0.0), a, p, context), itl))
    prefill = stage.server_mean("vllm:request_prefill_time_seconds")
    if prefill is not None:
        rows.append(("mean prefill", mixed_step(model, max(r - 1.0, 0.0), 1.0, p, context), prefill))
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

    def predict(self, shape: StepShape) -> float:
        return float(np.dot(shape.row(), [self.values[p] for p in PARAMS]))


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


def fit(
    model: ModelProfile,
    stages: Sequence[Stage],
    fixed: Sequence[str] = (),
    say: Callable[[str], None] = lambda _: None,
) -> FitResult:
    """Least squares over the stages' rows; ``fixed`` parameters are held at 0 (not fitted)."""
    labelled = [(s.name, obs, shape, y) for s in stages for obs, shape, y in stage_rows(model, s)]
    x = np.array([shape.row() for _, _, shape, _ in labelled], dtype=float)
    y = np.array([obs for *_, obs in labelled], dtype=float)
    weights = 1.0 / y
    xw, yw = x * weights[:, None], y * weights
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    xn = xw / scale
    why: dict[str, str] = {p: "held at 0 (--fix)" for p in fixed}
    free = [i for i, p in enumerate(PARAMS) if p not in why]
    for i in list(free[1:]):
        col = x[:, i]
        if np.allclose(col, col[0]):
            why[PARAMS[i]] = f"its column is constant ({col[0]:.4g} in every row): one with step_overhead_s"
            free.remove(i)
    rounds = 0
    while free:
        rounds += 1
        say(f"calibrate: fit round {rounds}: {len(free)} parameters, {len(y)} rows")
        sv = np.linalg.svd(xn[:, free], compute_uv=True, full_matrices=False)
        s, vt = sv[1], sv[2]
        if s[-1] < COLLINEAR * s[0]:
            weakest = vt[-1]
            names = [PARAMS[free[j]] for j in np.argsort(-np.abs(weakest)) if abs(weakest[j]) > 0.1]
            drop = free[int(np.argmax(np.abs(weakest) * (np.array(free) != 0)))]
            why[PARAMS[drop]] = f"collinear with {', '.join(n for n in names if n != PARAMS[drop]) or 'the rest'}"
            free.remove(drop)
            continue
        coef, se = _solve(xn, yw, free)
        negative = [(c, j) for j, c in enumerate(coef) if c < 0 and free[j] != 0]
        if negative:
            _, j = min(negative)
            why[PARAMS[free[j]]] = f"fitted below zero ({coef[j] / scale[free[j]]:.3g}): set to 0"
            free.pop(j)
            continue
        loose = [(se[j] / c, j) for j, c in enumerate(coef) if free[j] != 0 and c > 0 and se[j] > c]
        if loose:
            ratio, j = max(loose)
            value = coef[j] / scale[free[j]]
            why[PARAMS[free[j]]] = f"not determined by the data ({value:.3g} ± {se[j] / scale[free[j]]:.3g})"
            free.pop(j)
            continue
        break
    values = dict.fromkeys(PARAMS, 0.0)
    stderr = dict.fromkeys(PARAMS, 0.0)
    if free:
        coef, se = _solve(xn, yw, free)
        for j, i in enumerate(free):
            values[PARAMS[i]] = float(coef[j] / scale[i])
            stderr[PARAMS[i]] = float(se[j] / scale[i])
    result = FitResult(values, stderr, {p: why[p] for p in PARAMS if p in why})
    result.rows = [(name, obs, yv, result.predict(shape)) for name, obs, shape, yv in labelled]
    return result


def client_overhead_s(stages: Sequence[Stage]) -> float | None:
    """Mean over stages of the client's mean E2E minus vLLM's mean E2E: the time a request spends outside
    vLLM's own measure (HTTP, the API server before its arrival stamp, delivery to the client, the client's
    turnaround); None without data."""
    gaps = []
    for s in stages:
        server = s.server_mean("vllm:e2e_request_latency_seconds")
        client = s.figures.get("mean_e2el_ms")
        if server is not None and client:
            gaps.append(client / 1000 - server)
    return sum(gaps) / len(gaps) if gaps else None
