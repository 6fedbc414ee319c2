"""The sim profiles' schema machinery: field types, the base models, the loader and :class:`ProfileError`.

Model profiles (``loadlens/contracts/model_profile.py``) and the sim's GPU profiles
(``exporters/serving/engines/sim/profile.py``) are pydantic models built on these. A profile is a name or a path
(``loadlens/contracts/packaged.py``); validation is strict: an unknown key, a missing key or a value out of
range raises :class:`ProfileError` with one line naming the file, the line and the field. A null value is the
same as an absent key. Numbers may be written in YAML scientific notation without a dot (``312e12``): PyYAML
reads those as strings, so numeric fields accept numeric strings.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Self, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from loadlens.contracts.packaged import UnknownName, resolve_packaged
from loadlens.contracts.yaml_document import Document, DocumentInvalid, Problem, fail, parse_yaml, yaml_error_line

P = TypeVar("P", bound="ProfileFile")


class ProfileError(ValueError):
    """A profile is unknown, unreadable or invalid. The message is one line naming the file and field."""


# --- field types: each check words its reason as docs/sim-engine.md shows ----------------------------------------


def number(minimum: float = 0.0, *, strict: bool = True, maximum: float = math.inf) -> BeforeValidator:
    """A finite number above ``minimum`` (at or above it unless ``strict``) and at most ``maximum``."""

    def check(value: Any) -> float:
        if isinstance(value, bool):
            raise fail(f"must be a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise fail(f"must be a number, got {value!r}") from None
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise fail(f"must be a finite number, got {value!r}")
        if value < minimum or (strict and value == minimum) or value > maximum:
            low = f"> {minimum}" if strict else f">= {minimum}"
            high = "" if maximum == math.inf else f" and <= {maximum}"
            raise fail(f"must be {low}{high}, got {value!r}")
        return float(value)

    return BeforeValidator(check)


def whole_number(value: Any) -> int:
    """``4096``, ``4096.0`` and ``"4e3"`` are whole numbers; anything else is refused."""
    if isinstance(value, str):
        try:
            as_float = float(value)
        except ValueError:
            raise fail(f"must be an integer, got {value!r}") from None
        value = int(as_float) if as_float.is_integer() else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"must be an integer, got {value!r}")
    return int(value)


def integer(minimum: int = 1) -> BeforeValidator:
    """A whole number >= ``minimum``."""

    def check(value: Any) -> int:
        whole = whole_number(value)
        if whole < minimum:
            raise fail(f"must be >= {minimum}, got {whole}")
        return whole

    return BeforeValidator(check)


def text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(f"must be a non-empty string, got {value!r}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(f"must be true or false, got {value!r}")
    return value


def choice(choices: tuple[str, ...]) -> BeforeValidator:
    def check(value: Any) -> str:
        if value not in choices:
            raise fail(f"must be one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return BeforeValidator(check)


def knobs(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise fail("must be a mapping of names to values")
    return value


def sequence(value: Any) -> Any:
    """A YAML list (its items checked by their own type); anything else is refused in the profile's words."""
    if not isinstance(value, list | tuple):
        raise fail(f"must be a list of numbers, got {value!r}")
    return value


Positive = Annotated[float, number()]
NonNegative = Annotated[float, number(strict=False)]
Fraction = Annotated[float, number(maximum=1.0)]
Count = Annotated[int, integer()]
Text = Annotated[str, BeforeValidator(text)]
Flag = Annotated[bool, BeforeValidator(boolean)]
KnobDefaults = Annotated[dict[str, Any], BeforeValidator(knobs)]
Seconds = Annotated[float, number(-math.inf, strict=False)]
"""A finite number of seconds of either sign."""
SecondsList = Annotated[tuple[Seconds, ...], BeforeValidator(sequence)]


class ProfileModel(BaseModel):
    """A mapping of a profile file: null is absent, and a key that is no field is a misspelling (reported after
    the fields' own mistakes, before the checks across fields)."""

    model_config = ConfigDict(frozen=True, extra="allow", use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise fail("must be a mapping")
        return cls._defaults({k: v for k, v in value.items() if v is not None or k not in cls.model_fields})

    @classmethod
    def _defaults(cls, fields: dict[str, Any]) -> dict[str, Any]:
        """Defaults that depend on other fields, filled in before validation."""
        return fields

    @model_validator(mode="after")
    def _complete(self) -> Self:
        unknown = sorted(str(k) for k in self.model_extra or {})
        if unknown:
            raise fail("unknown field (check the spelling; see docs/sim-engine.md)", unknown[0])
        self._consistent()
        return self

    def _consistent(self) -> None:
        """Checks across fields (each names the field it blames)."""


class ProfileFile(ProfileModel):
    """A whole profile file: remembers where it was loaded from."""

    _path: str = PrivateAttr("")

    @property
    def path(self) -> str:
        """The file it was loaded from (set by the loader)."""
        return self._path


def require(ok: bool, key: str, why: str) -> None:
    """A check across fields: the reason is reported at ``key`` (dotted for a nested field)."""
    if not ok:
        raise fail(why, *key.split("."))


def whole(value: Any) -> int | None:
    """``value`` as the integer fields read it, or None (the field's own check then reports it)."""
    try:
        return whole_number(value)
    except PydanticCustomError:
        return None


def load_profile(name_or_path: str, directory: Path, kind: str, model: type[P]) -> P:
    try:
        path = resolve_packaged(name_or_path, directory, f"{kind} profile")
    except UnknownName as err:
        raise ProfileError(str(err)) from None
    doc = _read(path)
    try:
        profile = doc.validate(model)
    except DocumentInvalid as err:
        raise ProfileError(_message(err.problem)) from None
    profile._path = str(path)
    return profile


def _message(problem: Problem) -> str:
    """``profile FILE:LINE:COL: field 'F': reason``, the file's place written as in every loadlens document error."""
    return f"profile {problem.where}: field '{problem.field}': {problem.reason}"


def _read(path: Path) -> Document:
    try:
        doc = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as err:
        raise ProfileError(f"profile {path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        line = yaml_error_line(err)
        raise ProfileError(f"profile {path}: invalid YAML{'' if line is None else f' at line {line}'}") from err
    if not isinstance(doc.data, dict):
        raise ProfileError(f"profile {path}: expected a mapping of fields, got {type(doc.data).__name__}")
    return doc
