"""``loadlens calibrate RUN... --model-profile M --profile OUT.yaml [--hold-out STAGE...]``: fits the sim's
step-time parameters to a real server's calibration sweep, writes a sim GPU profile, replays every stage on
the sim with it and prints each stage's error, fit and held-out (docs/calibration.md).

Usage::

    loadlens experiment calibration-sweep --host http://127.0.0.1:8000 --run-id sweep
    loadlens calibrate results/experiments/sweep --model-profile my-model.yaml --profile fitted.yaml \\
        --hold-out c4-p128 p192-c2
    loadlens serve --engine sim --model-profile my-model.yaml --gpu-profile fitted.yaml
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

from exporters.serving.calibrate import decode_offsets, step_drift, step_spread
from exporters.serving.calibrate.benchmark_runs import is_benchmark_result, read_benchmark_stages
from exporters.serving.calibrate.client_overhead import ClientOverhead, Line, fit_client_overhead
from exporters.serving.calibrate.delivery_noise import DeliveryNoise, fit_delivery_noise
from exporters.serving.calibrate.fit import LOG_GAP, PARAMS, FitResult, fit
from exporters.serving.calibrate.frontend_fit import FRONTEND_PARAMS, SPLIT, FrontendFit, fit_frontend_replayed
from exporters.serving.calibrate.iteration_log import LEAST, iteration_rows, read_steps
from exporters.serving.calibrate.kv import kv_decision
from exporters.serving.calibrate.observations import (
    CalibrationInputError,
    Stage,
    check_usable,
    prefix_cache_warnings,
    read_stages,
)
from exporters.serving.calibrate.profile_out import write_profile
from exporters.serving.calibrate.ranks import PERCENTILES, percentile_ranks
from exporters.serving.calibrate.replay import replay_runs, stage_load
from exporters.serving.engines.sim.knob_plan import startup_knobs
from loadlens.contracts.experiment_result import EXPERIMENT_FILE
from loadlens.contracts.gpu_profile import GPUProfile, load_gpu_profile
from loadlens.contracts.model_profile import load_model_profile
from loadlens.contracts.profile_schema import ProfileError
from loadlens.util.cliutil import UsageError

REPLAY_REQUESTS = 3000
"""Requests the replays of a stage complete by default, so that its percentiles are the sim's expectation, not
one short run's draw: the sim's TTFT P99 of the CPU rig's 4-user stage (3 runs of about 30 requests) scattered
330-436 ms between groups of 3 seeds."""
MAX_REPLAYS = 24
"""At most this many replays by default (a stage of 125 requests a run gets 24)."""

VIEWS: dict[str, list[tuple[str, str]]] = {
    "client": [("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"), ("median_itl_ms", "ITL p50"),
               ("p99_itl_ms", "ITL p99"), ("median_e2el_ms", "E2E p50"), ("p99_e2el_ms", "E2E p99"),
               ("output_throughput", "out tok/s")],
    "server": [("server_mean_ttft_ms", "TTFT mean"), ("server_mean_itl_ms", "ITL mean"),
               ("server_mean_e2el_ms", "E2E mean"), ("server_mean_prefill_ms", "prefill mean"),
               ("server_output_throughput", "out tok/s"), ("mean_running", "running")],
}  # fmt: skip
"""What is compared per stage: the client's figures (loadgen's), and the server's own (vLLM's histogram means
over the window, its output token rate, Little's law's running requests), each real against the sim's."""
GOAL = {"median_ttft_ms": 0.10, "median_itl_ms": 0.10, "output_throughput": 0.10, "p99_ttft_ms": 0.20,
        "p99_itl_ms": 0.20, "server_mean_ttft_ms": 0.10, "server_mean_itl_ms": 0.10,
        "server_output_throughput": 0.10}  # fmt: skip
"""Issue 25's goal per figure: |error| at most this (medians, means and throughput 10 %, P99 20 %)."""
RANKED = [(key, label) for key, label in VIEWS["client"] if key in PERCENTILES]
"""The client percentile figures whose real values are placed in the sim's distribution (ranks.py)."""
UNITS = {"s_per_flop": "s/FLOP", "s_per_byte": "s/byte"}
FIXABLE = (*PARAMS[1:], *FRONTEND_PARAMS)
"""What ``--fix`` may hold at 0: every step-time parameter but the fixed step cost, and both frontend ones."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the sim's step-time parameters to a real server's calibration sweep; write a sim GPU profile",
        description="Fit the sim to `loadlens experiment calibration-sweep` results, write a GPU profile, "
        "replay each stage on the sim and print the errors (docs/calibration.md).",
    )
    p.add_argument("runs", nargs="+", help="experiment_result.json files or experiment directories; or "
                   "benchmark_result.json files or run directories of loadlens load, with --prometheus")  # fmt: skip
    p.add_argument("--prometheus", metavar="URL", help="for benchmark_result.json runs: the Prometheus that "
                   "scraped the server during them, read for vLLM's engine counters over each stage")  # fmt: skip
    p.add_argument("--metrics-before", type=Path, metavar="FILE", help="for one benchmark_result.json run of one "
                   "measured stage: the server's /metrics exposition saved just before the run")  # fmt: skip
    p.add_argument("--metrics-after", type=Path, metavar="FILE", help="... and saved just after it")
    p.add_argument("--model-profile", required=True, help="the served model as a sim model profile (name or YAML)")
    p.add_argument("--profile", required=True, type=Path, help="the GPU profile YAML to write")
    p.add_argument("--base-gpu-profile", default="h100-sxm",
                   help="fields not fitted (memory, power, LoRA, thermal) come from this profile")  # fmt: skip
    p.add_argument("--name", help="the written profile's name (default: the file's stem)")
    p.add_argument(
        "--max-num-seqs",
        type=_positive,
        metavar="N",
        help="the server's max_num_seqs as it ran (vLLM does not export it; its default depends on the card: "
        "docs/calibration.md); default: the base GPU profile's",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=_positive,
        metavar="N",
        help="the server's step token budget as it ran (likewise); default: the base GPU profile's",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the server planned each step while the one before it ran (vLLM's GPU builds by default, "
        "not its CPU build; vLLM does not export it); written to the profile and used by the replay; default: "
        "the base GPU profile's",
    )
    p.add_argument("--hold-out", nargs="+", default=[], metavar="STAGE", help="stages left out of the fit")
    p.add_argument("--iteration-log", metavar="FILE", help="vLLM's log, started with --enable-logging-iteration-"
                   "details: its decode-only steps inside the fitted stages' runs become rows of the fit (the mean "
                   "step per stage and batch; docs/calibration.md, The iteration rows)")  # fmt: skip
    p.add_argument("--no-step-spread", action="store_true", help="with --iteration-log: leave the logged "
                   "steps' spread out of the profile (each sim step then takes its modeled time)")  # fmt: skip
    p.add_argument("--no-decode-offsets", action="store_true", help="with --iteration-log: leave the logged "
                   "decode step by batch out of the profile (each decode step then the fitted formula's)")  # fmt: skip
    p.add_argument("--fix", nargs="+", default=[], choices=FIXABLE, metavar="PARAM",
                   help=f"hold parameters at 0 instead of fitting them ({', '.join(FIXABLE)})")  # fmt: skip
    p.add_argument("--no-predict", action="store_true", help="fit and write only; no replay on the sim")
    p.add_argument("--replays", type=_positive, metavar="N", help="replays of each stage behind its predicted "
                   "figures, each the mean over them (at least the stage's runs): a short run's percentiles scatter "
                   f"on the sim as on the server (default: enough for {REPLAY_REQUESTS} requests, at most "
                   f"{MAX_REPLAYS})")  # fmt: skip
    p.add_argument("--constant-client-overhead", action="store_true", help="model the time outside vLLM as one "
                   "constant (the mean over the fitted stages) instead of growing with the stage's users")  # fmt: skip
    p.add_argument(
        "--no-delivery-noise",
        action="store_true",
        help="replay without the host's delivery noise between the engine and the client (docs/calibration.md, "
        "Delivery noise)",
    )
    p.add_argument("--json", type=Path, help="also write the whole report as JSON to this file")
    p.set_defaults(handler=run)


def replays(stage: Stage, wanted: int | None) -> int:
    """How many times ``stage`` is replayed: ``wanted`` (``--replays``), else enough for ``REPLAY_REQUESTS``
    requests at the stage's rate, at most ``MAX_REPLAYS``; never fewer than its runs."""
    if wanted is None:
        per_run = stage.completed / max(1, stage.runs)
        wanted = min(MAX_REPLAYS, math.ceil(REPLAY_REQUESTS / max(1.0, per_run)))
    return max(stage.runs, wanted)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def scheduler_limits(args: argparse.Namespace, base: GPUProfile) -> tuple[dict[str, int | bool], dict[str, str]]:
    """The server's ``max_num_seqs``, ``max_num_batched_tokens`` and ``async_scheduling`` for the profile and the
    replay, and where they came from (``limits`` for the first two, ``async_scheduling`` for the last): the
    flags, else the base profile's (its ``default_knobs``, else the sim's defaults)."""
    knobs = startup_knobs(base)
    given = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    limits: dict[str, int | bool] = {k: v if v is not None else int(getattr(knobs, k)) for k, v in given.items()}
    if limits["max_num_batched_tokens"] < limits["max_num_seqs"]:
        raise UsageError(
            f"--max-num-batched-tokens {limits['max_num_batched_tokens']} is below max_num_seqs "
            f"{limits['max_num_seqs']} (vLLM refuses that too)"
        )
    flagged = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    if len(flagged) == 2:
        source = "given (--max-num-seqs, --max-num-batched-tokens)"
    elif flagged:
        source = f"{flagged[0]} given, the other the base profile {base.name}'s"
    else:
        source = (f"the base profile {base.name}'s: vLLM does not export them, so pass the server's with "
                  "--max-num-seqs and --max-num-batched-tokens")  # fmt: skip
    ahead = args.async_scheduling
    limits["async_scheduling"] = bool(knobs.async_scheduling) if ahead is None else ahead
    sources = {"limits": source, "async_scheduling": f"the base profile {base.name}'s" if ahead is None else "given"}
    return limits, sources


def _snapshots(args: argparse.Namespace) -> tuple[Path, Path] | None:
    before, after = args.metrics_before, args.metrics_after
    if (before is None) != (after is None):
        raise UsageError("--metrics-before and --metrics-after go together (the server's /metrics before and after)")
    if before is None:
        return None
    if args.prometheus:
        raise UsageError("--prometheus or --metrics-before/--metrics-after: one source of the server's counters")
    if len(args.runs) != 1:
        raise UsageError(f"--metrics-before/--metrics-after stand for one run; {len(args.runs)} runs given")
    return before, after


def _load(paths: list[str], prometheus: str | None = None, snapshots: tuple[Path, Path] | None = None) -> list[Stage]:
    stages: list[Stage] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            run = path / "benchmark_result.json"
            path = run if run.is_file() and not (path / "experiment_result.json").exists() else path / EXPERIMENT_FILE
        if _is_benchmark_result(path):
            stages += read_benchmark_stages(path, prometheus, snapshots)
        elif snapshots is not None:
            raise CalibrationInputError(f"{path}: --metrics-before/--metrics-after are for a benchmark_result.json run")
        else:
            stages += read_stages(path)
    names = [s.name for s in stages]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CalibrationInputError(f"stage {dupes[0]} appears in more than one run (give one run per stage name)")
    return stages


def _is_benchmark_result(path: Path) -> bool:
    try:
        return is_benchmark_result(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return False  # read_stages says what is wrong with it


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _print_params(names: tuple[str, ...], result: FitResult | FrontendFit, width: int = 16) -> None:
    for p in names:
        if p in result.not_identified:
            print(f"  {p:<{width}} not identified: {result.not_identified[p]}")
        else:
            unit = UNITS.get(p, "s")
            print(f"  {p:<{width}} {result.values[p]:.4g} {unit} ± {result.stderr[p]:.2g}")


def _line(line: Line | None) -> dict[str, object] | None:
    if line is None:
        return None
    values = {name: v for name, (_, v) in line.points.items()}
    return {"fixed_s": line.fixed_s, "per_user_s": line.per_user_s, "model": line.note, "per_stage_s": values}


def print_fit(result: FitResult, overhead: ClientOverhead | None, frontend: FrontendFit) -> None:
    print("\nstep-time parameters (modeled seconds):")
    _print_params(PARAMS, result)
    if LOG_GAP in result.values:
        _print_params((LOG_GAP,), result)
        print("  (log_gap_s: each step's time outside vLLM's logged elapsed time; the sim's step holds it)")
    print("  regime starts (RMS relative residual of the fit each converged to, its memory-bound steps): "
          + "; ".join(f"{label} {r * 100:.2f} % ({m})" for label, r, m in result.starts))  # fmt: skip
    for label, r, m in result.close_regimes():
        print(f"  another regime fits nearly as well: from '{label}', {m} memory-bound steps against "
              f"{result.memory_bound_steps}, residual {r * 100:.2f} %: the data do not tell whether those steps "
              "are memory- or compute-bound; stages of other batch sizes would (or --hold-out fewer)")  # fmt: skip
    print("\nfrontend parameters (API-server time outside the engine core, seconds):")
    _print_params(FRONTEND_PARAMS, frontend, 22)
    print(f"  (frontend_fixed_s: {SPLIT})")
    print("\nclient overhead (the time a user spends outside vLLM; the replay adds it; not in the profile):")
    if overhead is None:
        print("  none: no fitted stage has both E2E means (0 used)")
    else:
        parts = [("outside", "client mean E2E − vLLM mean E2E", overhead.outside),
                 ("turnaround", "users × duration / completed − client mean E2E", overhead.turnaround)]  # fmt: skip
        for label, what, line in parts:
            if line is None:
                print(f"  {label} ({what}): none (0 used)")
                continue
            values = ", ".join(f"{name} {v * 1000:.1f}" for name, (_, v) in line.points.items())
            print(f"  {label} ({what}): {line.note}; per stage, ms: {values}")
    print("\nfit rows (server means, ms): stage, observable, observed, fitted, residual")
    for stage, obs, y, f in result.rows:
        print(f"  {stage:<14} {obs:<13} {y * 1000:9.3f} {f * 1000:9.3f} {(f - y) / y * 100:+7.1f}%")
    print("\nfrontend rows (vLLM's TTFT − prefill means − the sim's queue mean, ms): stage, mean running, "
          "sim queue, observed, fitted")  # fmt: skip
    for stage, r, y, f in frontend.rows:
        print(f"  {stage:<14} {r:13.3f} {frontend.queues[stage] * 1000:9.3f} {y * 1000:9.3f} {f * 1000:9.3f}")


def errors(real: dict[str, float], sim: dict[str, float | None]) -> dict[str, float | None]:
    """(sim − real) / real per compared figure; None where either is missing or real is 0."""
    out: dict[str, float | None] = {}
    for key, _ in VIEWS["client"] + VIEWS["server"]:
        r, s = real.get(key), sim.get(key)
        out[key] = (s - r) / r if r and s is not None else None
    return out


def print_errors(rows: list[dict[str, object]], view: str) -> None:
    cols = VIEWS[view]
    print(f"\nper stage, {view} figures: real → sim (error)")
    print(f"  {'stage':<14} {'set':<8} " + " ".join(f"{h:>24}" for _, h in cols))
    for row in rows:
        real, sim, err = row["real"], row["sim"], row["error"]
        assert isinstance(real, dict) and isinstance(sim, dict) and isinstance(err, dict)
        cells = [f"{_num(real.get(k))}→{_num(sim.get(k))} ({_pct(err.get(k))})" for k, _ in cols]
        print(f"  {row['stage']!s:<14} {row['set']!s:<8} " + " ".join(f"{c:>24}" for c in cells))


def print_ranks(rows: list[dict[str, object]]) -> None:
    print("\nper stage, where each real client percentile falls in the sim's distribution (the share of the sim's "
          "samples at or below it; a right distribution gives 0.50 for a P50, 0.99 for a P99)")  # fmt: skip
    print(f"  {'stage':<14} {'set':<8} " + " ".join(f"{label:>9}" for key, label in RANKED))
    for row in rows:
        ranks = row["ranks"]
        assert isinstance(ranks, dict)
        cells = [f"{ranks[key]['rank']:.3f}" if key in ranks else "-" for key, _ in RANKED]
        print(f"  {row['stage']!s:<14} {row['set']!s:<8} " + " ".join(f"{c:>9}" for c in cells))


def goal_summary(rows: list[dict[str, object]], which: str) -> dict[str, float | None]:
    """The largest |error| per goal figure over the stages of one set."""
    worst: dict[str, float | None] = {}
    for key in GOAL:
        vals = []
        for r in rows:
            err = r["error"]
            assert isinstance(err, dict)
            if r["set"] == which and err.get(key) is not None:
                vals.append(abs(err[key]))
        worst[key] = max(vals) if vals else None
    return worst


def run(args: argparse.Namespace) -> int:
    try:
        stages = _load(args.runs, args.prometheus, _snapshots(args))
        check_usable(stages)
        model = load_model_profile(args.model_profile)
        base = load_gpu_profile(args.base_gpu_profile)
    except (CalibrationInputError, ProfileError) as err:
        raise UsageError(str(err)) from err
    limits, sources = scheduler_limits(args, base)
    known = {s.name for s in stages}
    unknown = [h for h in args.hold_out if h not in known]
    if unknown:
        raise UsageError(f"--hold-out {unknown[0]}: no such stage (stages: {', '.join(sorted(known))})")
    fit_stages = [s for s in stages if s.name not in args.hold_out]
    if not fit_stages:
        raise UsageError("--hold-out leaves no stage to fit")
    _say(f"calibrate: {len(stages)} stages ({len(fit_stages)} fitted, {len(stages) - len(fit_stages)} held out)")
    warnings = prefix_cache_warnings(stages)
    for line in warnings:
        _say(f"calibrate: warning: {line}")
    extra, steps = [], []
    if args.iteration_log:
        try:
            steps = read_steps(args.iteration_log, fit_stages)
            extra = iteration_rows(model, fit_stages, steps, args.iteration_log)
        except CalibrationInputError as err:
            raise UsageError(str(err)) from err
        _say(f"calibrate: vLLM's iteration log: {len(extra)} rows (stage, batch) of at least {LEAST} decode-only steps")
    result = fit(model, fit_stages, fixed=[p for p in args.fix if p in PARAMS], say=_say, extra=extra)
    overhead = fit_client_overhead(fit_stages, args.constant_client_overhead)
    spread = None
    if steps and not args.no_step_spread:
        spread = step_spread.measure(fit_stages, steps)
    values = spread.values if spread else ()
    offsets = None
    if steps and not args.no_decode_offsets:
        offsets = decode_offsets.measure(model, result, fit_stages, steps)
    by_batch = offsets.values if offsets else ()
    drift = step_drift.measure(model, result, stages, fit_stages, steps) if steps else None
    for line in drift.warnings() if drift else []:
        warnings.append(line)
        _say(f"calibrate: warning: {line}")

    delivery_s = 0.0  # fitted below, once the profile is

    def outside(s: Stage) -> tuple[float, float]:
        """The stage's client overhead and turnaround for the replay (client_overhead.py); the delivery noise's
        mean delay is part of the time outside vLLM, so the overhead before arrival is that much less."""
        if overhead is None:
            return 0.0, 0.0
        turn = overhead.turnaround.at(s.users) if overhead.turnaround is not None else 0.0
        return max(0.0, overhead.outside.at(s.users) - delivery_s), turn

    kv = kv_decision(stages)  # the server's configuration, the same in held-out stages
    name = args.name or args.profile.stem
    source = (
        f"fitted by loadlens calibrate on {datetime.now(UTC):%Y-%m-%d} to {', '.join(args.runs)} "
        f"(stages {', '.join(s.name for s in fit_stages)}; model profile {model.name})"
    )
    try:
        step_only = write_profile(result, base, args.profile, name, source, kv.sim_blocks, None, limits, values,
                                  by_batch)  # fmt: skip
        frontend = fit_frontend_replayed(model, step_only, fit_stages, args.fix, _say, outside)
        gpu = write_profile(result, base, args.profile, name, source, kv.sim_blocks, frontend, limits, values,
                            by_batch)  # fmt: skip
    except OSError as err:
        raise UsageError(f"--profile {args.profile}: {err.strerror}") from err
    except ProfileError as err:
        raise UsageError(f"the fitted profile does not load: {err}") from err
    if args.no_delivery_noise:
        noise = DeliveryNoise(0.0, {}, "none (--no-delivery-noise)")
    else:
        quiet: dict[str, dict[str, float | None]] = {}
        for i, s in enumerate(fit_stages, 1):
            _say(f"calibrate: delivery noise: replaying fitted stage {i}/{len(fit_stages)} {s.name} without it")
            gap, turn = outside(s)
            quiet[s.name] = replay_runs(model, gpu, stage_load(s), replays(s, args.replays), client_overhead_s=gap,
                                        turnaround_s=turn).figures  # fmt: skip
        tail = spread.tail_s() if spread is not None else 0.0
        noise = fit_delivery_noise({s.name: s.figures for s in fit_stages}, quiet, tail)
    delivery_s = noise.mean_s
    print_fit(result, overhead, frontend)
    print(f"\ndelivery noise (the host's delay between the engine and the client; the replay adds it; not in the "
          f"profile): {noise.note}")  # fmt: skip
    if noise.per_stage_s:
        print("  per stage, ms: " + ", ".join(f"{k} {v * 1000:.2f}" for k, v in noise.per_stage_s.items()))
    if spread is not None:
        print(f"\nstep spread (vLLM's logged steps around their mean; in the profile): {spread.note()}")
    if offsets is not None:
        print(f"\ndecode step by batch (vLLM's logged decode-only steps; in the profile): {offsets.note()}")
    if drift is not None:
        print(f"\nstep drift (each stage's logged decode steps against the other fitted stages'): {drift.note()}")
    print(f"\nKV capacity: {kv.reason}")
    print(f"\nscheduler limits: max_num_seqs {limits['max_num_seqs']}, max_num_batched_tokens "
          f"{limits['max_num_batched_tokens']} ({sources['limits']}); async scheduling "
          f"{'on' if limits['async_scheduling'] else 'off'} ({sources['async_scheduling']})")  # fmt: skip
    print(f"\nprofile: {args.profile} (loadlens serve --engine sim --model-profile {args.model_profile} "
          f"--gpu-profile {args.profile})")  # fmt: skip
    report: dict[str, object] = {
        "stages": [s.name for s in stages],
        "held_out": list(args.hold_out),
        "parameters": {**result.values, **frontend.values},
        "stderr": {**result.stderr, **frontend.stderr},
        "not_identified": {**result.not_identified, **frontend.not_identified},
        "regimes": {
            "memory_bound_steps": result.memory_bound_steps,
            "starts": [{"start": label, "rms_residual": r, "memory_bound_steps": m} for label, r, m in result.starts],
            "close": [label for label, _, _ in result.close_regimes()],
        },
        "frontend_split": SPLIT,
        "client_overhead_s": overhead.outside.mean_s if overhead else None,
        "client_overhead": {"outside": _line(overhead.outside), "turnaround": _line(overhead.turnaround)}
        if overhead
        else None,
        "delivery_noise": {"mean_s": noise.mean_s, "per_stage_s": noise.per_stage_s, "model": noise.note},
        "step_spread": spread.as_dict() if spread is not None else None,
        "decode_step_offsets": offsets.as_dict() if offsets is not None else None,
        "step_drift": drift.as_dict() if drift is not None else None,
        "kv_capacity": {
            "blocks": kv.capacity.blocks if kv.capacity else None,
            "block_size": kv.capacity.block_size if kv.capacity else None,
            "sim_num_gpu_blocks": kv.sim_blocks,
            "reason": kv.reason,
        },
        "scheduler": {**limits, "source": sources["limits"], "async_scheduling_source": sources["async_scheduling"]},
        "rows": [{"stage": a, "observable": b, "observed_s": c, "fitted_s": d} for a, b, c, d in result.rows],
        "frontend_rows": [
            {"stage": a, "mean_running": b, "queue_s": frontend.queues[a], "observed_s": c, "fitted_s": d}
            for a, b, c, d in frontend.rows
        ],
        "profile": str(args.profile),
        "prefix_cache_hit_ratio": {s.name: s.prefix_hit_ratio() for s in stages},
        "warnings": warnings,
    }
    if not args.no_predict:
        rows: list[dict[str, object]] = []
        for i, s in enumerate(stages, 1):
            n = replays(s, args.replays)
            _say(f"calibrate: replaying stage {i}/{len(stages)} {s.name} ({n} × {s.duration_s:.0f} s modeled)")
            gap, turn = outside(s)
            replayed = replay_runs(model, gpu, stage_load(s), n, client_overhead_s=gap,
                                   turnaround_s=turn, delivery_noise_s=delivery_s)  # fmt: skip
            sim = replayed.figures
            real = {**s.figures, **s.server_figures()}
            ranks = {k: r.as_dict() for k, r in percentile_ranks(real, replayed.samples).items()}
            rows.append({"stage": s.name, "set": "held-out" if s.name in args.hold_out else "fit",
                         "real": real, "sim": sim, "error": errors(real, sim), "ranks": ranks})  # fmt: skip
        print_errors(rows, "client")
        print_errors(rows, "server")
        print_ranks(rows)
        report["predictions"] = rows
        for which in ("fit", "held-out"):
            worst = goal_summary(rows, which)
            if all(v is None for v in worst.values()):
                continue
            report[f"worst_{which.replace('-', '_')}"] = worst
            verdict = ", ".join(
                f"{k} {_pct(v)} {'ok' if v is not None and v <= GOAL[k] else 'over'} (goal {GOAL[k] * 100:.0f}%)"
                for k, v in worst.items()
            )
            print(f"\nworst |error| over {which} stages: {verdict}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"report: {args.json}")
    return 0
