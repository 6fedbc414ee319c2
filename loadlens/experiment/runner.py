"""Runs an experiment: each trial's server configuration, then its load (``loadlens load`` as a child process,
one per repeat), the server's gauges sampled meanwhile, the figures read back from ``benchmark_result.json``;
after every run ``experiment_result.json`` is rewritten, so an interrupted experiment keeps its finished
trials and ``--resume`` continues with the first unfinished one.

Layout of an experiment directory (``RESULTS/experiments/RUN_ID/``)::

    experiment_result.json          the typed result (loadlens.contracts.experiment_result)
    experiment.yaml                 the experiment as it ran (parameters filled in)
    report.html                     tables and plots
    profiles/PROFILE.yaml           each trial profile as given to loadlens load (warmup prepended, vars filled)
    trials/TRIAL/rK/benchmark_result.json, load.log
    server.log                      the sim's log (sim mode)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from loadlens.contracts.experiment_result import (
    EXPERIMENT_FILE,
    SCHEMA,
    AdapterRecord,
    ExperimentInfo,
    ExperimentResult,
    ServerInfo,
    Trial,
    TrialRun,
    parse_experiment_result,
)
from loadlens.contracts.slo import load_slos
from loadlens.experiment.device import DeviceWatch
from loadlens.experiment.figures import aggregate, extract_figures, measured_windows
from loadlens.experiment.models import SAMPLE_INTERVAL_S, Experiment, ExperimentError, PlannedTrial, substitute
from loadlens.experiment.sampler import ServerSampler
from loadlens.experiment.servers import ServerControl, ServerError
from loadlens.experiment.swap_driver import SwapDriver

RESULT_FILE = "benchmark_result.json"


@dataclass
class RunOptions:
    directory: Path
    run_id: str
    repeats: int
    time_scale: float = 1.0
    users_scale: float = 1.0
    prometheus: str | None = None
    slo_file: str | None = None
    model: str | None = None
    api_key: str | None = None
    resume: bool = False
    sample_interval: float = SAMPLE_INTERVAL_S
    lora_base: str | None = None
    """The base model the experiment's adapters are made for (config.json, model directory, sim profile)."""
    device: DeviceWatch | None = None  # multi_lora: VRAM steps per adapter and utilisation (experiment/device.py)
    seed: int | None = None
    """The base of every run's prompt seed (``--seed``); None: one derived from the run id (:func:`run_seed`)."""


SEEDS_PER_TRIAL = 1000
"""Room for each trial's repeats in the run seeds (``--repeats`` is at most 100)."""


def run_seed(opts: RunOptions, trial_index: int, repeat: int) -> int:
    """The prompt seed of one run (``loadlens load --seed``): the base plus ``SEEDS_PER_TRIAL`` per trial plus
    the repeat, so no two runs of an experiment send the same prompts. The load generator draws request k's
    prompt from (seed, k), so with one seed every trial after the first would resend the earlier trials'
    prompts, and a server with prefix caching on (vLLM's default, and the sim's) would serve their blocks
    from its cache: their prefills shorter than the load asks for. The base defaults to a hash of the run id:
    a new run against a server still holding an earlier run's blocks sends other prompts, and ``--resume``
    keeps the seeds of the runs it continues."""
    base = opts.seed if opts.seed is not None else int(hashlib.sha256(opts.run_id.encode()).hexdigest()[:6], 16)
    return base + SEEDS_PER_TRIAL * trial_index + repeat - 1


def write_result(directory: Path, result: ExperimentResult) -> None:
    """``experiment_result.json`` in ``directory``, checked against its schema first and replaced whole (a
    reader never sees half a file; an interrupted run leaves the previous one)."""
    doc = result.dump()
    parse_experiment_result(doc)
    tmp = directory / (EXPERIMENT_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, directory / EXPERIMENT_FILE)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _load_argv(
    profile: Path, host: str, out_dir: Path, run_id: str, opts: RunOptions, dry: bool, seed: int | None = None
) -> list[str]:
    argv = [sys.executable, "-m", "loadlens.cli", "load", "--profile", str(profile), "--host", host, "--headless"]
    argv += ["--results", str(out_dir), "--run-id", run_id, "--metrics-port", "0", "--progress-interval", "0"]
    if seed is not None:
        argv += ["--seed", str(seed)]
    argv += ["--time-scale", repr(opts.time_scale), "--users-scale", repr(opts.users_scale)]
    if opts.prometheus:
        argv += ["--prometheus", opts.prometheus]
    if opts.slo_file:
        argv += ["--slo-file", opts.slo_file]
    if opts.model:
        argv += ["--model", opts.model]
    if dry:
        argv.append("--dry-run")
    return argv


def trial_profile(exp: Experiment, trial: PlannedTrial, base: Path) -> dict[str, Any] | str:
    """The profile document a trial runs: vars filled in and the experiment's warmup prepended (unless the
    profile has a warmup stage); a named packaged profile stays a name."""
    raw = exp.spec.profiles[trial.profile]
    if isinstance(raw, str):
        return raw
    doc: dict[str, Any] = substitute(raw, {**exp.spec.parameters, **trial.vars, "adapter_mix": dict(trial.mix)})
    stages = doc.get("stages")
    warm = exp.spec.warmup
    if (
        warm is not None
        and isinstance(stages, list)
        and not any(isinstance(s, dict) and s.get("warmup") for s in stages)
    ):
        doc = {**doc, "stages": [{"name": "warmup", "warmup": True, **warm.model_dump()}, *stages]}
    return doc


def planned_seconds(doc: dict[str, Any] | str, time_scale: float) -> float | None:
    """A trial's planned length (durations, and max_duration for request-count stages as an upper bound)."""
    if isinstance(doc, str):
        return None
    total = 0.0
    for s in doc.get("stages", []):
        if not isinstance(s, dict):
            return None
        if "spikes" in s and isinstance(s["spikes"], dict):
            sp = s["spikes"]
            total += sp.get("count", 1) * sp.get("duration", 0) + (sp.get("count", 1) + 1) * sp.get("baseline", 0)
        elif "duration" in s:
            total += float(s["duration"])
        else:
            total += min(float(s.get("max_duration", 600)), 30.0)
    return total * time_scale + 4.0  # start-up of loadlens load and Locust


class Interrupted(Exception):
    """Ctrl-C during a trial: the experiment stops after writing what finished."""


class ExperimentRunner:
    def __init__(
        self,
        exp: Experiment,
        trials: list[PlannedTrial],
        server: ServerControl,
        opts: RunOptions,
        *,
        analyse: Callable[[ExperimentResult], ExperimentResult],
        stop: Callable[[Trial], str | None] | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.exp = exp
        self.trials = trials
        self.server = server
        self.opts = opts
        self.analyse = analyse
        self.stop = stop
        """After each finished trial: a reason to skip the rest (burst sizes beyond the failing one), or None."""
        self.say = say
        self.dir = opts.directory
        self.profiles: dict[str, Path] = {}
        self.adapter_records: list[AdapterRecord] = []
        self.result: ExperimentResult | None = None
        self._finished: list[tuple[PlannedTrial, int]] = []

    # --- before anything runs -----------------------------------------------------------------------------

    def _fingerprint(self) -> str:
        # --seed and a sample interval are in it only when set, so results written before them still resume.
        extra: dict[str, object] = {} if self.opts.seed is None else {"seed": self.opts.seed}
        if self.opts.sample_interval != SAMPLE_INTERVAL_S:
            extra["sample_interval"] = self.opts.sample_interval
        body = json.dumps(
            {"sha256": self.exp.sha256, "parameters": self.exp.spec.parameters, "repeats": self.opts.repeats,
             "time_scale": self.opts.time_scale, "users_scale": self.opts.users_scale, **extra},
            sort_keys=True,
        )  # fmt: skip
        return hashlib.sha256(body.encode()).hexdigest()

    def prepare(self) -> None:
        """Write each trial's profile and validate it with ``loadlens load --dry-run``; load the previous
        result when resuming. Raises :class:`ExperimentError` (a usage error)."""
        (self.dir / "profiles").mkdir(parents=True, exist_ok=True)
        book = self.server.adapters
        if book:
            assert book is not None
            if not self.opts.lora_base:
                raise ExperimentError(
                    f"{self.exp.source.name}: adapters: give --lora-base (the served model's config.json or "
                    "directory) to make them for"
                )
            self.adapter_records = book.make(self.opts.lora_base)
        checks: dict[str, PlannedTrial] = {}
        for t in self.trials:
            checks.setdefault(self.write_profile(t), t)
        self._dry_runs(list(checks.values()))
        previous = self.dir / EXPERIMENT_FILE
        if self.opts.resume:
            if not previous.is_file():
                raise ExperimentError(f"--resume: {previous} does not exist")
            old = parse_experiment_result(json.loads(previous.read_text()), str(previous))
            if old.experiment.sha256 != self._fingerprint():
                raise ExperimentError(
                    f"--resume: {previous} was written by a different experiment definition, parameters, "
                    "repeats or scales; start a new run id"
                )
            if not self.same_trials(old):
                raise ExperimentError(f"--resume: {previous} has other trials")
            self.result = old
        elif previous.exists():
            raise ExperimentError(f"{previous} exists: pass --resume to continue it, or another --run-id")
        (self.dir / "experiment.yaml").write_text(
            yaml.safe_dump(self.exp.spec.model_dump(mode="json"), sort_keys=False)
        )

    def _dry_runs(self, trials: list[PlannedTrial]) -> None:
        """``loadlens load --dry-run`` of each trial's profile, as many at once as there are CPUs (each is
        mostly its interpreter's start-up); the first failing one in trial order is the error."""
        width = max(1, os.cpu_count() or 1)
        failures: dict[int, str] = {}
        for lo in range(0, len(trials), width):
            batch = trials[lo : lo + width]
            procs = [
                subprocess.Popen(
                    _load_argv(self.profiles[t.name], "http://127.0.0.1:9", self.dir, "dry", self.opts, dry=True),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for t in batch
            ]
            for i, proc in enumerate(procs, lo):
                try:
                    _, err = proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                if proc.returncode != 0:
                    failures[i] = (err.strip().splitlines() or ["(no message)"])[-1]
            if failures:
                break
        if failures:
            i = min(failures)
            line = failures[i].removeprefix("loadlens load: error: ")
            raise ExperimentError(f"{self.exp.source.name}: profiles.{trials[i].profile}: {line}")

    def write_profile(self, t: PlannedTrial) -> str:
        """Write the trial's profile under profiles/ (a named profile stays a name); returns a key equal for
        equal profiles."""
        doc = trial_profile(self.exp, t, self.dir)
        if isinstance(doc, str):
            self.profiles[t.name] = Path(doc)
            return doc
        text = yaml.safe_dump(doc, sort_keys=False)
        suffix = "-".join([*(f"{k}={v}" for k, v in sorted(t.vars.items())), *(f"{a}={w:g}" for a, w in t.mix)])
        path = self.dir / "profiles" / (f"{t.profile}-{suffix}.yaml" if suffix else f"{t.profile}.yaml")
        path.write_text(text)
        self.profiles[t.name] = path
        return hashlib.sha256(text.encode()).hexdigest()

    def same_trials(self, old: ExperimentResult) -> bool:
        return [t.name for t in old.trials] == [t.name for t in self.trials]

    def _fresh(self) -> ExperimentResult:
        spec = self.exp.spec
        return ExperimentResult(
            schema=SCHEMA,
            run_id=self.opts.run_id,
            experiment=ExperimentInfo(
                name=spec.name,
                description=spec.description,
                source=str(self.exp.source),
                sha256=self._fingerprint(),
                parameters=dict(spec.parameters),
                repeats=self.opts.repeats,
                time_scale=self.opts.time_scale,
                users_scale=self.opts.users_scale,
                analysis=spec.analysis.kind,
                sample_interval=self.opts.sample_interval,
            ),
            server=ServerInfo(**self.server.describe()),
            start_time=_now(),
            adapters=list(self.adapter_records),
            trials=[
                Trial(
                    index=t.index,
                    name=t.name,
                    params=dict(t.params),
                    knobs=dict(t.knobs),
                    profile=t.profile,
                    adapters=list(t.adapters),
                )  # fmt: skip
                for t in self.trials
            ],
        )

    # --- running ------------------------------------------------------------------------------------------

    def write(self) -> None:
        assert self.result is not None
        write_result(self.dir, self.result)

    def _run_load(self, trial: PlannedTrial, url: str, repeat: int) -> TrialRun:
        out_dir = self.dir / "trials" / trial.name
        run_id = f"r{repeat}"
        run_dir = out_dir / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        log = run_dir / "load.log"
        seed = run_seed(self.opts, trial.index, repeat)
        argv = _load_argv(self.profiles[trial.name], url, out_dir, run_id, self.opts, dry=False, seed=seed)
        env = dict(os.environ)
        if self.opts.api_key:
            env["LOADLENS_LOAD_API_KEY"] = self.opts.api_key
        result_path = run_dir / RESULT_FILE
        if result_path.exists():
            result_path.unlink()  # a partial run of an interrupted experiment
        start = time.time()
        driver = SwapDriver(url, trial.swaps, self.server.adapters, self.server.token)
        device = DeviceWatch.start(self.opts.device, url, trial.adapters)  # before the load: it sends requests
        with log.open("wb") as out, ServerSampler(url, self.opts.sample_interval) as sampler, driver, device:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                code = proc.wait()
            except KeyboardInterrupt:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                raise Interrupted from None
        end = time.time()
        run = TrialRun(
            repeat=repeat,
            run_id=run_id,
            result_path=str(result_path.relative_to(self.dir)),
            log_path=str(log.relative_to(self.dir)),
            exit_code=code,
            completed=False,
            start_timestamp=start,
            end_timestamp=end,
            duration_s=round(end - start, 3),
            seed=seed,
        )
        if not result_path.is_file():
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            run.error = f"loadlens load exited {code} without results: {tail[0][:300]}"
            return run
        doc = json.loads(result_path.read_text())
        run.completed = bool(doc.get("run", {}).get("completed"))
        run.figures = extract_figures(doc)
        run.server = sampler.summary(
            measured_windows(doc), load_slos(self.opts.slo_file or None).lora_swap.delay_seconds, driver
        )
        run.figures.update(device.figures(measured_windows(doc)))
        completed = run.figures.get("completed")
        if run.server.preemptions is not None and completed:
            run.figures["preemptions_per_request"] = run.server.preemptions / completed
        verdict = doc.get("verdict") or {}
        run.verdict_status = verdict.get("status")
        run.verdict_headline = verdict.get("headline")
        if code not in (0, 3):
            run.error = f"loadlens load exited {code} (log: {run.log_path})"
        elif not run.completed:
            run.error = "the run did not complete every stage"
        return run

    def prepared_run(self, trial: PlannedTrial, record: Trial, repeat: int) -> TrialRun:
        """The server configured for ``trial`` (knobs, a started server, adapters), one load run, the
        configuration undone; raises :class:`ServerError` when the server cannot be configured."""
        t0 = time.monotonic()
        try:
            url = self.server.prepare(trial)
            prepared = time.monotonic() - t0
            record.target = url
            run = self._run_load(trial, url, repeat)
            run.prepare_s = round(prepared, 3)
            return run
        finally:
            self.server.finish(trial)
            for warning in self.server.warnings:
                self.say(f"experiment {self.exp.spec.name}: warning: {warning}")
            self.server.warnings.clear()

    def run(self) -> ExperimentResult:
        """Every unfinished trial in order; raises :class:`Interrupted` after writing what finished."""
        self.result = self.result or self._fresh()
        self.result.interrupted = False
        self.result.end_time = None
        total = len(self.trials) * self.opts.repeats
        todo = [(t, r) for t in self.trials for r in range(1, self.opts.repeats + 1)]
        done_runs = {(tr.name, run.repeat) for tr in self.result.trials for run in tr.runs if run.error is None}
        for tr in self.result.trials:  # a failed run is run again on resume
            tr.runs = [run for run in tr.runs if run.error is None]
        started = time.monotonic()
        elapsed_runs: list[float] = []
        planned = {
            t.name: planned_seconds(trial_profile(self.exp, t, self.dir), self.opts.time_scale) for t in self.trials
        }
        self.write()
        try:
            for i, (trial, repeat) in enumerate(todo, 1):
                record = self.result.trials[trial.index]
                if (trial.name, repeat) in done_runs or record.status == "skipped":
                    continue
                remaining = [planned[t.name] or (statistics.fmean(elapsed_runs) if elapsed_runs else 0.0)
                             for t, r in todo[i - 1:] if (t.name, r) not in done_runs]  # fmt: skip
                if elapsed_runs and all(planned[t.name] for t, _ in todo):
                    # measured vs planned ratio corrects the estimate (until_requests stages, start-up)
                    ratio = sum(elapsed_runs) / sum(planned[t.name] or 0.0 for t, _ in self._finished)
                    remaining = [x * ratio for x in remaining]
                knobs = " ".join(f"{k}={v}" for k, v in trial.knobs.items()) or "no knobs"
                self.say(
                    f"experiment {self.exp.spec.name}: trial {trial.index + 1}/{len(self.trials)} {trial.name}"
                    f" repeat {repeat}/{self.opts.repeats} (run {i}/{total}; {knobs}); elapsed"
                    f" {_duration(time.monotonic() - started)}, ETA {_duration(sum(remaining))}"
                )
                t0 = time.monotonic()
                try:
                    run = self.prepared_run(trial, record, repeat)
                except ServerError as err:
                    record.status, record.error = "failed", str(err)
                    self.say(f"experiment {self.exp.spec.name}: trial {trial.name} failed: {err}")
                    self.write()
                    continue
                elapsed_runs.append(time.monotonic() - t0)
                self._finished.append((trial, repeat))
                record.runs.append(run)
                record.figures = aggregate(record.runs)
                ok = [r for r in record.runs if r.error is None]
                if run.error:
                    record.status, record.error = "failed", run.error
                    self.say(f"experiment {self.exp.spec.name}: trial {trial.name} repeat {repeat}: {run.error}")
                elif len(ok) == self.opts.repeats:
                    record.status, record.error = "done", None
                    reason = self.stop(record) if self.stop is not None else None
                    if reason is not None:
                        for later in self.result.trials[trial.index + 1 :]:
                            later.status, later.error = "skipped", reason
                        self.say(f"experiment {self.exp.spec.name}: {reason}; the remaining trials are skipped")
                self.write()
        except (Interrupted, KeyboardInterrupt):  # Ctrl-C outside a load too (a server starting, a PATCH)
            self.result.interrupted = True
            self.result.end_time = _now()
            self.write()
            raise Interrupted from None
        self.result.completed = all(t.status in ("done", "skipped") for t in self.result.trials)
        self.result.end_time = _now()
        self.result = self.analyse(self.result)
        self.write()
        return self.result
