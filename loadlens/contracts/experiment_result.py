"""``experiment_result.json`` as typed models: ``loadlens experiment`` validates what it writes against them and
reads them back to resume; any reader parses with :func:`parse_experiment_result`. docs/experiments.md says
what every key means.

Unknown keys are refused, so a writer that adds a key without declaring it here (and in the docs) fails its
tests. ``schema_version`` changes when a key's meaning changes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA = "loadlens.experiment_result"
SCHEMA_VERSION = 1
EXPERIMENT_FILE = "experiment_result.json"

Scalar = float | int | str | bool | None
Param = float | int | str | bool | list[float | int | str | bool]


class ExperimentResultError(ValueError):
    """The document is not a loadlens experiment result of this schema (the message names the key)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Stat(_Model):
    """One figure over a trial's repeats: mean, sample standard deviation (``None`` below 2 values), extremes
    and the per-repeat values (``None`` where a repeat had no such figure)."""

    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    n: int = 0
    values: list[float | None] = Field(default_factory=list)


class LoraSwapFigures(_Model):
    """Hot-swap blocking (guide 2.4) of one model name, or of all, over a run's measured window: increases of the
    serving layer's series between the first and the last ``/metrics`` sample inside each measured stage
    (loadlens/experiment/swap_series.py). ``None``: the server does not export the series."""

    requests: float | None = None
    """Successful requests judged against the SLOs (``loadlens_slo_eligible_requests_total``)."""
    blocked_requests: float | None = None
    """Requests blocked behind swaps for more than 0 s (``loadlens_lora_swap_blocking_seconds_count``)."""
    blocked_ratio: float | None = None
    mean_blocked_ms: float | None = None
    """Per blocked request, exact (``_sum`` / ``_count``); ``None`` when none was blocked."""
    p99_blocked_ms: float | None = None
    """Per blocked request, interpolated linearly inside the histogram bucket holding the 99th percentile."""
    delayed_requests: float | None = None
    """Requests blocked longer than ``delay_seconds``: ``_count`` minus the bucket at that edge."""
    delayed_ratio: float | None = None
    """``delayed_requests`` / ``requests``: what the SLO's ``max_delayed_ratio`` bounds."""
    delayed_counter: float | None = None
    """``loadlens_lora_swap_delayed_requests_total``: the server's own count, by the server's SLO file."""


class LoraSwapSample(LoraSwapFigures):
    """:class:`LoraSwapFigures` over every model, beside each model's and the swaps' own figures."""

    delay_seconds: float | None = None
    """The SLO file's ``lora_swap.delay_seconds`` the delayed figures were counted against."""
    delay_exact: bool | None = None
    """The histogram has a bucket edge at ``delay_seconds``, so ``delayed_requests`` is exact."""
    models: dict[str, LoraSwapFigures] = Field(default_factory=dict)
    """By the series' ``model_name`` label (the base model or an adapter)."""
    adapter_load_calls: float | None = None
    """Successful ``/v1/load_lora_adapter`` calls the target served or forwarded
    (``loadlens_lora_adapter_operations_total{operation="load",outcome="success"}``)."""
    sim_adapter_loads: float | None = None
    """The sim's step-loop blocks by adapter loads and GPU-slot fills (``loadlens_sim_adapter_load_seconds``)."""
    sim_adapter_load_mean_ms: float | None = None
    vllm_adapter_loads: dict[str, float] = Field(default_factory=dict)
    """``vllm:lora_adapter_load_seconds`` count by ``transition`` where vLLM exports it (an open vLLM pull
    request; absent today)."""
    vllm_adapter_load_mean_ms: dict[str, float | None] = Field(default_factory=dict)
    probe_swap_windows: float | None = None
    """The proxy's swap windows from the upstream's probe (``loadlens_proxy_probe_swap_windows_total``)."""
    probe_on_demand_windows: float | None = None
    """Of those, loads a request waited for (``on_demand="true"``)."""
    swaps: float | None = None
    """The swap count of the table: the first figure of ``swaps_source`` the target gives."""
    swaps_source: str | None = None
    driver_loads: int | None = None
    """Loads the experiment's swap driver made inside the measured window (a trial with ``swaps``)."""
    driver_errors: list[str] = Field(default_factory=list)


class ServerSample(_Model):
    """What the runner read from the server's ``/metrics`` over a run's measured (non-warmup) stages
    (vLLM's series or sglang's counterparts: loadlens/experiment/sampler.py)."""

    samples: int = 0
    mean_running: float | None = None
    peak_running: float | None = None
    mean_waiting: float | None = None
    peak_waiting: float | None = None
    mean_kv_cache_usage: float | None = None
    """Share of the KV cache in use (0-1): the fullest engine's, averaged over the samples."""
    peak_kv_cache_usage: float | None = None
    preemptions: float | None = None
    kv_cache_blocks: int | None = None
    """KV cache blocks of one engine as ``vllm:cache_config_info`` states them (``num_gpu_blocks``; the smallest
    engine's), in the last sample inside the windows that states one: loadlens/contracts/kv_capacity.py. None
    where the server exports no such series (sglang)."""
    kv_cache_block_size: int | None = None
    """Tokens per KV cache block, from the same sample (``block_size``)."""
    lora_swap: LoraSwapSample | None = None
    """Hot-swap figures where the server exports the serving layer's series (loadlens serve: sim or proxy)."""
    engine_counters: dict[str, float] = Field(default_factory=dict)
    """Increases of vLLM's engine counters and histogram ``_sum``/``_count`` over the measured window, by
    exposed sample name (loadlens/contracts/engine_counters.py; what ``loadlens calibrate`` reads)."""
    errors: list[str] = Field(default_factory=list)


class TrialRun(_Model):
    """One repeat of one trial: one ``loadlens load`` run."""

    repeat: int
    run_id: str
    result_path: str
    """``benchmark_result.json`` of the run, relative to the experiment directory."""
    log_path: str
    exit_code: int
    completed: bool
    start_timestamp: float
    end_timestamp: float
    duration_s: float
    prepare_s: float | None = None
    """Seconds the trial's server configuration took before this run: knobs set, a ``--server-command``
    server started until healthy, the trial's adapters loaded."""
    seed: int | None = None
    """The prompt seed the run was given (``loadlens load --seed``; runner.run_seed); null in results written
    before runs had their own."""
    figures: dict[str, float | None] = Field(default_factory=dict)
    server: ServerSample = Field(default_factory=ServerSample)
    verdict_status: str | None = None
    verdict_headline: str | None = None
    error: str | None = None


class Trial(_Model):
    """One server configuration plus one load profile, run ``repeats`` times."""

    index: int
    name: str
    params: dict[str, Scalar] = Field(default_factory=dict)
    """The swept values, by the sweep's label (``window: 100``)."""
    knobs: dict[str, Scalar] = Field(default_factory=dict)
    """The server configuration applied (knob name -> value)."""
    profile: str
    adapters: list[str] = Field(default_factory=list)
    """The LoRA adapters loaded onto the server for this trial (names of the result's ``adapters``)."""
    target: str | None = None
    """The base URL the trial's load went to."""
    status: Literal["pending", "done", "failed", "skipped"] = "pending"
    error: str | None = None
    runs: list[TrialRun] = Field(default_factory=list)
    figures: dict[str, Stat] = Field(default_factory=dict)


class Column(_Model):
    key: str
    label: str
    unit: str = ""


class Table(_Model):
    name: str
    title: str
    columns: list[Column]
    rows: list[dict[str, Scalar]] = Field(default_factory=list)


class Fit(_Model):
    """A model fitted to one figure over one swept parameter."""

    name: str
    formula: str
    x: str
    y: str
    params: dict[str, float] = Field(default_factory=dict)
    params_err: dict[str, float] = Field(default_factory=dict)
    """The uncertainty of a parameter where the analysis gives one (lora_rank: b's, two standard errors)."""
    r2: float | None = None
    points: int = 0
    x_min: float | None = None
    x_max: float | None = None
    optimum_x: float | None = None
    optimum_y: float | None = None
    interior: bool | None = None
    """True when the fitted minimum lies strictly inside the swept range."""
    dip_ratio: float | None = None
    """(lower end of the fitted curve − its minimum) / minimum: 0 for a monotone fit."""
    curve: list[tuple[float, float]] = Field(default_factory=list)
    error: str | None = None


class Finding(_Model):
    """One check of the analysis against what the procedure expects."""

    name: str
    passed: bool | None
    detail: str


class Plot(_Model):
    name: str
    title: str
    x: str
    x_label: str
    y: list[str]
    y_label: str
    fit: str | None = None
    log_x: bool = False


class ExperimentInfo(_Model):
    name: str
    description: str = ""
    source: str
    sha256: str
    parameters: dict[str, Param] = Field(default_factory=dict)
    repeats: int
    time_scale: float
    users_scale: float
    analysis: str
    sample_interval: float | None = None
    """Seconds between the server samples of a run (``/metrics``); null in results written before it was kept."""


class AdapterRecord(_Model):
    """A LoRA adapter the experiment wrote (``loadlens lora make``) for its trials to load."""

    name: str
    rank: int
    alpha: float
    target_modules: list[str]
    dtype: str
    init_b: str
    seed: int
    base: str
    """The base model it was made for (config.json, model directory or sim model profile)."""
    path: str
    """Where it was written (``EXPDIR/adapters/NAME``)."""
    server_path: str
    """The path the server was given to load it from."""
    formula_bytes: int
    """layers x target modules x r x (d_in + d_out) x bytes per parameter (the guide's formula)."""
    file_bytes: int
    """The size of ``adapter_model.safetensors``."""


class ServerInfo(_Model):
    mode: Literal["sim", "admin", "command", "urls", "none"]
    """``none``: an in-process experiment that starts no server (the training experiments)."""
    target: str | None = None
    command: str | None = None
    sim_argv: list[str] = Field(default_factory=list)


class ExperimentResult(_Model):
    schema_: str = Field(default=SCHEMA, alias="schema", pattern=f"^{SCHEMA}$")
    schema_version: int = Field(default=SCHEMA_VERSION, ge=SCHEMA_VERSION, le=SCHEMA_VERSION)
    run_id: str
    experiment: ExperimentInfo
    server: ServerInfo
    start_time: str
    end_time: str | None = None
    completed: bool = False
    """Every trial is done (or skipped by the analysis' early stop)."""
    interrupted: bool = False
    adapters: list[AdapterRecord] = Field(default_factory=list)
    trials: list[Trial]
    tables: list[Table] = Field(default_factory=list)
    fits: list[Fit] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    plots: list[Plot] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def parse_experiment_result(doc: Any, source: str = "<memory>") -> ExperimentResult:
    """Validate ``doc``; :class:`ExperimentResultError` names the first bad key."""
    try:
        return ExperimentResult.model_validate(doc)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise ExperimentResultError(f"{source}: {where}: {first['msg']}") from err
