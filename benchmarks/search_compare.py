"""SLO search against AIPerf and guidellm (issue 15): the highest concurrency that meets the SLO file's
objectives, found three ways on one sim configuration, with a dense repeated sweep as the ground truth.

Run: ``python -m benchmarks.search_compare [--quick] [--only loadlens,guidellm,aiperf,truth] [--rounds N]``.
guidellm and AIPerf are not in this venv (their dependencies clash with it): guidellm is imported from
``--guidellm-path`` (default ``/tmp/glsite``, see ``benchmarks/guidellm_check.py``) by this Python; AIPerf runs
as ``--aiperf`` (default: ``aiperf`` on PATH, else ``/tmp/aiperf-venv/bin/aiperf``; install it in its own venv:
``python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0``). A tool that is
missing is reported as skipped.

**The configuration.** The packaged ``slo-search`` experiment's request shape (closed-loop completions,
prompts of 512 ± 128 tokens clipped to [128, 1024], 128 new tokens, ``ignore_eos``, streaming) on its sim
(deepseek-r1-distill-llama-8b on an A100 40GB PCIe) at ``--speed`` (default 2). The objectives are the SLO
file's ``interactive`` class (TTFT 200 ms, ITL 50 ms, E2E 20 s at its objective ratio 0.99), the goodput bound
``alerting.goodput_ratio_min`` (0.9) and the error budget ``1 - availability`` (0.1 %). Every trial warms up
for about ``--warmup`` seconds and measures ``--measure`` seconds. Each procedure gets a fresh sim.

**The procedures** (each with its search defaults; only the objectives, the shape and the trial length set):

- loadlens: ``loadlens experiment slo-search --host URL --time-scale measure/60``: from 8 users, double or
  halve, then bisect to adjacent levels; a level passes when goodput ≥ 0.9 and every SLO check of the verdict
  passes (p99 TTFT, p99 per-token ITL, p99 E2E, goodput, error ratio).
- AIPerf: ``aiperf profile --search-recipe max-concurrency-under-sla`` (its default ``smooth_isotonic``
  planner: doubling from 1 to the first breach, probes inside the bracket, an isotonic fit of each SLA's
  margin, stop when the bracket is within 5 %), one subprocess benchmark per iteration, with the same SLAs as
  ``--search-sla`` filters (TTFT p99, per-request ITL p99, E2E p99, error rate, ``good_request_fraction`` ≥ 0.9
  with ``--goodput`` thresholds).
- guidellm: ``guidellm run --profile kind=goodput`` (doubling from 4 streams, bisection until the bracket is
  within 10 % or adjacent) with ``target_attainment`` = the class objective ratio 0.99: a level passes when
  ≥ 99 % of requests meet TTFT, TPOT (its per-request ITL) and E2E together. guidellm has no p99 or goodput
  ratio test of its own; attainment at 0.99 is its closest question.

**The ground truth.** ``loadlens load`` at every level from two below the lowest answer to two above the
highest (or ``--truth-levels``), then on upwards while the last level passes (at most 8 more), each level
``--truth-repeats`` times for ``--truth-measure`` seconds, on one fresh sim; judged from the *server's*
request log (each request's TTFT, TPOT, E2E as the sim delivered them, so no client's overhead is in it): a
run passes when the p99s are within the thresholds (TPOT standing in for ITL), the share meeting all three is
≥ 0.9 and errors ≤ 0.1 %. The truth is the highest level whose runs mostly pass with every lower level mostly
passing; its band is the levels whose runs disagree. Each answer is checked against it, not assumed. The
judgement, the truth's capacity and band and the report are ``benchmarks/search_judge.py``; the procedures,
the ground truth's runs and the command line are here.

Printed: per procedure the answer (highest passing level), the lowest failing one, its stated uncertainty,
trials (benchmark runs), requests the server received (warmups included), wall time; medians over
``--rounds``; the truth per level; ratios to loadlens. ``--pin`` puts the sim on CPU 0 and the clients on
CPU 1 (``taskset``); off by default: on a shared machine a pinned process waits for its core while the other idles.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.search_judge import (
    TOOLS,
    Objectives,
    Outcome,
    Served,
    Workload,
    bracket,
    judge_served,
    parse_served,
    report,
)
from loadlens.contracts.slo import load_slos
from loadlens.experiment.analysis.analyse import wilson
from loadlens.experiment.models import load_experiment
from loadlens.util.net import free_port

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = "slo-search"


def workload(speed: float, warmup_s: float, measure_s: float) -> Workload:
    exp = load_experiment(EXPERIMENT)
    profile = exp.spec.profiles["chat"]
    assert isinstance(profile, dict)
    entry = profile["traffic"][0]
    tokens = entry["prompt"]["tokens"]
    return Workload(
        model_profile=exp.spec.sim.model_profile,
        gpu_profile=exp.spec.sim.gpu_profile,
        speed=speed,
        prompt_mean=int(tokens["mean"]),
        prompt_stdev=int(tokens["stdev"]),
        prompt_min=int(tokens["min"]),
        prompt_max=int(tokens["max"]),
        output_tokens=int(entry["output_tokens"]["mean"]),
        warmup_s=warmup_s,
        measure_s=measure_s,
    )


def objectives() -> Objectives:
    slos = load_slos()
    cls = next(c for c in slos.classes if c.name == "interactive")
    return Objectives(
        ttft_ms=cls.ttft_seconds * 1000.0,
        itl_ms=cls.itl_seconds * 1000.0,
        e2e_ms=cls.e2e_seconds * 1000.0,
        ratio=cls.objective_ratio,
        goodput_min=float(slos.alerting["goodput_ratio_min"]),
        error_max=round(1.0 - slos.availability_objective_ratio, 9),
    )


# --- the sim and the clients ---------------------------------------------------------------------------------


def cpu_sets(pin: bool) -> tuple[str | None, str | None]:
    """(sim CPUs, client CPUs) for taskset, or (None, None): not asked, one CPU, or no taskset."""
    if not pin or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return None, None
    return "0", "1"


def pinned(argv: list[str], cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus else argv


@contextmanager
def sim(work: Workload, log_path: Path, cpus: str | None) -> Iterator[str]:
    """A fresh ``loadlens serve`` sim logging every request as JSON into ``log_path``; stopped at the end."""
    port = free_port()
    argv = [sys.executable, "-m", "loadlens.cli", "serve", "--model-profile", work.model_profile,
            "--gpu-profile", work.gpu_profile, "--speed", f"{work.speed:g}", "--port", str(port),
            "--log-level", "info", "--log-format", "json"]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(pinned(argv, cpus), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the sim did not start: {log_path.read_text()[-1500:]}")
            time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_logged(argv: list[str], log: Path, env: dict[str, str] | None, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    with log.open("wb") as out:
        try:
            proc = subprocess.run(argv, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=None if env is None else {**os.environ, **env}, check=False)  # fmt: skip
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.monotonic() - t0


def served(log_path: Path) -> list[Served]:
    return parse_served(log_path.read_text(errors="replace").splitlines())


# --- the three procedures ------------------------------------------------------------------------------------


def run_loadlens(work: Workload, url: str, tmp: Path, cpus: str | None, timeout: float) -> Outcome:
    out = Outcome("loadlens")
    argv = [sys.executable, "-m", "loadlens.cli", "experiment", EXPERIMENT, "--host", url,
            "--time-scale", f"{work.measure_s / 60:g}", "--results", str(tmp), "--run-id", "search"]  # fmt: skip
    rc, out.wall_s = run_logged(pinned(argv, cpus), tmp / "loadlens.log", None, timeout)
    path = tmp / "experiments" / "search" / "experiment_result.json"
    if rc != 0 or not path.exists():
        out.error = f"exit {rc}: {(tmp / 'loadlens.log').read_text()[-400:]}"
        return out
    # Read as plain JSON, not through the typed model: the result keys are documented, and a reader that
    # refuses keys it does not know yet would break on a newer runner.
    result = json.loads(path.read_text())
    tables = {t["name"]: t["rows"] for t in result["tables"]}
    out.levels = [(float(r["level"]), bool(r["level_passes"])) for r in tables.get("levels", [])]
    out.trials = sum(len(t["runs"]) for t in result["trials"])
    cap = (tables.get("capacity") or [None])[0]
    if cap is not None:
        out.answer, out.next_failing = float(cap["capacity"]), float(cap["next_failing"])
        out.uncertainty = f"pass p 95% [{cap['pass_low']:.2f}, {cap['pass_high']:.2f}]"
    else:
        out.answer, out.next_failing = bracket(out.levels)
    return out


def run_guidellm(work: Workload, obj: Objectives, url: str, tok: Path, tmp: Path, glpath: str,
                 cpus: str | None, timeout: float) -> Outcome:  # fmt: skip
    out = Outcome("guidellm")
    report = tmp / "guidellm.json"
    argv = [sys.executable, "-m", "guidellm", "run",
            "--backend", json.dumps({"kind": "openai_http", "target": url, "model": work.model_profile,
                                     "request_format": "/v1/completions"}),
            "--profile", json.dumps({"kind": "goodput", "target_attainment": obj.ratio, "warmup": work.warmup_s}),
            "--constraint", json.dumps({"kind": "max_duration", "seconds": work.warmup_s + work.measure_s}),
            "--data", json.dumps({"kind": "synthetic_text", "prompt_tokens": work.prompt_mean,
                                  "prompt_tokens_stdev": work.prompt_stdev, "prompt_tokens_min": work.prompt_min,
                                  "prompt_tokens_max": work.prompt_max, "output_tokens": work.output_tokens}),
            "--tokenizer", json.dumps({"kind": "huggingface_auto", "model": str(tok)}),
            "--metrics", json.dumps({"kind": "generative", "slo": {"ttft_ms": obj.ttft_ms, "tpot_ms": obj.itl_ms,
                                                                   "e2el_ms": obj.e2e_ms}}),
            "--output", json.dumps({"kind": "json", "path": str(report)}),
            "--disable-console"]  # fmt: skip
    env = {"PYTHONPATH": glpath, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    rc, out.wall_s = run_logged(pinned(argv, cpus), tmp / "guidellm.log", env, timeout)
    if rc != 0 or not report.exists():
        out.error = f"exit {rc}: {(tmp / 'guidellm.log').read_text()[-400:]}"
        return out
    benches = json.loads(report.read_text())["benchmarks"]
    out.trials = len(benches)
    attainment: dict[float, tuple[int, int]] = {}
    for b in benches:
        streams = float(b["config"]["strategy"]["streams"])
        m = b["metrics"]
        n = int(m["slo_determined_requests"])
        rate = m["slo_attainment"]
        good = round(float(rate) * n) if rate is not None else 0
        attainment[streams] = (good, n)
        out.levels.append((streams, rate is not None and float(rate) >= obj.ratio))
    out.answer, out.next_failing = bracket(out.levels)
    if out.answer is not None:
        good, n = attainment[out.answer]
        lo, hi = wilson(good, n)
        out.uncertainty = f"attainment {good / n:.3f}, 95% [{lo:.3f}, {hi:.3f}]"
    return out


def run_aiperf(work: Workload, obj: Objectives, url: str, tok: Path, tmp: Path, aiperf: str,
               cpus: str | None, timeout: float) -> Outcome:  # fmt: skip
    out = Outcome("aiperf")
    art = tmp / "aiperf"
    p = obj.percentile()
    argv = [aiperf, "profile", "-m", work.model_profile, "--url", url, "--endpoint-type", "completions",
            "--streaming", "--tokenizer", str(tok), "--isl", str(work.prompt_mean),
            "--isl-stddev", str(work.prompt_stdev), "--osl", str(work.output_tokens),
            "--extra-inputs", "ignore_eos:true", "--warmup-duration", f"{work.warmup_s:g}",
            "--benchmark-duration", f"{work.measure_s:g}", "--ui", "none", "--artifact-dir", str(art),
            "--search-recipe", "max-concurrency-under-sla", "--e2e-sla-ms", f"{obj.e2e_ms:g}",
            "--search-sla", f"time_to_first_token:{p}:le:{obj.ttft_ms:g}",
            "--search-sla", f"inter_token_latency:{p}:le:{obj.itl_ms:g}",
            "--search-sla", f"request_error_rate:avg:le:{obj.error_max * 100:g}",
            "--goodput", f"time_to_first_token:{obj.ttft_ms:g} inter_token_latency:{obj.itl_ms:g} "
                         f"request_latency:{obj.e2e_ms:g}",
            "--search-sla", f"good_request_fraction:avg:ge:{obj.goodput_min:g}"]  # fmt: skip
    # The SLA planners prepend a warmup of at least 60 s to a level's first probe (15 s to a replicate) and cap
    # profiling at 1,000 requests: set every floor to the warmup the other tools get, so trials are alike.
    warm = f"{work.warmup_s:g}"
    env = {"AIPERF_SEARCH_PLANNER_DEFAULT_WARMUP_SECONDS": warm, "AIPERF_SEARCH_PLANNER_FIRST_PROBE_WARMUP_FLOOR": warm,
           "AIPERF_SEARCH_PLANNER_REPLICATE_WARMUP_FLOOR": warm}  # fmt: skip
    # No HF_HUB_OFFLINE: with it AIPerf 0.13.0 looks a tokenizer *directory* up in the hub cache and fails.
    rc, out.wall_s = run_logged(pinned(argv, cpus), tmp / "aiperf.log", env, timeout)
    history = next(iter(sorted(art.rglob("search_history.json"))), None)
    if history is None:
        out.error = f"exit {rc}: no search_history.json; {(tmp / 'aiperf.log').read_text()[-400:]}"
        return out
    doc = json.loads(history.read_text())
    for it in doc.get("iterations") or []:
        level = (it.get("variation_values") or {}).get("phases.profiling.concurrency")
        if level is not None:
            out.levels.append((float(level), bool(it.get("feasible"))))
        out.trials += 1  # one benchmark per iteration (--num-profile-runs 1)
    out.answer, out.next_failing = bracket(out.levels)
    summary = doc.get("boundary_summary") or {}
    for key, name in (("feasible_max", "answer"), ("infeasible_min", "next_failing")):
        block = summary.get(key)
        if isinstance(block, dict) and block.get("value") is not None:
            setattr(out, name, float(block["value"]))
    parts = [str(doc.get("convergence_reason") or "")]
    ci = summary.get("boundary_ci")
    if isinstance(ci, dict):
        parts.append(f"boundary CI [{ci.get('lo'):.3g}, {ci.get('hi'):.3g}]")
    if summary.get("binding_constraint"):
        parts.append(f"binding {summary['binding_constraint']}")
    out.uncertainty = ", ".join(p for p in parts if p)
    return out


# --- the ground truth ----------------------------------------------------------------------------------------


def truth_profile(work: Workload, users: int, seconds: float) -> dict[str, Any]:
    exp = load_experiment(EXPERIMENT)
    profile = dict(exp.spec.profiles["chat"])  # type: ignore[arg-type]
    warm = exp.spec.warmup
    assert warm is not None
    profile["name"] = f"truth-c{users}"
    profile["stages"] = [
        {"name": "warmup", "warmup": True, "users": warm.users, "until_requests": warm.until_requests,
         "max_duration": warm.max_duration},
        {"name": "level", "users": users, "duration": seconds},
    ]  # fmt: skip
    return profile


def run_truth(work: Workload, obj: Objectives, levels: Sequence[int], repeats: int, seconds: float, tmp: Path,
              cpus: tuple[str | None, str | None], extend: int = 8) -> list[dict[str, Any]]:  # fmt: skip
    """Every level ``repeats`` times, judged from the server's request log and by loadlens's verdict. The first
    pass goes up from the lowest level and, past the given ones, on by one user while the last level passed
    (at most ``extend`` more), so the truth sees a failure; then the later passes repeat every level measured
    (all levels once, then again: a drift of the machine's load spreads over the levels)."""
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "truth-server.log"
    runs: list[dict[str, Any]] = []
    with sim(work, log, cpus[0]) as url:

        def measure(users: int, rep: int) -> dict[str, Any]:
            profile = tmp / f"truth-c{users}.yaml"
            profile.write_text(yaml.safe_dump(truth_profile(work, users, seconds), sort_keys=False))
            run_id = f"truth-c{users}-r{rep}"
            argv = [sys.executable, "-m", "loadlens.cli", "load", "--profile", str(profile), "--host", url,
                    "--headless", "--results", str(tmp), "--run-id", run_id, "--metrics-port", "0"]  # fmt: skip
            rc, _ = run_logged(pinned(argv, cpus[1]), tmp / f"{run_id}.log", None, seconds * 4 + 120)
            result = tmp / run_id / "benchmark_result.json"
            if not result.exists():
                raise RuntimeError(f"truth run {run_id} failed (exit {rc})")
            doc = json.loads(result.read_text())
            stage = next(s for s in doc["stages"] if not s["warmup"])
            window = (float(stage["start_timestamp"]), float(stage["end_timestamp"]))
            row = judge_served([r for r in served(log) if window[0] <= r.start < window[1]], obj)
            row.update(level=users, repeat=rep, client_verdict=doc["verdict"]["status"],
                       client_ttft_p99=doc["overall"]["p99_ttft_ms"])  # fmt: skip
            print(f"  truth c{users} r{rep}: server TTFT p99 {row.get('ttft_p99', math.nan):.1f} ms, "
                  f"goodput {row.get('goodput_ratio', 0):.3f}, {'pass' if row['passes'] else 'FAIL'}; "
                  f"client verdict {row['client_verdict']}", flush=True)  # fmt: skip
            runs.append(row)
            return row

        measured = list(levels)
        for users in levels:
            measure(users, 0)
        users = max(levels)
        while runs[-1]["passes"] and users < max(levels) + extend:
            users += 1
            measured.append(users)
            measure(users, 0)
        for rep in range(1, repeats):
            for users in measured:
                measure(users, rep)
    return runs


# --- the run -------------------------------------------------------------------------------------------------


def run_round(tools: Sequence[str], work: Workload, obj: Objectives, tok: Path, tmp: Path, args: argparse.Namespace,
              cpus: tuple[str | None, str | None]) -> list[Outcome]:  # fmt: skip
    outcomes = []
    for tool in tools:
        d = tmp / tool
        d.mkdir(parents=True, exist_ok=True)
        log = d / "server.log"
        print(f"  {tool} ...", flush=True)
        try:
            with sim(work, log, cpus[0]) as url:
                if tool == "loadlens":
                    out = run_loadlens(work, url, d, cpus[1], args.timeout)
                elif tool == "guidellm":
                    out = run_guidellm(work, obj, url, tok, d, args.guidellm_path, cpus[1], args.timeout)
                else:
                    out = run_aiperf(work, obj, url, tok, d, args.aiperf, cpus[1], args.timeout)
        except (RuntimeError, OSError, KeyError, ValueError, TypeError) as err:  # one tool's failure is its row
            out = Outcome(tool, error=f"{type(err).__name__}: {err}")
        out.requests = len(served(log))
        outcomes.append(out)
        levels = " ".join(f"{lv:g}{'+' if ok else '-'}" for lv, ok in out.levels)
        print(f"  {tool}: answer {out.answer}, next failing {out.next_failing}, {out.trials} trials, "
              f"{out.requests} requests, {out.wall_s:.0f} s; levels {levels}"
              + (f"; error {out.error}" if out.error else ""), flush=True)  # fmt: skip
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short trials, one truth repeat (a few minutes)")
    ap.add_argument(
        "--only", default=",".join((*TOOLS, "truth")), help="comma-separated: loadlens,aiperf,guidellm,truth"
    )
    ap.add_argument("--rounds", type=int, default=1, help="each procedure this many times (medians)")
    ap.add_argument("--speed", type=float, default=2.0, help="the sim's --speed")
    ap.add_argument("--warmup", type=float, default=None, help="warmup seconds per trial (default 5, quick 3)")
    ap.add_argument("--measure", type=float, default=None, help="measured seconds per trial (default 15, quick 6)")
    ap.add_argument("--truth-measure", type=float, default=None, help="seconds per truth run (default 20, quick 8)")
    ap.add_argument("--truth-repeats", type=int, default=None, help="runs per truth level (default 2, quick 1)")
    ap.add_argument("--truth-levels", default=None, help="comma-separated levels (default: around the answers)")
    ap.add_argument("--guidellm-path", default=os.environ.get("GUIDELLM_PATH", "/tmp/glsite"))
    ap.add_argument("--aiperf", default=shutil.which("aiperf") or "/tmp/aiperf-venv/bin/aiperf")
    ap.add_argument("--timeout", type=float, default=1800.0, help="longest one procedure may run (s)")
    ap.add_argument("--pin", action="store_true", help="the sim on CPU 0, every client on CPU 1 (taskset)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--keep", type=Path, default=None, help="keep every log and result under this directory")
    args = ap.parse_args(argv)
    wanted = [t.strip() for t in args.only.split(",") if t.strip()]
    unknown = sorted(set(wanted) - {*TOOLS, "truth"})
    if unknown:
        ap.error(f"--only: unknown {unknown}")
    work = workload(
        args.speed, args.warmup or (3.0 if args.quick else 5.0), args.measure or (6.0 if args.quick else 15.0)
    )
    obj = objectives()
    tools = [t for t in TOOLS if t in wanted]
    if "guidellm" in tools and not (Path(args.guidellm_path) / "guidellm").is_dir():
        print(f"skipping guidellm: not under --guidellm-path {args.guidellm_path}", file=sys.stderr)
        tools.remove("guidellm")
    if "aiperf" in tools and not Path(args.aiperf).exists():
        print(f"skipping aiperf: {args.aiperf} not found", file=sys.stderr)
        tools.remove("aiperf")
    cpus = cpu_sets(args.pin)
    base = args.keep or Path(tempfile.mkdtemp(prefix="search-compare-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"search_compare: {', '.join(tools) or 'no tool'}; sim on CPU {cpus[0]}, clients on CPU {cpus[1]}; "
          f"files in {base}", flush=True)  # fmt: skip
    tok = base / "tokenizer"
    if not tok.exists():
        subprocess.run([sys.executable, "-m", "loadlens.cli", "serve", "--model-profile", work.model_profile,
                        "--write-tokenizer", str(tok)], check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    rounds: list[list[Outcome]] = []
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        rounds.append(run_round(tools, work, obj, tok, base / f"round{r + 1}", args, cpus))
    truth: list[dict[str, Any]] = []
    seconds = 0.0
    if "truth" in wanted:
        if args.truth_levels:
            levels = sorted({int(x) for x in args.truth_levels.split(",")})
        else:
            answers = sorted(o.answer for rr in rounds for o in rr if o.answer is not None)
            if not answers:
                print("no answer to centre the truth on: give --truth-levels", file=sys.stderr)
                return 1
            lo, hi = max(1, int(answers[0]) - 2), int(answers[-1]) + 2
            mid = int(statistics.median(answers))
            while hi - lo + 1 > 8:  # at most 8 levels, trimmed towards the median answer
                lo, hi = (lo + 1, hi) if mid - lo > hi - mid else (lo, hi - 1)
            levels = list(range(lo, hi + 1))
        repeats = args.truth_repeats or (1 if args.quick else 2)
        seconds = args.truth_measure or (8.0 if args.quick else 20.0)
        print(f"ground truth: levels {levels}, {repeats} x {seconds:g} s", flush=True)
        truth = run_truth(work, obj, levels, repeats, seconds, base / "truth", cpus)
    report(rounds, truth, obj, work, seconds)
    if args.json:
        doc = {"workload": work.__dict__, "objectives": obj.__dict__, "truth": truth,
               "rounds": [[o.__dict__ for o in rr] for rr in rounds]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    failed = [o.tool for rr in rounds for o in rr if o.error]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
