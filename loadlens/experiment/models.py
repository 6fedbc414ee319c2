"""An experiment as data: the YAML document's typed model, its validation and its expansion into trials.

Usage::

    spec = load_experiment("batching-window")              # packaged name, or a path
    spec = spec.with_parameters({"window_knob": "my_knob"})  # --param overrides
    for trial in expand_trials(spec): ...

Every problem raises :class:`ExperimentError` whose message names the file and the field
(``batching-window.yaml: trials.0.sweep.window.values: must not be empty``), before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from loadlens.contracts.packaged import UnknownName, packaged_names, resolve_packaged
from loadlens.experiment.adapter_spec import AdapterSpec as AdapterSpec
from loadlens.experiment.adapter_spec import PlannedAdapter as PlannedAdapter
from loadlens.experiment.adapter_spec import adapter_count, indexed, shares
from loadlens.experiment.errors import ExperimentError as ExperimentError

PACKAGED = Path(__file__).with_name("experiments")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,62}$")

Scalar = float | int | str | bool
Param = Scalar | list[Scalar]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SimServer(_Model):
    """How ``loadlens experiment`` starts the sim when no ``--host`` is given."""

    model_profile: str = "tiny"
    gpu_profile: str = "h100-sxm"
    speed: float = Field(default=1.0, gt=0)
    seed: int = 0
    knobs: dict[str, Scalar] = Field(default_factory=dict)


class Warmup(_Model):
    """Prepended to every trial's profile as a warmup stage (excluded from the figures), unless the profile
    has a warmup stage of its own."""

    users: int = Field(default=2, ge=1)
    until_requests: int = Field(default=10, ge=1)
    max_duration: float = Field(default=30.0, gt=0)


class SweepAxis(_Model):
    """One swept dimension: a server knob or a profile variable, and its values."""

    knob: str | None = None
    var: str | None = None
    values: list[Scalar] | str
    """The values, or ``"${PARAM}"``: a list parameter (``--param windows=10,25,50``)."""

    @model_validator(mode="after")
    def _one_target(self) -> SweepAxis:
        if (self.knob is None) == (self.var is None):
            raise ValueError("give exactly one of knob, var")
        if isinstance(self.values, str) and not (self.values.startswith("${") and self.values.endswith("}")):
            raise ValueError(f"values: a list or '${{PARAM}}', got {self.values!r}")
        if not self.values:
            raise ValueError("values must not be empty")
        return self


class SwapSchedule(_Model):
    """Scheduled hot swaps during each run of the trial (loadlens/experiment/swap_driver.py)."""

    every: float | str
    """Seconds from a load to its unload and to the next load (wall time, unscaled), or ``"${PARAM}"``."""
    adapters: list[str] = Field(min_length=1)
    """The experiment's adapters (templates) loaded in turn; none of the trial's own ``adapters``."""


class TrialSpec(_Model):
    """A trial, or with ``sweep`` the cartesian product of the axes' values (one trial per combination)."""

    name: str
    profile: str
    knobs: dict[str, Scalar] = Field(default_factory=dict)
    vars: dict[str, Scalar] = Field(default_factory=dict)
    """Values for the profile's ``${NAME}`` placeholders; a string value is a template too (``"r{rank}"``)."""
    adapters: list[str] = Field(default_factory=list)
    """Adapters (names of the experiment's ``adapters``, templates) loaded onto the server before the trial's
    runs and unloaded after it. With ``adapter_count`` an entry holding ``{i}`` stands for i = 1 ... count."""
    adapter_count: int | str | None = None  # how many {i} adapters: a positive integer or "${PARAM}"
    adapter_weights: str = ""
    """The trial's traffic shares over its adapters (a template, ``"{weights}"``): comma-separated numbers, one
    per adapter, or empty / ``equal`` for equal shares; the profile gets them as ``"${adapter_mix}"``."""
    sweep: dict[str, SweepAxis] = Field(default_factory=dict)
    host: str | None = None
    """This trial's server URL (per-trial URL mode); knobs are then applied there through its admin API."""
    label: dict[str, Scalar] = Field(default_factory=dict)
    """Extra parameters recorded for the analysis (``policy: fcfs``)."""
    swaps: SwapSchedule | None = None
    """Adapter loads and unloads on a schedule while each run goes (hot-swap)."""

    @field_validator("sweep", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        # `max_num_seqs: [8, 16]` is `max_num_seqs: {knob: max_num_seqs, values: [8, 16]}`
        if isinstance(value, dict):
            return {k: ({"knob": k, "values": v} if isinstance(v, list) else v) for k, v in value.items()}
        return value


class Analysis(_Model):
    kind: Literal[
        "table", "u_curve", "fairness", "token_budget", "burst", "search", "hot_swap", "lora_rank", "multi_lora"
    ]
    x: str | None = None
    """The swept parameter on the x axis (u_curve)."""
    y: str = "p99_e2el_ms"
    throughput: str = "request_throughput"
    min_r2: float = Field(default=0.8, ge=0, le=1)
    min_dip: float = Field(default=0.05, ge=0)
    """u_curve: how far (relative) the fitted minimum must lie below the curve's lower end to count as one."""
    interactive_class: str = "interactive"
    batch_class: str = "batch"
    columns: list[str] = Field(default_factory=list)
    """table: the figures shown per trial (default: the guide's benchmark table)."""
    failure: dict[str, float] = Field(default_factory=dict)
    """burst: figure -> the most it may be; a run fails when any figure is above its bound."""
    stop_on_failure: bool = True
    """burst: skip the larger sizes once every repeat of a size failed."""


class Search(_Model):
    """slo-search: the highest value of a profile variable (users or rate) at which the run passes: goodput
    ratio >= ``goodput_target`` and, with ``every_slo``, the run's verdict passes (every SLO check)."""

    var: str
    start: float = Field(gt=0)
    min: float = Field(default=1, gt=0)
    max: float = Field(gt=0)
    integer: bool = True
    goodput_target: float = Field(default=0.9, ge=0, le=1)
    every_slo: bool = True
    tolerance: float = Field(default=0.1, gt=0)
    """Bisection stops when (hi - lo) / lo <= tolerance (or hi - lo <= 1 for integers)."""
    oversaturated_goodput: float = Field(default=0.25, ge=0, le=1)
    """A repeat whose goodput ratio is below this is over-saturated: the level fails without more repeats."""
    confirm_failures: int = Field(default=0, ge=0, le=5)
    """A level that fails its repeats (not over-saturated) is run up to this many more times and fails only if
    none of those passes: on a noisy host one stalled run must not end the search below its capacity."""

    @model_validator(mode="after")
    def _range(self) -> Search:
        if not self.min <= self.start <= self.max:
            raise ValueError(f"start: must be in [min, max] = [{self.min:g}, {self.max:g}], got {self.start:g}")
        return self


SAMPLE_INTERVAL_S = 0.25
"""An experiment's ``sample_interval`` unless it gives one."""


class ExperimentSpec(_Model):
    version: Literal[1]
    name: str
    description: str = ""
    sim: SimServer = Field(default_factory=lambda: SimServer())
    parameters: dict[str, Param] = Field(default_factory=dict)
    repeats: int = Field(default=1, ge=1, le=100)
    sample_interval: float = Field(default=SAMPLE_INTERVAL_S, ge=0.05, le=60.0)
    """Seconds between the runner's ``GET /metrics`` of the server during a run (``--sample-interval``)."""
    warmup: Warmup | None = Field(default_factory=lambda: Warmup())
    adapters: list[AdapterSpec] = Field(default_factory=list)
    """LoRA adapters written before anything runs; trials name the ones they load."""
    profiles: dict[str, dict[str, Any] | str]
    """Inline load profiles (the documents ``loadlens load --profile`` reads), or a packaged profile name/path."""
    trials: list[TrialSpec] = Field(min_length=1)
    analysis: Analysis
    search: Search | None = None
    """With a search, ``trials`` holds one entry: the template of every level's trial (``vars`` get the
    searched variable)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(f"must match {NAME_RE.pattern}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _references(self) -> ExperimentSpec:
        for i, t in enumerate(self.trials):
            if t.profile not in self.profiles:
                raise ValueError(f"trials.{i}.profile: no profile {t.profile!r} (have {sorted(self.profiles)})")
        if (self.search is None) != (self.analysis.kind != "search"):
            raise ValueError("search: analysis kind search needs a search section, and a search section needs it")
        if self.search is not None and (len(self.trials) != 1 or self.trials[0].sweep):
            raise ValueError("trials: a search takes exactly one trial template without a sweep")
        if self.search is not None and "{" + self.search.var + "}" not in self.trials[0].name:
            raise ValueError(f"trials.0.name: must hold {{{self.search.var}}} (one trial per level)")
        if self.analysis.kind in ("u_curve", "burst"):
            axes = {label for t in self.trials for label in t.sweep}
            if self.analysis.x not in axes:
                raise ValueError(f"analysis.x: must name a sweep axis ({sorted(axes)}), got {self.analysis.x!r}")
        return self


@dataclass(frozen=True)
class PlannedTrial:
    """One trial after expansion: every template filled in."""

    index: int
    name: str
    profile: str
    knobs: dict[str, Scalar]
    vars: dict[str, Scalar]
    params: dict[str, Scalar]
    host: str | None
    adapters: tuple[str, ...] = ()
    """The adapters loaded for this trial (names of :func:`expand_adapters`)."""
    swaps: PlannedSwaps | None = None
    mix: tuple[tuple[str, float], ...] = ()  # adapter traffic shares (adapter_weights): ${adapter_mix}


@dataclass(frozen=True)
class PlannedSwaps:
    """A trial's swap schedule with its templates filled in."""

    every: float
    adapters: tuple[str, ...]


@dataclass(frozen=True)
class Experiment:
    spec: ExperimentSpec
    source: Path
    sha256: str

    def with_parameters(self, overrides: dict[str, str]) -> Experiment:
        params = dict(self.spec.parameters)
        for key, raw in overrides.items():
            if key not in params:
                raise ExperimentError(f"--param {key}: the experiment has no parameter {key!r} (has {sorted(params)})")
            params[key] = coerce(raw, params[key])
        return Experiment(self.spec.model_copy(update={"parameters": params}), self.source, self.sha256)


def coerce(raw: str, like: Param) -> Param:
    """``raw`` (a command-line string) as the type of ``like``; a list parameter takes comma-separated
    items, each typed like the list's first item."""
    if isinstance(like, list):
        items = [item.strip() for item in raw.split(",") if item.strip()]
        if not items:
            raise ExperimentError(f"--param: {raw!r}: give at least one comma-separated value")
        first = like[0] if like else ""
        return [coerce(item, first) for item in items]  # type: ignore[misc]
    try:
        if isinstance(like, bool):
            if raw.lower() not in ("true", "false"):
                raise ValueError
            return raw.lower() == "true"
        if isinstance(like, int):
            return int(raw)
        if isinstance(like, float):
            return float(raw)
    except ValueError:
        raise ExperimentError(f"--param: {raw!r} is not a {type(like).__name__}") from None
    return raw


def _fill(template: str, values: dict[str, Param], where: str) -> str:
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as err:
        raise ExperimentError(f"{where}: cannot fill {template!r}: unknown field {err}") from None


def template_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def expand_trials(exp: Experiment) -> list[PlannedTrial]:
    """Every trial in order: sweeps expanded (first axis slowest), names and knob names filled from the
    parameters and swept values. Raises :class:`ExperimentError` on duplicate or unsafe names."""
    spec, params = exp.spec, exp.spec.parameters
    out: list[PlannedTrial] = []
    src = exp.source.name
    known = {a.name for a in expand_adapters(exp)}
    for i, t in enumerate(spec.trials):
        where = f"{src}: trials.{i}"
        if spec.search is not None:
            t = t.model_copy(update={"vars": {**t.vars, spec.search.var: search_value(spec.search, spec.search.start)}})
        labels = list(t.sweep)
        axes = [_axis_values(t.sweep[k], params, f"{where}.sweep.{k}.values") for k in labels]
        combos = list(itertools.product(*axes)) if labels else [()]
        for combo in combos:
            swept = dict(zip(labels, combo, strict=True))
            scope = {**params, **t.vars, **t.label, **swept}
            knobs = {_fill(k, params, f"{where}.knobs"): v for k, v in t.knobs.items()}
            tvars = _fill_vars(t.vars, scope, f"{where}.vars")
            for label, value in swept.items():
                axis = t.sweep[label]
                if axis.knob is not None:
                    knobs[_fill(axis.knob, params, f"{where}.sweep.{label}.knob")] = value
                else:
                    assert axis.var is not None
                    tvars[axis.var] = value
            name = _fill(t.name, scope, f"{where}.name")
            if not NAME_RE.match(name):
                raise ExperimentError(f"{where}.name: {name!r} is not a safe directory name ({NAME_RE.pattern})")
            host = _fill(t.host, scope, f"{where}.host") if t.host else None
            adapters = _trial_adapters(t, scope, known, f"{where}.adapters")
            swaps = _swaps(t, scope, known, adapters, f"{where}.swaps")
            mix = shares(adapters, _fill(t.adapter_weights, scope, f"{where}.adapter_weights"), where)
            recorded: dict[str, Scalar] = {**t.label, **swept}
            out.append(PlannedTrial(len(out), name, t.profile, knobs, tvars, recorded, host, adapters, swaps, mix=mix))
    names = [p.name for p in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ExperimentError(f"{src}: trials: duplicate trial names {dupes} (put the swept labels in the name)")
    return out


def search_value(search: Search, value: float) -> Scalar:
    return int(round(value)) if search.integer else float(value)


def level_trial(exp: Experiment, value: float, index: int) -> PlannedTrial:
    """The search's trial at one level: its template with the searched variable set."""
    assert exp.spec.search is not None
    v = search_value(exp.spec.search, value)
    t = exp.spec.trials[0]
    scope = {**exp.spec.parameters, **t.vars, exp.spec.search.var: v, **t.label}
    where = f"{exp.source.name}: trials.0"
    tvars = {**_fill_vars(t.vars, scope, f"{where}.vars"), exp.spec.search.var: v}
    knobs = {_fill(k, exp.spec.parameters, f"{where}.knobs"): val for k, val in t.knobs.items()}
    name = _fill(t.name, scope, f"{where}.name")
    host = _fill(t.host, scope, f"{where}.host") if t.host else None
    known = {a.name for a in expand_adapters(exp)}
    adapters = _trial_adapters(t, scope, known, f"{where}.adapters")
    mix = shares(adapters, _fill(t.adapter_weights, scope, f"{where}.adapter_weights"), where)
    params = {**t.label, exp.spec.search.var: v}
    return PlannedTrial(index, name, t.profile, knobs, tvars, params, host, adapters, mix=mix)


def _fill_vars(tvars: dict[str, Scalar], scope: dict[str, Param], where: str) -> dict[str, Scalar]:
    return {k: (_fill(v, scope, f"{where}.{k}") if isinstance(v, str) and "{" in v else v) for k, v in tvars.items()}


def _trial_adapters(t: TrialSpec, scope: dict[str, Param], known: set[str], where: str) -> tuple[str, ...]:
    entries = indexed(t.adapters, t.adapter_count, scope, f"{where[: -len('.adapters')]}.adapter_count")
    names = tuple(_fill(a, scope, where) for a in entries)
    for name in names:
        if name not in known:
            raise ExperimentError(f"{where}: no adapter {name!r} (the experiment's adapters: {sorted(known)})")
    if len(set(names)) != len(names):
        raise ExperimentError(f"{where}: an adapter is named twice: {list(names)}")
    return names


def _swaps(
    t: TrialSpec, scope: dict[str, Param], known: set[str], own: tuple[str, ...], where: str
) -> PlannedSwaps | None:
    if t.swaps is None:
        return None
    every: Param | None = t.swaps.every
    if isinstance(every, str):
        every = scope.get(every[2:-1]) if every.startswith("${") and every.endswith("}") else None
    if isinstance(every, bool) or not isinstance(every, int | float) or not every > 0:
        raise ExperimentError(f"{where}.every: {t.swaps.every!r} must be (or name) a number of seconds > 0")
    names = tuple(_fill(a, scope, f"{where}.adapters") for a in t.swaps.adapters)
    for name in names:
        if name not in known:
            raise ExperimentError(f"{where}.adapters: no adapter {name!r} (the experiment's adapters: {sorted(known)})")
        if name in own:
            raise ExperimentError(f"{where}.adapters: {name!r} is a trial adapter, loaded for the whole run")
    return PlannedSwaps(float(every), names)


def expand_adapters(exp: Experiment) -> list[PlannedAdapter]:
    """Every adapter the experiment writes, in order; a ``rank: "${PARAM}"`` entry gives one per rank."""
    out: list[PlannedAdapter] = []
    src = exp.source.name
    for i, a in enumerate(exp.spec.adapters):
        where = f"{src}: adapters.{i}"
        if isinstance(a.rank, str):
            value = exp.spec.parameters.get(a.rank[2:-1])
            ranks: list[Scalar | None] = list(value) if isinstance(value, list) else [value]
        else:
            ranks = [a.rank]
        count = adapter_count(a, exp.spec.parameters, where)
        for rank, i in itertools.product(ranks, range(1, count + 1)):
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
                raise ExperimentError(f"{where}.rank: {a.rank} must give positive integers, got {rank!r}")
            name = _fill(a.name, {**exp.spec.parameters, "rank": rank, "i": i}, f"{where}.name")
            if not NAME_RE.match(name):
                raise ExperimentError(f"{where}.name: {name!r} is not a safe adapter name ({NAME_RE.pattern})")
            alpha = float(a.alpha) if a.alpha is not None else 2.0 * rank
            out.append(PlannedAdapter(name, rank, alpha, tuple(a.target_modules), a.dtype, a.init_b, a.seed + i - 1))
    names = [a.name for a in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ExperimentError(f"{src}: adapters: duplicate adapter names {dupes} (put {{rank}} in the name)")
    return out


def _axis_values(axis: SweepAxis, params: dict[str, Param], where: str) -> list[Scalar]:
    if isinstance(axis.values, list):
        return axis.values
    key = axis.values[2:-1]
    value = params.get(key)
    if not isinstance(value, list) or not value:
        raise ExperimentError(f"{where}: {axis.values} must name a non-empty list parameter, got {value!r}")
    return value


def available_experiments() -> list[str]:
    return packaged_names(PACKAGED)


def resolve_experiment_path(name_or_path: str) -> Path:
    """A packaged experiment name or a YAML path (the rule of ``loadlens/contracts/packaged.py``)."""
    try:
        return resolve_packaged(name_or_path, PACKAGED, "experiment")
    except UnknownName as err:
        raise ExperimentError(
            f"experiment {name_or_path!r}: no such packaged experiment ({', '.join(err.known)}) or file"
        ) from None


def parse_experiment(doc: Any, source: Path) -> Experiment:
    text_hash = hashlib.sha256(source.read_bytes()).hexdigest() if source.is_file() else ""
    if not isinstance(doc, dict):
        raise ExperimentError(f"{source.name}: must be a mapping, got {type(doc).__name__}")
    try:
        spec = ExperimentSpec.model_validate(doc)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        raise ExperimentError(f"{source.name}: {where + ': ' if where else ''}{msg}") from None
    exp = Experiment(spec, source, text_hash)
    expand_trials(exp)  # names, templates
    return exp


def load_experiment(name_or_path: str) -> Experiment:
    path = resolve_experiment_path(name_or_path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ExperimentError(f"{path.name}: not valid YAML: {err}") from None
    return parse_experiment(doc, path)


def substitute(doc: Any, values: dict[str, Any]) -> Any:
    """``doc`` with every string ``"${name}"`` replaced by ``values[name]`` (typed), recursively; a mapping key
    ``"${name}"`` becomes ``str(values[name])`` (``adapters: {"${adapter}": 70, base: 30}``)."""
    if isinstance(doc, dict):
        return {
            (str(substitute(k, values)) if isinstance(k, str) else k): substitute(v, values) for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [substitute(v, values) for v in doc]
    if isinstance(doc, str) and doc.startswith("${") and doc.endswith("}"):
        key = doc[2:-1]
        if key not in values:
            raise ExperimentError(f"profile variable {doc} has no value (trial vars: {sorted(values)})")
        return values[key]
    return doc
