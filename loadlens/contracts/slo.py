"""The SLO configuration: loaded once from YAML, validated before anything starts.

Usage::

    slos = load_slos()              # the packaged default, loadlens/contracts/slos.yaml
    cls = slos.class_for_priority(0)
    cls.ttft_seconds                # 0.2
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from loadlens.contracts.ports import GPU_JOB, LOADGEN_JOB, PAGER_JOB, SERVE_JOB, job_selector
from loadlens.contracts.yaml_document import Document, DocumentInvalid, fail, parse_yaml

DEFAULT_SLO_FILE = Path(__file__).with_name("slos.yaml")


class SLOConfigError(ValueError):
    """The SLO file is missing, malformed or inconsistent. The message names the field."""


@dataclass(frozen=True)
class PriorityClass:
    name: str
    description: str
    priority_min: int
    priority_max: int
    objective_ratio: float
    ttft_seconds: float
    itl_seconds: float
    e2e_seconds: float

    def thresholds(self) -> dict[str, float]:
        """SLO name -> threshold in seconds (the names are the `slo` label values)."""
        return {"ttft": self.ttft_seconds, "itl": self.itl_seconds, "e2e": self.e2e_seconds}


@dataclass(frozen=True)
class LoraSwapSLO:
    delay_seconds: float
    max_delayed_ratio: float


@dataclass(frozen=True)
class SLOConfig:
    classes: tuple[PriorityClass, ...]
    availability_objective_ratio: float
    lora_swap: LoraSwapSLO
    gpu: dict[str, float]
    training: dict[str, float]
    source: str
    alerting: dict[str, Any]

    def class_for_priority(self, priority: int) -> PriorityClass:
        """The class whose range holds ``priority``; values beyond every range go to the nearest end class."""
        for cls in self.classes:
            if cls.priority_min <= priority <= cls.priority_max:
                return cls
        ordered = sorted(self.classes, key=lambda c: c.priority_min)
        return ordered[0] if priority < ordered[0].priority_min else ordered[-1]

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def all_thresholds(self, slo: str) -> list[float]:
        """Every class's threshold for one SLO (e.g. 'ttft'): these must be histogram boundaries."""
        return [c.thresholds()[slo] for c in self.classes]


# --- the document ---------------------------------------------------------------------------------------------
# The SLO file's schema as pydantic models; load_slos builds the frozen SLOConfig above from them. Reasons are
# written with fail() so every message reads "FILE:LINE:COL: field: reason" (yaml_document).


def _number(hi: float = math.inf) -> BeforeValidator:
    """A finite number in (0, hi]."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise fail(f"must be a number, got {value!r}")
        if not 0.0 < float(value) <= hi:
            raise fail(f"must be in ({0.0}, {hi}], got {value!r}")
        return float(value)

    return BeforeValidator(check)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"must be an integer, got {value!r}")
    return value


def _section(name: str) -> Callable[[Any], Any]:
    """An optional section: absent or empty (any false value) is ``{}``; anything but a mapping names it."""

    def check(value: Any) -> Any:
        if not value:
            return {}
        if not isinstance(value, dict):
            raise fail(f"{name} must be a mapping", bare=True)
        return value

    return check


Positive = Annotated[float, _number()]
Ratio = Annotated[float, _number(1.0)]
Integer = Annotated[int, BeforeValidator(_integer)]
Huge = Annotated[float | None, _number(1e9)]
Share = Annotated[float | None, _number(1.0)]


class _Doc(BaseModel):
    """A mapping in the SLO file. A field declared ``Field(None, validate_default=True)`` is checked when
    absent too, so its own validator words the reason (``must be an integer, got None``)."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise fail("must be a mapping")
        return value


class ClassDoc(_Doc):
    name: str = Field(None, validate_default=True)
    description: str = ""
    priority_min: Integer = Field(None, validate_default=True)
    priority_max: Integer = Field(None, validate_default=True)
    objective_ratio: Ratio
    ttft_seconds: Positive
    itl_seconds: Positive
    e2e_seconds: Positive

    @field_validator("name", mode="before")
    @classmethod
    def _identifier(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.isidentifier():
            raise fail(f"must be an identifier-like string, got {value!r}")
        return value

    @field_validator("description", mode="before")
    @classmethod
    def _text(cls, value: Any) -> str:
        return str(value)

    @model_validator(mode="after")
    def _range(self) -> ClassDoc:
        if self.priority_min > self.priority_max:
            raise fail(f"priority_min {self.priority_min} > priority_max {self.priority_max}")
        return self


class AvailabilityDoc(_Doc):
    objective_ratio: Ratio


class LoraSwapDoc(_Doc):
    delay_seconds: Positive
    max_delayed_ratio: Ratio


_DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d)$")


class AlertingDoc(_Doc):
    """The thresholds of the non-SLO alerts; absent keys are fine here (the rule generator requires what it
    uses)."""

    runbook_base_url: str | None = None
    min_request_rate: Huge = None
    latency_window: str | None = None
    latency_for: str | None = None
    error_ratio: Share = None
    goodput_ratio_min: Share = None
    waiting_requests: Huge = None
    kv_cache_usage_ratio: Share = None
    preemptions_per_second: Huge = None
    gpu_exporter_stale_seconds: Huge = None
    loadgen_cpu_ratio: Share = None
    fairness_index_min: Share = None
    # Rules select each process by its Prometheus job (the ports table); a file may override a selector, e.g.
    # to add a cluster matcher, but names no job itself.
    selectors: dict[str, str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        for key in value:
            if key not in cls.model_fields:
                raise fail("unknown key", key)
        return value

    @field_validator("latency_window", "latency_for", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> str:
        if not isinstance(value, str) or not _DURATION.match(value):
            raise fail(f"must be a Prometheus duration like 1m, got {value!r}")
        return value

    @field_validator("selectors", mode="before")
    @classmethod
    def _selectors(cls, value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise fail("must map names to PromQL label matchers")
        unknown = sorted(set(value) - set(DEFAULT_SELECTORS))
        if unknown:
            raise fail(f"unknown name (known: {', '.join(sorted(DEFAULT_SELECTORS))})", unknown[0])
        return value

    @field_validator("runbook_base_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.startswith(("http://", "https://")) or "#" in value:
            raise fail(
                f"must be an absolute http(s) URL without a #fragment (a link a browser or pager can open), got "
                f"{value!r}"
            )
        return value

    def settings(self) -> dict[str, Any]:
        """The section as SLOConfig.alerting holds it: the keys the file sets, and every selector."""
        out: dict[str, Any] = {"selectors": dict(DEFAULT_SELECTORS)}
        for key, value in self.model_dump(exclude_unset=True).items():
            out[key] = {**DEFAULT_SELECTORS, **value} if key == "selectors" else value
        return out


class SloDocument(_Doc):
    """The SLO file (slos.yaml)."""

    version: int = Field(None, validate_default=True)
    classes: list[ClassDoc] = Field(None, validate_default=True)
    availability: Annotated[AvailabilityDoc, BeforeValidator(_section("availability"))] = Field(
        None, validate_default=True
    )
    lora_swap: Annotated[LoraSwapDoc, BeforeValidator(_section("lora_swap"))] = Field(None, validate_default=True)
    gpu: Annotated[dict[str, Positive], BeforeValidator(_section("gpu"))] = Field(default_factory=dict)
    training: Annotated[dict[str, Positive], BeforeValidator(_section("training"))] = Field(default_factory=dict)
    alerting: Annotated[AlertingDoc, BeforeValidator(_section("alerting"))] = Field(
        default_factory=lambda: AlertingDoc()
    )

    @model_validator(mode="before")
    @classmethod
    def _top(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise fail("top level must be a mapping")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> int:
        if value != 1:
            raise fail(f"version must be 1, got {value!r}", bare=True)
        return 1

    @field_validator("classes", mode="before")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if not isinstance(value, list) or not value:
            raise fail("classes must be a non-empty list", bare=True)
        return value

    @field_validator("classes")
    @classmethod
    def _ranges(cls, classes: list[ClassDoc]) -> list[ClassDoc]:
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise fail(f"duplicate class names {names}", bare=True)
        ordered = sorted(classes, key=lambda c: c.priority_min)
        for a, b in zip(ordered, ordered[1:], strict=False):
            if b.priority_min <= a.priority_max:
                raise fail(f"classes {a.name} and {b.name}: priority ranges overlap", bare=True)
            if b.priority_min != a.priority_max + 1:
                raise fail(f"classes {a.name} and {b.name}: gap between priority ranges", bare=True)
        return classes

    def config(self, source: str) -> SLOConfig:
        return SLOConfig(
            classes=tuple(PriorityClass(**c.model_dump()) for c in self.classes),
            availability_objective_ratio=self.availability.objective_ratio,
            lora_swap=LoraSwapSLO(self.lora_swap.delay_seconds, self.lora_swap.max_delayed_ratio),
            gpu=dict(self.gpu),
            training=dict(self.training),
            source=source,
            alerting=self.alerting.settings(),
        )


# The selector of each process the rules watch, from the ports table's job names.
DEFAULT_SELECTORS: dict[str, str] = {
    "serving": job_selector(SERVE_JOB),
    "gpu": job_selector(GPU_JOB),
    "loadgen": job_selector(LOADGEN_JOB),
    "pager": job_selector(PAGER_JOB),
}


def parse_slos(doc: Any, source: str = "<memory>") -> SLOConfig:
    """Validate SLO data already in memory (no marks: errors name the field only)."""
    return _validate(Document(doc), source)


def _validate(doc: Document, source: str) -> SLOConfig:
    try:
        return doc.validate(SloDocument).config(source)
    except DocumentInvalid as err:
        raise SLOConfigError(str(err.problem)) from None


def load_slos(path: str | Path | None = None) -> SLOConfig:
    """Load and validate an SLO file (default: the packaged one). Raises :class:`SLOConfigError`, whose message
    is ``FILE:LINE:COL: field: reason``."""
    file = Path(path) if path is not None else DEFAULT_SLO_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise SLOConfigError(f"cannot read SLO file {file}: {err.strerror}") from err
    try:
        doc = parse_yaml(text, str(file))
    except yaml.YAMLError as err:
        raise SLOConfigError(f"{file}: not valid YAML: {err}") from err
    return _validate(doc, str(file))
