"""``loadlens load``: validate the profile and the target, then run Locust with loadgen/locustfile.py.

Locust runs as a child process (gevent patches the standard library, which must not happen inside the
``loadlens`` process); every option reaches it as a command-line flag, the API key through the environment.

After Locust has finished it adds the run's verdict (``loadgen/verdict/``: pass/fail against the SLO
file, the alerts and pages of the run's window, waiting for pending alerts at most ``--alert-wait`` s) to
benchmark_result.json and prints it.

Exit status: 0 the run completed and its results are valid; 3 it completed but the results are invalid
(load-generator CPU above the threshold); 2 a usage error (bad profile, flag, URL); 1 the target or
``--prometheus`` could not be reached, Locust failed, or (with ``--fail-on-slo``) the verdict is FAIL. Request
failures are data (in benchmark_result.json), not an exit status.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadgen.options import ENV_PREFIX, add_cli_option, default_run_id, http_url, locust_flag
from loadgen.probe import TargetUnreachable, first_model
from loadgen.profile import ProfileError, available_profiles, load_profile, resolve_profile_path
from loadgen.results import write_result
from loadgen.verdict.checks import build_verdict
from loadgen.verdict.console import verdict_text
from loadgen.verdict.observer import DEFAULT_ALERT_WAIT_S, observe
from loadlens.contracts.results import RESULT_FILE, ResultsError, parse_result
from loadlens.contracts.slo import SLOConfig, SLOConfigError, load_slos
from loadlens.util.cliutil import UsageError, env_arg, non_negative_int, port_number
from loadlens.util.net import free_port
from loadlens.util.prometheus import PrometheusClient, PrometheusUnreachable

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
LOCUST_PORT = 5557  # Locust's own default for a master and its remote workers


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Its own prefix, so one environment can configure `loadlens serve` (LOADLENS_HOST, ...) beside it.
    arg = functools.partial(env_arg, env_prefix=ENV_PREFIX)
    p = sub.add_parser(
        "load",
        help="run a load profile against an OpenAI-compatible server (Locust)",
        description=(
            "Run a load profile (stages of users or arrival rates, a weighted traffic mix) against an "
            "OpenAI-compatible server with Locust. Streams every request and measures TTFT, per-token ITL, "
            "TPOT and E2E at full precision; serves client-side metrics on /metrics; writes "
            "RESULTS/RUN_ID/benchmark_result.json. See docs/loadgen.md."
        ),
    )
    shared = functools.partial(add_cli_option, p, arg=arg)
    shared("profile")
    arg(p, "--host", type=http_url, default="http://127.0.0.1:8000", help="target base URL")
    shared("model")
    arg(p, "--headless", action="store_true", help="no web UI; run the profile and exit")
    for dest in ("users_scale", "time_scale", "results", "run_id", "prometheus", "seed", "slo_file", "api_key"):
        shared(dest)
    shared("metrics_port")
    shared("metrics_host")
    arg(p, "--workers", type=non_negative_int, default=0, help="local Locust worker processes (0: one process)")
    arg(p, "--expect-workers", type=non_negative_int, default=0, help="run as master; wait for N remote workers")
    arg(p, "--master-host", default=None, help="run as a worker of the master at this host")
    arg(p, "--master-port", type=port_number, default=None,
        help="master's port (workers and master; default 5557, or a free loopback port for --workers)")  # fmt: skip
    arg(p, "--web-port", type=port_number, default=8089, help="Locust web UI port (without --headless)")
    arg(p, "--csv", action="store_true", help="also write Locust's CSV reports into the run directory")
    arg(p, "--html", action="store_true", help="also write Locust's HTML report into the run directory")
    shared("cpu_threshold")
    shared("progress_interval")
    shared("stop_on_oversaturation")
    arg(
        p,
        "--log-level",
        type=str.lower,  # the spelling of serve and gpu-exporter; upper case is accepted too
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="Locust log level",
    )
    arg(
        p,
        "--pager",
        type=pager_source,
        default=None,
        help="loadlens pager base URL (GET /pages) or its log file (pages.jsonl): count the run's pages",
    )
    arg(
        p,
        "--alert-wait",
        type=non_negative_float,
        default=DEFAULT_ALERT_WAIT_S,
        help="longest wait after the run for pending alerts and their pages (seconds; needs --prometheus)",
    )
    arg(p, "--fail-on-slo", action="store_true", help="exit 1 when the verdict is FAIL (an SLO check failed)")
    arg(p, "--dry-run", action="store_true", help="validate, print the stage plan and the Locust command, exit")
    p.add_argument("--list-profiles", action="store_true", help="print the packaged profiles and exit")
    p.set_defaults(handler=run)


def _plan(profile: Any) -> str:
    lines = [f"profile {profile.name}: {profile.description}"]
    for i, s in enumerate(profile.stages):
        length = f"{s.duration:g} s" if s.duration is not None else f"until {s.until_requests} requests"
        if s.duration is not None and s.until_requests is not None:
            length = f"{s.duration:g} s or {s.until_requests} requests"
        tag = " (warmup, excluded)" if s.warmup else ""
        lines.append(f"  {i + 1}. {s.name}: {s.target()}, {length}{tag}")
    total = sum(t.weight for t in profile.traffic)
    mix = ", ".join(f"{t.name} {t.weight / total:.0%}" for t in profile.traffic)
    lines.append(f"  traffic: {mix}")
    return "\n".join(lines)


def build_command(args: argparse.Namespace, profile_path: Path, model: str | None, run_id: str) -> list[str]:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", args.host]
    cmd += [locust_flag("profile"), str(profile_path), "--users-scale", repr(args.users_scale)]
    cmd += ["--time-scale", repr(args.time_scale), "--results", args.results, "--run-id", run_id]
    cmd += ["--metrics-port", str(args.metrics_port), "--metrics-host", args.metrics_host]
    cmd += ["--progress-interval", repr(args.progress_interval), "--loglevel", args.log_level.upper()]
    if model:
        cmd += ["--model", model]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    if args.prometheus:
        cmd += ["--prometheus", args.prometheus]
    if args.slo_file:
        cmd += ["--slo-file", args.slo_file]
    if args.cpu_threshold:
        cmd += ["--cpu-threshold", repr(args.cpu_threshold)]
    if args.stop_on_oversaturation:
        cmd += [locust_flag("stop_on_oversaturation")]
    run_dir = Path(args.results) / run_id
    if args.master_host:
        cmd += ["--worker", "--master-host", args.master_host, "--master-port", str(args.master_port or LOCUST_PORT)]
        return cmd
    if args.headless:
        cmd += ["--headless", "--only-summary"]
    else:
        cmd += ["--autostart", "--web-port", str(args.web_port)]
    if args.workers:
        # Local worker processes meet their master on loopback. Locust's fixed default port would let two runs
        # on one machine (two users, two CI jobs) join each other's workers: a free port unless one was named.
        port = str(args.master_port or free_port())
        cmd += ["--processes", str(args.workers), "--master-bind-host", "127.0.0.1"]
        cmd += ["--master-bind-port", port, "--master-port", port]
    if args.expect_workers:
        port = str(args.master_port or LOCUST_PORT)
        cmd += ["--master", "--expect-workers", str(args.expect_workers), "--master-bind-port", port]
    if args.csv:
        cmd += ["--csv", str(run_dir / "locust")]
    if args.html:
        cmd += ["--html", str(run_dir / "locust_report.html")]
    return cmd


def pager_source(text: str) -> str:
    """A pager URL (http(s)://...) or the path of its log file (which need not exist yet: no pages)."""
    if "://" in text:
        return http_url(text)
    if not text or Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"must be a pager URL or its pages.jsonl file, got {text!r}")
    return text


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 and finite, got {text!r}")
    return value


def server_warnings(doc: dict[str, Any]) -> list[str]:
    """One console line per stage whose server-side figures (``--prometheus``) hit errors."""
    out = []
    for stage in doc.get("stages", []):
        errors = (stage.get("server") or {}).get("errors") or []
        if errors:
            out.append(f"loadlens load: warning: server-side figures of stage {stage['name']}: {'; '.join(errors)}")
    return out


def add_verdict(path: Path, args: argparse.Namespace, slos: SLOConfig) -> str:
    """Judge the result at ``path``, write the verdict into it and return its status (pass, fail, unknown)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    result = parse_result(doc, str(path))
    start, end = result.run.start_timestamp, result.run.end_timestamp
    observation = None
    if start is not None and end is not None and (args.prometheus or args.pager):
        observation = observe(
            start=start,
            end=end,
            prometheus_url=args.prometheus,
            pager_url=args.pager,
            wait_limit=args.alert_wait,
            say=lambda line: print(f"loadlens load: {line}", flush=True),
        )
    verdict = build_verdict(result, slos, observation)
    doc["verdict"] = verdict.model_dump(mode="json")
    parse_result(doc, str(path))  # the typed model is the schema
    write_result(path.parent, doc)
    for line in server_warnings(doc):
        print(line, file=sys.stderr)
    print(verdict_text(verdict), flush=True)
    return verdict.status


def run(args: argparse.Namespace) -> int:
    if args.list_profiles:
        for name in available_profiles():
            print(f"{name:<14} {load_profile(name).description}")
        return 0
    try:
        profile_path = resolve_profile_path(args.profile)
        profile = load_profile(args.profile).scaled(users=args.users_scale, time=args.time_scale)
    except ProfileError as err:
        raise UsageError(str(err)) from err
    try:
        slos = load_slos(args.slo_file or None)
        for traffic in profile.traffic:
            traffic.slo_class(slos)
    except (SLOConfigError, ProfileError) as err:
        raise UsageError(str(err)) from err
    if args.master_host and (args.workers or args.expect_workers):
        raise UsageError("--master-host (worker mode) cannot be combined with --workers or --expect-workers")
    if args.workers and args.expect_workers:
        raise UsageError("use either --workers (local processes) or --expect-workers (remote workers)")
    run_id = args.run_id or default_run_id(profile.name)
    if "/" in run_id or run_id in (".", ".."):
        raise UsageError(f"--run-id must be a plain directory name, got {run_id!r}")
    model = args.model
    if args.dry_run:
        print(_plan(profile))
        print(" ".join(build_command(args, profile_path, model, run_id)))
        return 0
    if not args.master_host:
        try:
            detected = first_model(args.host, args.api_key)
        except TargetUnreachable as err:
            print(f"loadlens load: error: {err}", file=sys.stderr)
            return 1
        model = model or detected
        if args.prometheus:
            try:
                PrometheusClient(args.prometheus).check(timeout=5.0)
            except PrometheusUnreachable as err:
                print(f"loadlens load: error: --prometheus {args.prometheus}: {err}", file=sys.stderr)
                return 1
    print(_plan(profile), flush=True)
    if not args.master_host:
        where = f"http://{args.metrics_host}:{args.metrics_port}/metrics" if args.metrics_port else "off"
        print(f"target {args.host}, model {model}; metrics {where}; results {Path(args.results) / run_id}", flush=True)
    env = dict(os.environ)
    if args.api_key:
        env["LOADLENS_LOAD_API_KEY"] = args.api_key
    cmd = build_command(args, profile_path, model, run_id)
    try:
        code = subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        code = 130
    result = Path(args.results) / run_id / RESULT_FILE
    if result.is_file() and not args.master_host and code == 130:
        print(f"results (interrupted, not judged): {result}")
    elif result.is_file() and not args.master_host:
        try:
            status = add_verdict(result, args, slos)
        except (ValueError, ResultsError, OSError) as err:
            print(f"loadlens load: cannot judge {result}: {err}", file=sys.stderr)
            return code or 1
        print(f"results: {result}")
        if args.fail_on_slo and status == "fail" and code == 0:
            print("loadlens load: verdict FAIL (--fail-on-slo): exit 1", file=sys.stderr)
            return 1
    return code
