"""``loadlens experiment NAME|FILE``: run a packaged (``--list``) or custom experiment; docs/experiments.md.

Exit status: 0 every trial ran and the analysis was written; 1 a trial failed or the server could not be
started or reached; 2 a usage error (a broken experiment file, an unknown knob or parameter), before
anything starts; 130 interrupted (the finished trials are kept: ``--resume`` continues).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from loadlens.contracts.experiment_result import EXPERIMENT_FILE, ExperimentResult
from loadlens.contracts.slo import SLOConfigError, load_slos
from loadlens.experiment.adapters import AdapterBook
from loadlens.experiment.analysis.analyse import analyse, stopper
from loadlens.experiment.device import DeviceWatch
from loadlens.experiment.html import write_html
from loadlens.experiment.models import (
    ExperimentError,
    available_experiments,
    expand_adapters,
    expand_trials,
    load_experiment,
)
from loadlens.experiment.run_args import repeats_and_run_id
from loadlens.experiment.runner import ExperimentRunner, Interrupted, RunOptions
from loadlens.experiment.search import SearchFailed, SearchRunner
from loadlens.experiment.servers import AdminServer, CommandServer, ServerControl, ServerError, SimServer, UrlServer
from loadlens.util.cliutil import UsageError, env_arg, positive_float

ENV_PREFIX = "LOADLENS_EXPERIMENT_"


def _param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key, value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    arg = functools.partial(env_arg, env_prefix=ENV_PREFIX)
    p = sub.add_parser(
        "experiment",
        help="run an experiment: trials of server configurations x load profiles, analysed (guide procedures)",
        description=(
            "Run an experiment (YAML: trials, each a server configuration plus a load profile, repeats and an "
            "analysis) and write RESULTS/experiments/RUN_ID/experiment_result.json and report.html. Without "
            "--host the sim is started as the experiment says. See docs/experiments.md."
        ),
    )
    p.add_argument("experiment", nargs="?", help="packaged experiment name (--list) or a YAML file")
    p.add_argument("--list", action="store_true", help="print the packaged experiments and exit")
    arg(p, "--host", help="a running server whose knobs are set through PATCH /admin/knobs (default: start the sim)")
    arg(p, "--admin-token", help="bearer token for the server's /admin API")
    arg(p, "--server-command", help="start the server per trial from this template ({knob} fields), e.g. "
        "'vllm serve M --max-num-seqs {max_num_seqs}'; needs --server-url")  # fmt: skip
    arg(p, "--server-url", help="the base URL the --server-command server answers on")
    arg(p, "--server-health-path", default="/health", help="path polled until the server answers 200")
    arg(p, "--server-start-timeout", type=positive_float, default=600.0, help="seconds to wait for it")
    p.add_argument("--param", action="append", type=_param, default=[], metavar="NAME=VALUE",
                   help="override an experiment parameter (repeatable)")  # fmt: skip
    arg(p, "--repeats", type=int, help="runs per trial (default: the experiment's)")
    arg(p, "--time-scale", type=positive_float, default=1.0, help="multiply every stage duration")
    arg(p, "--users-scale", type=positive_float, default=1.0, help="multiply users and rates")
    arg(p, "--speed", type=positive_float, help="sim speed (default: the experiment's sim.speed)")
    arg(p, "--results", default="results", help="run directories go to RESULTS/experiments/")
    arg(p, "--run-id", help="the experiment directory's name (default NAME-UTCTIMESTAMP)")
    arg(p, "--resume", action="store_true", help="continue the experiment in --run-id after an interrupt")
    arg(p, "--sample-interval", type=positive_float, help="seconds between the server samples (GET /metrics) "
        "during a run (default: the experiment's sample_interval, 0.25 unless it says)")  # fmt: skip
    arg(p, "--seed", type=int, help="base of the runs' prompt seeds: run seed = SEED + 1000 x trial index + repeat"
        " - 1, so no two runs send the same prompts (default: a hash of the run id)")  # fmt: skip
    arg(p, "--prometheus", help="passed to loadlens load: server-side and GPU figures per trial")
    arg(p, "--slo-file", help="SLO file (loadlens load and the analysis)")
    arg(p, "--model", help="model name for loadlens load")
    arg(p, "--api-key", help="bearer token for the target")
    arg(p, "--lora-base", help="the served model's config.json or directory the experiment's LoRA adapters are "
        "made for (default with the sim: its model profile)")  # fmt: skip
    arg(p, "--server-adapter-dir", help="where the server reads RESULTS/experiments/RUN_ID/adapters (default: "
        "that path: the server shares this file system)")  # fmt: skip
    arg(
        p,
        "--device-probe-dir",
        help="multi_lora: take the allocator figures from the in-process probe's "
        "documents in this directory (a CUDA host's LOADLENS_PROBE_DIR) instead of the sim's /sim/device-state",
    )
    arg(p, "--training-metrics-port", type=int, help="training experiments: serve the loadlens_training_* series "
        "of the runs on this port (9647 is the local stack's training target; 0: any free port); each run then "
        "waits up to 10 s for a scrape before and after it, so a scraper sees it whole")  # fmt: skip
    arg(p, "--dry-run", action="store_true", help="validate and print the trials, start nothing")
    p.set_defaults(handler=run)


def _server(args: argparse.Namespace, exp_dir: Path, sim_spec: object, with_adapters: bool) -> ServerControl:
    from loadlens.experiment.models import SimServer as SimSpec

    assert isinstance(sim_spec, SimSpec)
    if args.server_command:
        if not args.server_url:
            raise UsageError("--server-command needs --server-url (where the started server answers)")
        return CommandServer(args.server_command, args.server_url, exp_dir / "trials", args.server_health_path,
                             args.server_start_timeout)  # fmt: skip
    if args.server_url:
        raise UsageError("--server-url is for --server-command; use --host for a running server")
    if args.host:
        return AdminServer(args.host, args.admin_token)
    lora_root = (exp_dir / "adapters").resolve() if with_adapters else None
    return SimServer(sim_spec, exp_dir / "server.log", speed=args.speed, lora_root=lora_root)


def _probe_dir(value: str | None) -> Path | None:
    if value and not Path(value).is_dir():
        raise UsageError(f"--device-probe-dir: {value} is not a directory")
    return Path(value) if value else None


def run(args: argparse.Namespace) -> int:
    from loadlens.experiment.training.spec import describe, training_names, training_path

    if args.list:
        for name in available_experiments():
            print(f"{name:<16} {load_experiment(name).spec.description}")
        for name in training_names():
            print(f"{name:<16} {describe(training_path(name) or Path(name))}")
        return 0
    if not args.experiment:
        raise UsageError("name an experiment (loadlens experiment --list) or a YAML file")
    training = training_path(args.experiment)
    if training is not None:  # kind: training, in process (loadlens/experiment/training/)
        from loadlens.experiment.training.cli import run_training

        return run_training(args, training, _print)
    try:
        exp = load_experiment(args.experiment).with_parameters(dict(args.param))
        trials = expand_trials(exp)
        slos = load_slos(args.slo_file or None)
    except (ExperimentError, SLOConfigError) as err:
        raise UsageError(str(err)) from err
    repeats, run_id = repeats_and_run_id(args, exp.spec.name, exp.spec.repeats)
    if any(t.host for t in trials) and (args.host or args.server_command):
        raise UsageError("the experiment gives per-trial hosts; drop --host/--server-command")
    exp_dir = Path(args.results) / "experiments" / run_id
    if args.dry_run:
        for t in trials:
            knobs = " ".join(f"{k}={v}" for k, v in t.knobs.items())
            adapters = f"  adapters {','.join(t.adapters)}" if t.adapters else ""
            print(
                f"{t.index + 1:>3} {t.name:<32} profile {t.profile:<12} {knobs}{'  host ' + t.host if t.host else ''}"
                f"{adapters}"
            )
        print(f"{len(trials)} trials x {repeats} repeats -> {exp_dir / EXPERIMENT_FILE}")
        return 0
    planned_adapters = expand_adapters(exp)
    if any(t.host for t in trials):
        server: ServerControl = UrlServer(None, args.admin_token)
    else:
        server = _server(args, exp_dir, exp.spec.sim, with_adapters=bool(planned_adapters))
    if planned_adapters:
        server.adapters = AdapterBook(planned_adapters, exp_dir / "adapters", args.server_adapter_dir)
    lora_base = args.lora_base or (exp.spec.sim.model_profile if isinstance(server, SimServer) else None)
    opts = RunOptions(
        directory=exp_dir,
        run_id=run_id,
        repeats=repeats,
        time_scale=args.time_scale,
        users_scale=args.users_scale,
        prometheus=args.prometheus,
        slo_file=args.slo_file,
        model=args.model,
        api_key=args.api_key,
        resume=args.resume,
        seed=args.seed,
        sample_interval=args.sample_interval or exp.spec.sample_interval,
        lora_base=lora_base,
        device=DeviceWatch(_probe_dir(args.device_probe_dir), token=args.api_key)
        if exp.spec.analysis.kind == "multi_lora"
        else None,
    )
    runner_cls = SearchRunner if exp.spec.search is not None else ExperimentRunner
    runner = runner_cls(exp, trials, server, opts, analyse=analyse(exp.spec.analysis, slos, exp.spec.search),
                        stop=stopper(exp.spec.analysis), say=lambda line: print(line, flush=True))  # fmt: skip
    try:
        runner.prepare()
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    try:
        try:
            server.start()
            server.check(trials)
        except ServerError as err:
            if "does not exist on" in str(err) or "--server-command" in str(err):
                raise UsageError(str(err)) from err
            print(f"loadlens experiment: error: {err}", file=sys.stderr)
            return 1
        result = runner.run()
    except SearchFailed as err:
        print(f"loadlens experiment: error: the search stopped: {err}", file=sys.stderr)
        return 1
    except Interrupted:
        print(f"loadlens experiment: interrupted; finished trials kept in {exp_dir / EXPERIMENT_FILE}")
        print(f"  continue with: loadlens experiment {args.experiment} --run-id {run_id} --resume")
        return 130
    finally:
        server.close()
    _print(result)
    page = write_html(result, exp_dir)
    print(f"results: {exp_dir / EXPERIMENT_FILE}\nreport: {page}")
    return 0 if result.completed else 1


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


def format_table(columns: list[tuple[str, str]], rows: list[list[str]]) -> str:
    heads = [f"{label} {unit}".strip() for label, unit in columns]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
    lines = [" ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += [" ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _print(result: ExperimentResult) -> None:
    for table in result.tables:
        print(f"\n{result.experiment.name}: {table.title}")
        cols = [(c.label, f"({c.unit})" if c.unit else "") for c in table.columns]
        print(format_table(cols, [[_cell(row.get(c.key)) for c in table.columns] for row in table.rows]))
    for fit in result.fits:
        if fit.error:
            print(f"fit {fit.formula}: {fit.error}")
        else:
            params = ", ".join(
                f"{k}={v:.4g}" + (f" ± {fit.params_err[k]:.2g}" if k in fit.params_err else "")
                for k, v in fit.params.items()
            )
            r2 = "" if fit.r2 is None else f"; R²={fit.r2:.4f}"
            optimum = "" if fit.optimum_x is None or fit.optimum_y is None else (
                f"; optimum {fit.x}={fit.optimum_x:.4g} -> {fit.optimum_y:.4g}")  # fmt: skip
            print(f"fit {fit.formula}: {params}{r2}{optimum}")
    for f in result.findings:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[f.passed]
        print(f"{mark} {f.name}: {f.detail}")
    failed = [t for t in result.trials if t.status not in ("done", "skipped")]
    for t in failed:
        print(f"trial {t.name}: {t.status}: {t.error}")
