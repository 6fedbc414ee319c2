"""Shared CLI conventions: every flag has a ``LOADLENS_*`` environment variable, and bad input exits 2.

Usage in a subcommand module::

    def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        p = sub.add_parser("gpu-exporter", help="...", description="...")
        env_arg(p, "--port", type=port_number, default=9400, help="TCP port to listen on")
        p.set_defaults(handler=run)

    def run(args: argparse.Namespace) -> int: ...

``env_arg`` derives the variable from the flag (``--sim-url`` -> ``LOADLENS_SIM_URL``), appends it and the
default to the help text, and parses the environment value with the flag's own ``type`` so a bad value in
the environment is reported exactly like a bad flag.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any


class UsageError(Exception):
    """A user mistake detected after parsing (e.g. an unknown profile). ``main`` prints it and exits 2."""


def env_name(flag: str, prefix: str = "LOADLENS_") -> str:
    return prefix + flag.lstrip("-").replace("-", "_").upper()


def env_arg(
    parser: argparse.ArgumentParser, flag: str, *, help: str, env_prefix: str = "LOADLENS_", **kwargs: Any
) -> argparse.Action:
    """Add ``flag`` whose default comes from ``<env_prefix><FLAG>`` when set (flags still win).

    ``loadlens serve`` uses the bare ``LOADLENS_`` prefix (its documented contract); other subcommands pass
    their own (``LOADLENS_PAGER_``) so one environment can configure several processes without clashes.
    """
    var = env_name(flag, env_prefix)
    conv: Callable[[str], Any] = kwargs.get("type") or str
    action = kwargs.get("action")
    default = kwargs.get("default")
    raw = os.environ.get(var)
    if raw is not None and raw != "":
        if action == "store_true":
            default = raw.strip().lower() in {"1", "true", "yes", "on"}
        elif action == "append":
            # A repeatable flag's variable holds a comma-separated list; each item is parsed like one flag.
            # Flags given as well are appended after these, so for keyed values (NAME=VALUE) the flag wins.
            try:
                default = [conv(item.strip()) for item in raw.split(",") if item.strip()]
            except (argparse.ArgumentTypeError, ValueError) as err:
                parser.error(f"environment variable {var}={raw!r}: {err}")
        else:
            try:
                default = conv(raw)
            except (argparse.ArgumentTypeError, ValueError) as err:
                parser.error(f"environment variable {var}={raw!r}: {err}")
            choices = kwargs.get("choices")
            if choices is not None and default not in choices:
                parser.error(f"environment variable {var}={raw!r}: choose from {', '.join(map(str, choices))}")
    kwargs["default"] = default
    shown = "" if default is None or action == "store_true" else f" (default: {kwargs['default']})"
    return parser.add_argument(flag, help=f"{help}{shown} [env: {var}]", **kwargs)


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from err
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0-65535: {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from err
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number: {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from err
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def dispatch(args: argparse.Namespace) -> int:
    """Run a parsed subcommand: a usage error exits 2 with one line, Ctrl-C exits 130."""
    try:
        code: int = args.handler(args)
    except UsageError as err:
        print(f"loadlens {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code
