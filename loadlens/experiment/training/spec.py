"""A training experiment as data (``kind: training``): parameters (a run's configuration, config.py), trials
(each the parameters with its ``settings``; ``sweep`` gives one trial per value), repeats (one run per seed)
and the analysis. Packaged ones live in ``training/experiments/``; every check is made here, before anything
runs, and names the field (``training-stability.yaml: parameters.accumulation: must be >= 1, got 0``).

Usage::

    exp = load_training("training-stability", {"steps": "50"})   # packaged name or path, --param overrides
    for trial in exp.trials: trial.config                         # a TrainConfig per trial
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadlens.contracts.packaged import looks_like_path, packaged_names
from loadlens.experiment.errors import ExperimentError
from loadlens.experiment.models import NAME_RE, Param, coerce
from loadlens.experiment.training.config import KEYS, RUNNER_KEYS, TrainConfig, build_config

PACKAGED = Path(__file__).with_name("experiments")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrainingTrialSpec(_Model):
    name: str
    """A template: ``acc{accumulation}`` with a sweep."""
    settings: dict[str, Param] = Field(default_factory=dict)
    """Configuration keys this trial sets over the parameters (``lora: false``)."""
    sweep: dict[str, list[Param] | str] = Field(default_factory=dict)
    """One configuration key -> its values, or ``"${PARAM}"`` naming a list parameter; one trial per value."""


class TrainingAnalysis(_Model):
    kind: Literal["training_stability", "accumulation_sensitivity"]
    baseline: str | None = None
    """training_stability: the trial the convergence deviation is measured against."""
    threshold: float = Field(default=0.05, gt=0)
    """accumulation_sensitivity: the boundary is the first setting whose validation-loss change exceeds this."""


class TrainingSpec(_Model):
    version: Literal[1]
    kind: Literal["training"]
    name: str
    description: str = ""
    parameters: dict[str, Param] = Field(default_factory=dict)
    repeats: int = Field(default=5, ge=1, le=100)
    trials: list[TrainingTrialSpec] = Field(min_length=1)
    analysis: TrainingAnalysis


@dataclass(frozen=True)
class TrainingTrial:
    index: int
    name: str
    params: dict[str, Any]
    """The swept value (``accumulation: 8``) and the settings, as the result records them."""
    config: TrainConfig


@dataclass(frozen=True)
class TrainingExperiment:
    spec: TrainingSpec
    source: Path
    trials: list[TrainingTrial]

    @property
    def fingerprint(self) -> str:
        body = json.dumps(self.spec.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    def seed(self, repeat: int) -> int:
        base = self.spec.parameters.get("seed_base", 0)
        return int(base) + repeat - 1 if isinstance(base, int) else repeat - 1


def training_names() -> list[str]:
    return packaged_names(PACKAGED)


def training_path(value: str) -> Path | None:
    """The YAML file of a training experiment ``value`` names (packaged name, or a path whose document has
    ``kind: training``), or None: not a training experiment."""
    if not looks_like_path(value):
        packaged = PACKAGED / f"{value}.yaml"
        return packaged if packaged.is_file() else None
    path = Path(value)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return path if isinstance(doc, dict) and doc.get("kind") == "training" else None


def describe(path: Path) -> str:
    doc = yaml.safe_load(path.read_text())
    return str(doc.get("description", "")) if isinstance(doc, dict) else ""


def _values(raw: list[Param] | str, params: dict[str, Param], where: str) -> list[Param]:
    if isinstance(raw, list):
        values: Any = raw
    elif raw.startswith("${") and raw.endswith("}"):
        values = params.get(raw[2:-1])
        where = f"parameters.{raw[2:-1]}"
    else:
        raise ExperimentError(f"{where}: a list or '${{PARAM}}', got {raw!r}")
    if not isinstance(values, list) or not values:
        raise ExperimentError(f"{where}: must be a non-empty list, got {values!r}")
    return list(values)


def parse_training(doc: Any, source: Path, overrides: dict[str, str] | None = None) -> TrainingExperiment:
    src = source.name
    if not isinstance(doc, dict):
        raise ExperimentError(f"{src}: must be a mapping, got {type(doc).__name__}")
    try:
        spec = TrainingSpec.model_validate(doc)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ExperimentError(f"{src}: {loc}: {first['msg'].removeprefix('Value error, ')}") from None
    if not NAME_RE.match(spec.name):
        raise ExperimentError(f"{src}: name: must match {NAME_RE.pattern}, got {spec.name!r}")
    params = dict(spec.parameters)
    for key, raw in (overrides or {}).items():
        if key not in params:
            raise ExperimentError(f"--param {key}: the experiment has no parameter {key!r} (has {sorted(params)})")
        params[key] = coerce(raw, params[key])
    spec = spec.model_copy(update={"parameters": params})
    unknown = [k for k in params if k not in KEYS and k not in RUNNER_KEYS and not isinstance(params[k], list)]
    if unknown:
        raise ExperimentError(f"{src}: parameters.{unknown[0]}: not a training parameter (docs/experiments.md)")
    trials: list[TrainingTrial] = []
    for i, t in enumerate(spec.trials):
        where = {k: f"{src}: parameters.{k}" for k in params}
        for key in [*t.settings, *t.sweep]:
            if key not in KEYS:
                raise ExperimentError(f"{src}: trials.{i}: {key!r} is not a training parameter")
        where.update({k: f"{src}: trials.{i}.settings.{k}" for k in t.settings})
        if len(t.sweep) > 1:
            raise ExperimentError(f"{src}: trials.{i}.sweep: one key at most, got {sorted(t.sweep)}")
        combos: list[dict[str, Param]] = [{}]
        for key, axis in t.sweep.items():
            combos = [{key: v} for v in _values(axis, params, f"{src}: trials.{i}.sweep.{key}")]
            if isinstance(axis, str):
                where[key] = f"{src}: parameters.{axis[2:-1]}"
            else:
                where[key] = f"{src}: trials.{i}.sweep.{key}"
        for swept in combos:
            values = {k: v for k, v in params.items() if k in KEYS}
            values.update(t.settings)
            values.update(swept)
            try:
                name = t.name.format(**values)
            except (KeyError, IndexError, ValueError) as err:
                raise ExperimentError(f"{src}: trials.{i}.name: cannot fill {t.name!r}: {err}") from None
            if not NAME_RE.match(name):
                raise ExperimentError(f"{src}: trials.{i}.name: {name!r} is not a safe directory name")
            cfg = build_config(values, where)
            recorded = {k: v if not isinstance(v, list) else ",".join(map(str, v)) for k, v in t.settings.items()}
            trials.append(TrainingTrial(len(trials), name, {**recorded, **swept}, cfg))
    names = [t.name for t in trials]
    if len(set(names)) != len(names):
        raise ExperimentError(
            f"{src}: trials: duplicate trial names {sorted({n for n in names if names.count(n) > 1})}"
        )
    base = spec.analysis.baseline
    if spec.analysis.kind == "training_stability" and base is not None and base not in names:
        raise ExperimentError(f"{src}: analysis.baseline: no trial {base!r} (have {names})")
    return TrainingExperiment(spec, source, trials)


def load_training(path: Path, overrides: dict[str, str] | None = None) -> TrainingExperiment:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ExperimentError(f"{path.name}: not valid YAML: {err}") from None
    return parse_training(doc, path, overrides)
