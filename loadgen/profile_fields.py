"""Field types for the load profile's pydantic models: each checks one value and words its reason.

A field declared ``rate: OptPositive`` refuses ``0`` with ``must be > 0, got 0``; ``loadlens.contracts.
yaml_document`` puts the path in front (``stages[2].rate: must be > 0, got 0``). Every mapping of a profile
is a :class:`Section`: anything but a mapping, and a key that is no field, is refused before its fields are
read. The models are in ``profile_traffic.py``, ``profile_stages.py``, ``profile_sources.py`` and
``profile.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from loadlens.contracts.yaml_document import Problem, fail

T = TypeVar("T")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""Stage and traffic names become Prometheus label values and file names: keep them short and plain."""


class ProfileError(ValueError):
    """A profile is missing, malformed or inconsistent. The message names the field and the reason;
    ``problem`` (when the mistake is in a document) also holds the file, line and column."""

    def __init__(self, message: str, problem: Problem | None = None) -> None:
        super().__init__(message)
        self.problem = problem


def number(value: Any, lo: float = 0.0) -> float:
    """A finite number above ``lo``; null is missing."""
    if value is None:
        raise fail("missing")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise fail(f"must be a number, got {value!r}")
    if value <= lo:
        raise fail(f"must be > {lo:g}, got {value!r}")
    return float(value)


def integer(value: Any, lo: int = 1) -> int:
    """An integer >= ``lo``; null is missing."""
    if value is None:
        raise fail("missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"must be an integer, got {value!r}")
    if value < lo:
        raise fail(f"must be >= {lo}, got {value}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(f"must be true or false, got {value!r}")
    return value


def name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise fail(f"must match {NAME.pattern} (a label value), got {value!r}")
    return value


def optional(check: Callable[[Any], T]) -> Callable[[Any], T | None]:
    """``check``, with null (or absence) allowed."""
    return lambda value: None if value is None else check(value)


def not_null(value: Any) -> Any:
    """A nested mapping that may be absent but not null (null is not a mapping)."""
    if value is None:
        raise fail("must be a mapping, got NoneType")
    return value


Positive = Annotated[float, BeforeValidator(number)]
OptPositive = Annotated[float | None, BeforeValidator(optional(number))]
Count = Annotated[int, BeforeValidator(integer)]
OptCount = Annotated[int | None, BeforeValidator(optional(integer))]
Flag = Annotated[bool, BeforeValidator(boolean)]
Name = Annotated[str, BeforeValidator(name)]


class Section(BaseModel):
    """One mapping of a profile. ``shorthand`` turns a scalar into its mapping (``tokens: 256``); ``prepare``
    makes the checks that come before the fields' own (which kind of stage this is); ``INTERNAL`` fields are
    set by ``prepare``, never by the file."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    INTERNAL: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _section(cls, value: Any) -> Any:
        value = cls.shorthand(value)
        if not isinstance(value, dict):
            raise fail(f"must be a mapping, got {type(value).__name__}")
        allowed = sorted(f.alias or name for name, f in cls.model_fields.items() if name not in cls.INTERNAL)
        unknown = sorted(str(k) for k in set(value) - set(allowed))
        if unknown:
            raise fail(f"unknown field (allowed: {', '.join(allowed)})", unknown[0])
        return cls.prepare(dict(value))

    @classmethod
    def shorthand(cls, value: Any) -> Any:
        return value

    @classmethod
    def prepare(cls, value: dict[str, Any]) -> dict[str, Any]:
        return value


# --- distributions: a number, or {mean, stdev, min, max} --------------------------------------------------------


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: normal(mean, stdev) truncated to [min, max], rounded to an integer."""

    mean: float
    stdev: float = 0.0
    min: int = 1
    max: int = 1_000_000

    def sample(self, gauss: Any) -> int:
        """``gauss`` is ``random.Random.gauss``; a zero stdev is exact and draws nothing."""
        value = self.mean if self.stdev == 0 else gauss(self.mean, self.stdev)
        return int(min(self.max, max(self.min, round(value))))


@dataclass(frozen=True)
class SecondsDist:
    """A duration distribution in seconds: normal(mean, stdev) truncated to [min, max]."""

    mean: float
    stdev: float = 0.0
    min: float = 0.0
    max: float = 3600.0

    def sample(self, gauss: Any) -> float:
        value = self.mean if self.stdev == 0 else gauss(self.mean, self.stdev)
        return float(min(self.max, max(self.min, value)))


def _spread(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or not math.isfinite(value):
        raise fail(f"must be a number >= 0, got {value!r}")
    return float(value)


def _seconds(value: Any) -> float:
    if value is None:
        raise fail("missing")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise fail(f"must be a number >= 0 (seconds), got {value!r}")
    return float(value)


Seconds = Annotated[float, BeforeValidator(_seconds)]


class Length(Section):
    """A token count (``256``) or ``{mean, stdev, min, max}``."""

    mean: Positive
    stdev: Annotated[float, BeforeValidator(_spread)] = 0.0
    min: Count = 1
    max: Count = 1_000_000

    @classmethod
    def shorthand(cls, value: Any) -> Any:
        return {"mean": value} if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _bounds(self) -> Length:
        if self.min > self.max:
            raise fail(f"min {self.min} > max {self.max}")
        if not self.min <= self.mean <= self.max:
            raise fail(f"{self.mean:g} is outside [min {self.min}, max {self.max}]", "mean")
        return self

    def dist(self) -> LengthDist:
        return LengthDist(self.mean, self.stdev, self.min, self.max)


class Duration(Section):
    """Seconds (``1.5``) or ``{mean, stdev, min, max}``."""

    mean: Seconds
    stdev: Seconds = 0.0
    min: Seconds = 0.0
    max: Seconds = 3600.0

    @classmethod
    def shorthand(cls, value: Any) -> Any:
        return {"mean": value} if isinstance(value, int | float) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _bounds(self) -> Duration:
        if self.min > self.max:
            raise fail(f"min {self.min:g} > max {self.max:g}")
        if not self.min <= self.mean <= self.max:
            raise fail(f"{self.mean:g} is outside [min {self.min:g}, max {self.max:g}]", "mean")
        return self

    def dist(self) -> SecondsDist:
        return SecondsDist(self.mean, self.stdev, self.min, self.max)
