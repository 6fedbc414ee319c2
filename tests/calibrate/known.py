"""Known answers for the calibration tests: a sim with hidden step-time parameters, run over calibration
stages in virtual time, observed as calibrate observes a real server (its ``vllm:`` counters, its client
figures)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from exporters.serving.calibrate.fit import FitResult
from exporters.serving.calibrate.frontend_fit import FrontendFit
from exporters.serving.calibrate.iteration_log import LoggedStep, parse
from exporters.serving.calibrate.observations import Stage
from exporters.serving.calibrate.profile_out import write_profile
from exporters.serving.calibrate.replay import StageLoad, replay
from exporters.serving.engines.sim.iteration_details import IterationDetailsLogger
from exporters.serving.engines.sim.virtual_time import START
from loadlens.contracts.gpu_profile import GPUProfile, load_gpu_profile
from loadlens.contracts.model_profile import ModelProfile, load_model_profile
from tests.support.paths import ROOT

MODEL = ROOT / "benchmarks" / "calibration" / "tiny-llama.yaml"
HIDDEN = {
    "step_overhead_s": 0.0021,
    "per_seq_s": 0.00013,
    "s_per_flop": 2.5e-11,
    "s_per_byte": 0.0,
    "insertion_s": 0.0014,
}
"""The hidden parameters, far from any packaged profile: a 2.1 ms step, 0.13 ms per sequence, 40 GFLOP/s,
1.4 ms per admitting step, and no memory term (the profile's bandwidth is written as free, so every step is
compute-bound, as the CPU rig's fit finds)."""
HIDDEN_FRONTEND = {"frontend_fixed_s": 0.0017, "frontend_per_running_s": 0.0011}
"""The hidden API-server stage, of the CPU rig's size: 1.7 ms a request, 1.1 ms per running request of a step."""

LOADS = {
    "c1-p240": StageLoad(1, 240, 48, 4.0, warmup_s=0.5),
    "c3-p240": StageLoad(3, 240, 48, 4.0, warmup_s=0.5),
    "c6-p240": StageLoad(6, 240, 48, 4.0, warmup_s=0.5),
    "p40-c2": StageLoad(2, 40, 48, 4.0, warmup_s=0.5),
    "p600-c2": StageLoad(2, 600, 48, 4.0, warmup_s=0.5),
    "p360-c4": StageLoad(4, 360, 48, 4.0, warmup_s=0.5),
}


def model() -> ModelProfile:
    return load_model_profile(str(MODEL))


def hidden_profile(tmp: Path, frontend: bool = True) -> GPUProfile:
    """The hidden sim; ``frontend=False``: without its API-server stage."""
    fit = FitResult(values=dict(HIDDEN), stderr=dict.fromkeys(HIDDEN, 0.0))
    front = FrontendFit(dict(HIDDEN_FRONTEND), dict.fromkeys(HIDDEN_FRONTEND, 0.0)) if frontend else None
    return write_profile(
        fit, load_gpu_profile("h100-sxm"), tmp / "hidden.yaml", "hidden", "known-answer test", frontend=front
    )


def observe(gpu: GPUProfile, names: list[str], delivery_noise_s: float = 0.0) -> list[Stage]:
    """Each stage as calibrate reads a sweep's trial: client figures and engine counter increases; with
    ``delivery_noise_s``, a host that delays each token on its way to the client (delivery_noise.py)."""
    stages = []
    for name in names:
        load = LOADS[name]
        got = replay(model(), gpu, load, delivery_noise_s=delivery_noise_s)
        figs = {k: v for k, v in got.figures.items() if v is not None}
        stages.append(
            Stage(
                name,
                load.users,
                float(load.prompt),
                float(load.output),
                load.duration_s,
                int(figs["completed"]),
                figs,
                got.counters,
                got.kv_capacity,
            )  # fmt: skip
        )
    return stages


def experiment_doc(stages: list[Stage], repeats: int = 1) -> dict[str, object]:
    """An ``experiment_result.json`` whose trials are these stages, as a calibration sweep writes it; with
    ``repeats``, each trial holds that many identical runs."""
    from loadlens.contracts.experiment_result import (
        ExperimentInfo,
        ExperimentResult,
        Scalar,
        ServerInfo,
        ServerSample,
        Stat,
        Trial,
        TrialRun,
    )  # fmt: skip

    trials = []
    for i, s in enumerate(stages):
        figures: dict[str, float | None] = dict(s.figures)
        figures.update(completed=float(s.completed), duration=s.duration_s,
                       total_input_tokens=s.prompt_tokens * s.completed,
                       total_output_tokens=s.output_tokens * s.completed)  # fmt: skip
        cap = s.kv_capacity
        server = ServerSample(engine_counters=dict(s.counters), kv_cache_blocks=cap.blocks if cap else None,
                              kv_cache_block_size=cap.block_size if cap else None)  # fmt: skip
        runs = [TrialRun(repeat=r, run_id=f"r{r}", result_path=f"trials/{s.name}/r{r}/benchmark_result.json",
                         log_path=f"trials/{s.name}/r{r}/load.log", exit_code=0, completed=True, start_timestamp=0.0,
                         end_timestamp=s.duration_s, duration_s=s.duration_s, figures=figures,
                         server=server) for r in range(1, repeats + 1)]  # fmt: skip
        stats = {k: Stat(mean=v, n=repeats, values=[v] * repeats) for k, v in figures.items() if v is not None}
        params: dict[str, Scalar] = {"users": s.users, "prompt_tokens": round(s.prompt_tokens)}
        trials.append(Trial(index=i, name=s.name, params=params, profile="closed", status="done", runs=runs,
                            figures=stats))  # fmt: skip
    info = ExperimentInfo(name="calibration-sweep", source="calibration-sweep.yaml", sha256="0" * 64, repeats=repeats,
                          time_scale=1.0, users_scale=1.0, analysis="table")  # fmt: skip
    result = ExperimentResult(run_id="known", experiment=info, server=ServerInfo(mode="sim"), start_time="t",
                              trials=trials, completed=True)  # fmt: skip
    return result.dump()


def logged_stages(gpu: GPUProfile, names: list[str]) -> tuple[list[Stage], list[LoggedStep]]:
    """Each stage replayed on ``gpu`` with the sim writing vLLM's iteration line for each step, the stages an
    hour apart on the log's clock: the stages with their runs' spans, and the log's steps as calibrate parses
    them."""
    lines: list[str] = []
    stages = []
    for i, name in enumerate(names):
        offset, load = 1000.0 * i, LOADS[name]

        def loggers(clock: Callable[[], float], offset: float = offset) -> list[IterationDetailsLogger]:
            return [IterationDetailsLogger(lines.append, clock=lambda: clock() + offset)]

        got = replay(model(), gpu, load, loggers=loggers)
        start = START + offset + load.warmup_s
        completed = int(got.figures["completed"] or 0)
        window = ((start, start + load.duration_s),)
        stages.append(Stage(name, load.users, load.prompt, load.output, load.duration_s, completed, windows=window))
    steps = parse(lines, time.localtime(START).tm_year)
    assert len(steps) == len(lines)
    return stages, steps
