"""The SLO configuration: loaded once from YAML, validated before anything starts.

Usage::

    slos = load_slos()              # the packaged default, loadlens/contracts/slos.yaml
    cls = slos.class_for_priority(0)
    cls.ttft_seconds                # 0.2
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loadlens.contracts.ports import GPU_JOB, LOADGEN_JOB, PAGER_JOB, SERVE_JOB, job_selector

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


def _num(section: dict[str, Any], key: str, where: str, *, lo: float = 0.0, hi: float = math.inf) -> float:
    if key not in section:
        raise SLOConfigError(f"{where}.{key}: missing")
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SLOConfigError(f"{where}.{key}: must be a number, got {value!r}")
    if not lo < float(value) <= hi:
        raise SLOConfigError(f"{where}.{key}: must be in ({lo}, {hi}], got {value!r}")
    return float(value)


def _int(section: dict[str, Any], key: str, where: str) -> int:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SLOConfigError(f"{where}.{key}: must be an integer, got {value!r}")
    return value


def parse_slos(doc: Any, source: str = "<memory>") -> SLOConfig:
    if not isinstance(doc, dict):
        raise SLOConfigError(f"{source}: top level must be a mapping")
    if doc.get("version") != 1:
        raise SLOConfigError(f"{source}: version must be 1, got {doc.get('version')!r}")
    raw_classes = doc.get("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        raise SLOConfigError(f"{source}: classes must be a non-empty list")
    classes: list[PriorityClass] = []
    for i, raw in enumerate(raw_classes):
        where = f"classes[{i}]"
        if not isinstance(raw, dict):
            raise SLOConfigError(f"{where}: must be a mapping")
        name = raw.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise SLOConfigError(f"{where}.name: must be an identifier-like string, got {name!r}")
        pmin, pmax = _int(raw, "priority_min", where), _int(raw, "priority_max", where)
        if pmin > pmax:
            raise SLOConfigError(f"{where}: priority_min {pmin} > priority_max {pmax}")
        classes.append(
            PriorityClass(
                name=name,
                description=str(raw.get("description", "")),
                priority_min=pmin,
                priority_max=pmax,
                objective_ratio=_num(raw, "objective_ratio", where, hi=1.0),
                ttft_seconds=_num(raw, "ttft_seconds", where),
                itl_seconds=_num(raw, "itl_seconds", where),
                e2e_seconds=_num(raw, "e2e_seconds", where),
            )
        )
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise SLOConfigError(f"{source}: duplicate class names {names}")
    ordered = sorted(classes, key=lambda c: c.priority_min)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.priority_min <= a.priority_max:
            raise SLOConfigError(f"classes {a.name} and {b.name}: priority ranges overlap")
        if b.priority_min != a.priority_max + 1:
            raise SLOConfigError(f"classes {a.name} and {b.name}: gap between priority ranges")
    avail = doc.get("availability") or {}
    swap = doc.get("lora_swap") or {}
    gpu = doc.get("gpu") or {}
    training = doc.get("training") or {}
    for section_name, section in (("availability", avail), ("lora_swap", swap), ("gpu", gpu), ("training", training)):
        if not isinstance(section, dict):
            raise SLOConfigError(f"{source}: {section_name} must be a mapping")
    return SLOConfig(
        classes=tuple(classes),
        availability_objective_ratio=_num(avail, "objective_ratio", "availability", hi=1.0),
        lora_swap=LoraSwapSLO(
            delay_seconds=_num(swap, "delay_seconds", "lora_swap"),
            max_delayed_ratio=_num(swap, "max_delayed_ratio", "lora_swap", hi=1.0),
        ),
        gpu={k: _num(gpu, k, "gpu") for k in gpu},
        training={k: _num(training, k, "training") for k in training},
        source=source,
        alerting=_alerting(doc.get("alerting") or {}),
    )


_ALERT_NUMBERS = {
    "min_request_rate": 1e9,
    "error_ratio": 1.0,
    "goodput_ratio_min": 1.0,
    "waiting_requests": 1e9,
    "kv_cache_usage_ratio": 1.0,
    "preemptions_per_second": 1e9,
    "gpu_exporter_stale_seconds": 1e9,
    "loadgen_cpu_ratio": 1.0,
    "fairness_index_min": 1.0,
}
# The selector of each process the rules watch, from the ports table's job names.
DEFAULT_SELECTORS: dict[str, str] = {
    "serving": job_selector(SERVE_JOB),
    "gpu": job_selector(GPU_JOB),
    "loadgen": job_selector(LOADGEN_JOB),
    "pager": job_selector(PAGER_JOB),
}
_DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d)$")


def _alerting(section: Any) -> dict[str, Any]:
    """Validate the alerting section; absent keys are fine here (the rule generator requires what it uses)."""
    if not isinstance(section, dict):
        raise SLOConfigError("alerting must be a mapping")
    # Rules select each process by its Prometheus job (the ports table); a file may override a selector, e.g.
    # to add a cluster matcher, but names no job itself.
    out: dict[str, Any] = {"selectors": dict(DEFAULT_SELECTORS)}
    for key, value in section.items():
        if key in _ALERT_NUMBERS:
            out[key] = _num(section, key, "alerting", hi=_ALERT_NUMBERS[key])
        elif key in ("latency_window", "latency_for"):
            if not isinstance(value, str) or not _DURATION.match(value):
                raise SLOConfigError(f"alerting.{key}: must be a Prometheus duration like 1m, got {value!r}")
            out[key] = value
        elif key == "selectors":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise SLOConfigError("alerting.selectors: must map names to PromQL label matchers")
            unknown = sorted(set(value) - set(DEFAULT_SELECTORS))
            if unknown:
                raise SLOConfigError(
                    f"alerting.selectors.{unknown[0]}: unknown name (known: {', '.join(sorted(DEFAULT_SELECTORS))})"
                )
            out[key] = {**DEFAULT_SELECTORS, **value}
        elif key == "runbook_base_url":
            if not isinstance(value, str) or not value.startswith(("http://", "https://")) or "#" in value:
                raise SLOConfigError(
                    f"alerting.runbook_base_url: must be an absolute http(s) URL without a #fragment (a link a "
                    f"browser or pager can open), got {value!r}"
                )
            out[key] = value
        else:
            raise SLOConfigError(f"alerting.{key}: unknown key")
    return out


def load_slos(path: str | Path | None = None) -> SLOConfig:
    """Load and validate an SLO file (default: the packaged one). Raises :class:`SLOConfigError`."""
    file = Path(path) if path is not None else DEFAULT_SLO_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise SLOConfigError(f"cannot read SLO file {file}: {err.strerror}") from err
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SLOConfigError(f"{file}: not valid YAML: {err}") from err
    return parse_slos(doc, str(file))
