"""Runs a training experiment: every trial once per seed (repeats), in process, one after the other; after
every run ``experiment_result.json`` is rewritten (the same typed result as the load experiments, server mode
``none``), so an interrupted experiment keeps its finished runs and ``--resume`` continues with the next.

Layout of the experiment directory (``RESULTS/experiments/RUN_ID/``)::

    experiment_result.json                the typed result (loadlens.contracts.experiment_result)
    experiment.yaml                       the experiment as it ran (parameters filled in)
    report.html                           tables and plots
    trials/TRIAL/rK/training_run.json     the run's per-step series, evaluations, crash and alerts
    trials/TRIAL/rK/checkpoints/last.pt   the last checkpoint the run saved (trainable weights)
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from loadlens.contracts.experiment_result import (
    EXPERIMENT_FILE,
    SCHEMA,
    ExperimentInfo,
    ExperimentResult,
    ServerInfo,
    Trial,
    TrialRun,
    parse_experiment_result,
)
from loadlens.contracts.slo import SLOConfig
from loadlens.experiment.errors import ExperimentError
from loadlens.experiment.figures import aggregate
from loadlens.experiment.runner import Interrupted, _duration, _now, write_result
from loadlens.experiment.training.spec import TrainingExperiment, TrainingTrial

RUN_FILE = "training_run.json"
SCRAPE_WAIT_S = 10.0
"""The most a run waits for a scrape of the training series, before and after (five of the local stack's 2 s
scrape intervals)."""


class TrainingRunner:
    def __init__(
        self,
        exp: TrainingExperiment,
        directory: Path,
        run_id: str,
        repeats: int,
        slos: SLOConfig,
        *,
        resume: bool = False,
        say: Callable[[str], None] = print,
        metrics: Any = None,
        scraped: Callable[[float], bool] | None = None,
        scrape_wait_s: float = SCRAPE_WAIT_S,
    ) -> None:
        """``metrics``: a ``TrainingMetrics`` the runs feed; ``scraped``: its server's ``wait_for_scrape``,
        when a scraper watches it: each run then waits (at most ``scrape_wait_s``) for one scrape after its
        series exist at 0 and one after it ends, so a run of a few seconds is seen whole (``increase()`` needs
        the 0 before the first event). The first wait that times out stops the waiting, with one line."""
        self.exp, self.dir, self.run_id, self.repeats, self.slos = exp, directory, run_id, repeats, slos
        self.resume, self.say, self.metrics = resume, say, metrics
        self.scraped, self.scrape_wait_s = scraped, scrape_wait_s
        self.result: ExperimentResult | None = None

    def fingerprint(self) -> str:
        body = json.dumps({"spec": self.exp.fingerprint, "repeats": self.repeats}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    def prepare(self) -> None:
        """Load the previous result when resuming; refuse to overwrite one. Raises :class:`ExperimentError`."""
        previous = self.dir / EXPERIMENT_FILE
        if self.resume:
            if not previous.is_file():
                raise ExperimentError(f"--resume: {previous} does not exist")
            old = parse_experiment_result(json.loads(previous.read_text()), str(previous))
            if old.experiment.sha256 != self.fingerprint():
                raise ExperimentError(f"--resume: {previous} was written by a different experiment definition, "
                                      "parameters or repeats; start a new run id")  # fmt: skip
            if [t.name for t in old.trials] != [t.name for t in self.exp.trials]:
                raise ExperimentError(f"--resume: {previous} has other trials")
            self.result = old
        elif previous.exists():
            raise ExperimentError(f"{previous} exists: pass --resume to continue it, or another --run-id")
        self.dir.mkdir(parents=True, exist_ok=True)
        doc = {**self.exp.spec.model_dump(mode="json"), "repeats": self.repeats}
        (self.dir / "experiment.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def _fresh(self) -> ExperimentResult:
        spec = self.exp.spec
        return ExperimentResult(
            schema=SCHEMA,
            run_id=self.run_id,
            experiment=ExperimentInfo(
                name=spec.name, description=spec.description, source=str(self.exp.source), sha256=self.fingerprint(),
                parameters=dict(spec.parameters), repeats=self.repeats, time_scale=1.0, users_scale=1.0,
                analysis=spec.analysis.kind,
            ),
            server=ServerInfo(mode="none"),
            start_time=_now(),
            trials=[Trial(index=t.index, name=t.name, params=dict(t.params), profile="training")
                    for t in self.exp.trials],
        )  # fmt: skip

    def write(self) -> None:
        assert self.result is not None
        write_result(self.dir, self.result)

    def _one(self, trial: TrainingTrial, repeat: int) -> TrialRun:
        from dataclasses import replace

        from loadlens.experiment.training.engine import train
        from loadlens.experiment.training.figures import run_figures

        cfg = replace(trial.config, seed=self.exp.seed(repeat))
        run_dir = self.dir / "trials" / trial.name / f"r{repeat}"
        run_dir.mkdir(parents=True, exist_ok=True)
        name = f"{self.run_id}/{trial.name}/r{repeat}"
        if self.metrics is not None:
            self.metrics.start_run(name, policy=cfg.checkpoints == "dynamic")
            self._await_scrape()
        start = time.time()
        rel = str((run_dir / RUN_FILE).relative_to(self.dir))
        try:
            record = train(cfg, run_name=name,
                           checkpoint_dir=run_dir / "checkpoints", slos=self.slos, metrics=self.metrics)  # fmt: skip
        except (RuntimeError, ValueError) as err:  # not a crash of the definitions: the run failed (exit 1)
            end = time.time()
            self._await_scrape()
            return TrialRun(
                repeat=repeat, run_id=f"r{repeat}", result_path=rel, log_path=rel, exit_code=1, completed=False,
                start_timestamp=start, end_timestamp=end, duration_s=round(end - start, 3),
                error=f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}",
            )  # fmt: skip
        end = time.time()
        self._await_scrape()
        figures, alerts = run_figures(cfg, record, self.slos)
        doc = {"config": asdict(cfg), "record": asdict(record), "alerts": asdict(alerts), "figures": figures}
        (run_dir / RUN_FILE).write_text(json.dumps(doc, indent=1, default=str) + "\n")
        return TrialRun(
            repeat=repeat, run_id=f"r{repeat}", result_path=rel, log_path=rel, exit_code=0,
            completed=record.crash is None, start_timestamp=start, end_timestamp=end,
            duration_s=round(end - start, 3), figures=figures,
        )  # fmt: skip

    def _await_scrape(self) -> None:
        if self.scraped is None:
            return
        if not self.scraped(self.scrape_wait_s):
            wait = f"{self.scrape_wait_s:g} s"
            self.say(f"no scrape of the training series within {wait}: the runs no longer wait for one")
            self.scraped = None

    def run(self, analyse: Callable[[ExperimentResult], ExperimentResult]) -> ExperimentResult:
        if self.result is None:
            self.result = self._fresh()
        self.result.interrupted = False
        name = self.exp.spec.name
        work = {t.name: t.config.total_steps * t.config.accumulation for t in self.exp.trials}
        todo = [(t, r) for t in self.exp.trials for r in range(1, self.repeats + 1)
                if r not in {run.repeat for run in self.result.trials[t.index].runs if run.error is None}]  # fmt: skip
        total, done_work, spent = len(todo), 0, 0.0
        started = time.monotonic()
        self.write()
        try:
            for i, (trial, repeat) in enumerate(todo, 1):
                left = sum(work[t.name] for t, _ in todo[i - 1 :])
                eta = f", ETA {_duration(spent / done_work * left)}" if done_work else ""
                self.say(f"experiment {name}: trial {trial.index + 1}/{len(self.exp.trials)} {trial.name} seed "
                         f"{self.exp.seed(repeat)} (run {i}/{total}); elapsed "
                         f"{_duration(time.monotonic() - started)}{eta}")  # fmt: skip
                t0 = time.monotonic()
                run = self._one(trial, repeat)
                spent += time.monotonic() - t0
                done_work += work[trial.name]
                record = self.result.trials[trial.index]
                record.runs = sorted([*(r for r in record.runs if r.repeat != repeat), run], key=lambda r: r.repeat)
                record.figures = aggregate(record.runs)
                if run.error is not None:
                    record.status, record.error = "failed", run.error
                    self.say(f"experiment {name}: {trial.name} seed {self.exp.seed(repeat)} failed: {run.error}")
                elif run.figures.get("crashed"):
                    self.say(f"experiment {name}: {trial.name} seed {self.exp.seed(repeat)} crashed at step "
                             f"{run.figures.get('crash_step'):.0f}")  # fmt: skip
                if len(record.runs) == self.repeats and all(r.error is None for r in record.runs):
                    record.status, record.error = "done", None
                self.write()
        except KeyboardInterrupt:
            self.result.interrupted = True
            self.result.end_time = _now()
            self.write()
            raise Interrupted from None
        self.result.completed = all(t.status == "done" for t in self.result.trials)
        self.result.end_time = _now()
        self.result = analyse(self.result)
        self.write()
        return self.result
