"""Tools and packages the tests need: skipped with the way to get them on a developer's machine, failed under CI.

`make test` installs every one of them (the venv's extras, `make system-deps`, `make k8s-tools`), so under CI
(``CI`` set, as `.ci/run` runs) a missing one is a broken set-up and must fail the test that needed it, never
let it pass as a skip. On a laptop without, say, Debian's prometheus, the same test skips and says how to get it.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest


def under_ci() -> bool:
    return bool(os.environ.get("CI"))


def unavailable(reason: str) -> NoReturn:
    """End the calling test: a failure under CI, a skip elsewhere. ``reason`` names what is missing and how to
    get it."""
    if under_ci():
        pytest.fail(f"{reason} (required under CI)", pytrace=False)
    pytest.skip(reason)


def require_binary(*names: str, how: str, env: str | None = None) -> str:
    """The path of the first of ``names`` on PATH (or of ``$env`` when set)."""
    if env and os.environ.get(env):
        return os.environ[env]
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    unavailable(f"{names[0]} not found: {how}")


def require_module(name: str, how: str = "pip install -e '.[all,training,dev]' (make venv)") -> ModuleType:
    """The imported module; a module that is installed but fails to import is an error, not a skip."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name and not name.startswith(f"{err.name}."):
            raise  # the package is there but one of its own imports is broken
        unavailable(f"python package {name} not installed: {how}")


def promtool() -> str:
    return require_binary("promtool", how="apt-get install prometheus (make system-deps)")


def amtool() -> str:
    return require_binary("amtool", how="apt-get install prometheus-alertmanager (make system-deps)")
