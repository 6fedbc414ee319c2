"""Which vLLM the hooks were written for, and the feature test each hook runs before it patches anything."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

# vLLM releases whose module/class/method shapes the hooks follow: the V1 worker (vllm/v1/worker) and the
# adapter-style LoRA worker manager (add_adapter/_load_adapter/set_active_adapters) exist from 0.8 on;
# 0.33 is the release the images run. Outside this range no hook is applied.
SUPPORTED_MIN = (0, 8)
SUPPORTED_BELOW = (0, 34)
SUPPORTED_TEXT = f">={SUPPORTED_MIN[0]}.{SUPPORTED_MIN[1]},<{SUPPORTED_BELOW[0]}.{SUPPORTED_BELOW[1]}"

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)")


def installed_version() -> str | None:
    """``vllm.__version__`` of the vLLM already imported (the plugin never imports vLLM itself)."""
    vllm = sys.modules.get("vllm")
    version = getattr(vllm, "__version__", None)
    return version if isinstance(version, str) else None


def parse(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version such as ``0.11.1rc2.dev45+g1234``; None when it has no such prefix."""
    match = _VERSION.match(version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def version_problem(version: str | None) -> str | None:
    """Why this vLLM version is outside the supported range, or None when it is inside."""
    parsed = parse(version)
    if parsed is None:
        return f"vllm.__version__ {version!r} cannot be parsed"
    if not SUPPORTED_MIN <= parsed < SUPPORTED_BELOW:
        return f"version outside the supported range {SUPPORTED_TEXT}"
    return None


def find_method(module: ModuleType, qualname: str, positional: int) -> tuple[type, Callable[..., Any]] | str:
    """The class and function at ``module.Class.method`` if it takes ``positional`` arguments besides self,
    otherwise why not (missing, not a function, another signature)."""
    class_name, _, method = qualname.partition(".")
    cls = getattr(module, class_name, None)
    where = f"{module.__name__}.{qualname}"
    if not isinstance(cls, type):
        return f"{module.__name__}.{class_name} not found"
    func = getattr(cls, method, None)
    if not inspect.isfunction(func):
        return f"{where} not found" if func is None else f"{where} is not a plain function"
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return f"{where} has no readable signature"
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params[1:] if p.kind in kinds and p.default is inspect.Parameter.empty]
    accepted = [p for p in params[1:] if p.kind in kinds]
    if not params or len(required) > positional or len(accepted) < positional:
        shown = ", ".join(p.name for p in params)
        return f"{where}({shown}) does not take {positional} argument(s) besides self"
    return cls, func
