"""``loadlens experiment training-stability|accumulation-sensitivity|FILE`` (``kind: training``): the training
procedures of guide 2.3 and 2.5, in process, on the experiment runner's result and report.

Exit status as every experiment: 0 done, 1 not every run finished, 2 a usage error before anything starts
(an unknown module in ``target_modules``, a rank above the layer's width, an accumulation of 0, ...), 130
interrupted (``--resume`` continues).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from loadlens.contracts.experiment_result import EXPERIMENT_FILE, ExperimentResult
from loadlens.contracts.slo import SLOConfigError, load_slos
from loadlens.experiment.errors import ExperimentError
from loadlens.experiment.html import write_html
from loadlens.experiment.run_args import repeats_and_run_id
from loadlens.experiment.runner import Interrupted
from loadlens.experiment.training.analysis import training_analyse
from loadlens.experiment.training.runner import TrainingRunner
from loadlens.experiment.training.spec import load_training
from loadlens.util.cliutil import UsageError

SERVER_FLAGS = (
    "host",
    "server_command",
    "server_url",
    "prometheus",
    "lora_base",
    "device_probe_dir",
    "sample_interval",
)


def run_training(args: argparse.Namespace, path: Path, printer: Callable[[ExperimentResult], None]) -> int:
    given = [f for f in SERVER_FLAGS if getattr(args, f, None)]
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')}: a training experiment starts no server")
    if getattr(args, "seed", None) is not None:
        raise UsageError("--seed: a training experiment sends no prompts; its seeds are its repeats (--repeats)")
    try:
        exp = load_training(path, dict(args.param))
        slos = load_slos(args.slo_file or None)
    except (ExperimentError, SLOConfigError) as err:
        raise UsageError(str(err)) from err
    if any(t.config.device == "cuda" for t in exp.trials):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"{path.name}: parameters.device: cuda, but torch sees no CUDA device here")
    repeats, run_id = repeats_and_run_id(args, exp.spec.name, exp.spec.repeats)
    exp_dir = Path(args.results) / "experiments" / run_id
    if args.dry_run:
        for t in exp.trials:
            settings = " ".join(f"{k}={v}" for k, v in t.params.items())
            print(f"{t.index + 1:>3} {t.name:<24} steps {t.config.total_steps:<5} {settings}")
        print(f"{len(exp.trials)} trials x {repeats} seeds -> {exp_dir / EXPERIMENT_FILE}")
        return 0
    metrics = server = None
    if args.training_metrics_port is not None:
        from exporters.training.metrics import TrainingMetrics, serve

        metrics = TrainingMetrics()
        server = serve(metrics, host="127.0.0.1", port=args.training_metrics_port)
        print(f"training series on {server.url}/metrics", flush=True)
    runner = TrainingRunner(exp, exp_dir, run_id, repeats, slos, resume=args.resume,
                            say=lambda line: print(line, flush=True), metrics=metrics,
                            scraped=server.wait_for_scrape if server is not None else None)  # fmt: skip
    try:
        runner.prepare()
    except ExperimentError as err:
        raise UsageError(str(err)) from err
    try:
        result = runner.run(training_analyse(exp.spec.analysis))
    except Interrupted:
        print(f"loadlens experiment: interrupted; finished runs kept in {exp_dir / EXPERIMENT_FILE}")
        print(f"  continue with: loadlens experiment {args.experiment} --run-id {run_id} --resume")
        return 130
    finally:
        if server is not None:
            server.close()
    printer(result)
    page = write_html(result, exp_dir)
    print(f"results: {exp_dir / EXPERIMENT_FILE}\nreport: {page}")
    return 0 if result.completed else 1
