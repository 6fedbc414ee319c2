"""Field readers for profile documents: each checks one value and names its path in the error.

``number(section, "rate", "stages[2]")`` returns a float or raises ``ProfileError("stages[2].rate: must be > 0,
got 0")``; the profile parser (``loadgen/profile.py``) builds on these.
"""

from __future__ import annotations

import math
from typing import Any


class ProfileError(ValueError):
    """A profile is missing, malformed or inconsistent. The message names the field and the reason."""


def mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: must be a mapping, got {type(value).__name__}")
    return value


def check_keys(section: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ProfileError(f"{where}.{unknown[0]}: unknown field (allowed: {', '.join(sorted(allowed))})")


def number(section: dict[str, Any], key: str, where: str, default: float | None = None, *, lo: float = 0.0) -> float:
    value = section.get(key, default)
    if value is None:
        raise ProfileError(f"{where}.{key}: missing")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{where}.{key}: must be a number, got {value!r}")
    if value <= lo:
        raise ProfileError(f"{where}.{key}: must be > {lo:g}, got {value!r}")
    return float(value)


def opt_number(section: dict[str, Any], key: str, where: str, *, lo: float = 0.0) -> float | None:
    return None if section.get(key) is None else number(section, key, where, lo=lo)


def integer(section: dict[str, Any], key: str, where: str, default: int | None = None, *, lo: int = 1) -> int:
    value = section.get(key, default)
    if value is None:
        raise ProfileError(f"{where}.{key}: missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{where}.{key}: must be an integer, got {value!r}")
    if value < lo:
        raise ProfileError(f"{where}.{key}: must be >= {lo}, got {value}")
    return value


def boolean(section: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise ProfileError(f"{where}.{key}: must be true or false, got {value!r}")
    return value
