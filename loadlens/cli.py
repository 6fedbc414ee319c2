"""The ``loadlens`` command: one entry point, one module per subcommand, imported only when it runs.

Each subcommand module exposes ``register(subparsers)``; its parser sets ``handler`` to a function that
takes the parsed namespace and returns an exit code. Usage errors exit 2 with a one-line reason.

``loadlens gpu-exporter ...`` imports only ``exporters.gpu.cli``: a lean GPU-node image starts it without
FastAPI, Locust or matplotlib installed. ``loadlens --help`` (or an unknown command) imports every module to
list them all.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from loadlens.util.cliutil import dispatch

# Subcommand name -> the module that registers it, in the order `--help` lists them.
SUBCOMMANDS: dict[str, str] = {
    "serve": "exporters.serving.cli",
    "gpu-exporter": "exporters.gpu.cli",
    "load": "loadgen.cli",
    "pager": "loadlens.pager.cli",
    "stack": "loadlens.stack.cli",
    "report": "loadlens.report.cli",
    "experiment": "loadlens.experiment.cli",
    "compare": "loadlens.experiment.compare",
    "lora": "loadlens.lora.cli",
    "gpu-bench": "loadlens.gpubench.cli",
    "calibrate": "exporters.serving.calibrate.cli",
}


# What each subcommand needs beyond the base install (the GPU exporter's), by install extra (pyproject.toml).
# Checked after parsing (so --help always works) and before anything starts, so `loadlens serve` on a lean
# install says which extra is missing instead of a traceback.
REQUIRES: dict[str, tuple[str, tuple[str, ...]]] = {
    "serve": ("serve", ("fastapi", "starlette", "uvicorn", "opentelemetry", "aiohttp")),
    "pager": ("serve", ("fastapi", "starlette", "uvicorn")),
    "stack": ("serve", ("fastapi", "starlette", "uvicorn", "opentelemetry", "aiohttp")),
    "load": ("load", ("locust", "gevent", "geventhttpclient", "hdrh")),
    "report": ("report", ("matplotlib",)),
    "experiment": ("load", ("locust", "gevent", "geventhttpclient", "hdrh")),
    "lora": ("lora", ("numpy",)),
    "calibrate": ("lora", ("numpy",)),
}


def _installed(package: str) -> bool:
    if package in sys.modules:  # imported already, or blocked (None) as an uninstalled one would be
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None


def missing_extra(command: str) -> str | None:
    """The one-line reason when ``command`` lacks an optional package, or None when all are there."""
    extra, packages = REQUIRES.get(command, ("", ()))
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return None
    return f"needs the {extra!r} extra ({', '.join(missing)} not installed): pip install 'loadlens[{extra}]'"


def installed_version() -> str:
    """The installed distribution's version (``pyproject.toml``), or ``0.0.0+source`` in a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loadlens")
    except PackageNotFoundError:
        return "0.0.0+source"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with ``only`` that one (the others' modules stay unimported)."""
    parser = argparse.ArgumentParser(
        prog="loadlens",
        description="Load-test, watch and alert on LLM inference servers and their GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"loadlens {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        reason = missing_extra(name)
        if reason is not None:
            # Its module may not even import without the extra: list it, and say why when it is asked for.
            stub = sub.add_parser(name, help=f"({reason})", add_help=False, prefix_chars="\0")
            stub.add_argument("rest", nargs=argparse.REMAINDER)
            continue
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:  # without importing every subcommand's module
        print(f"loadlens {installed_version()}")
        return 0
    only = args[0] if args and args[0] in SUBCOMMANDS else None
    parsed = build_parser(only).parse_args(args)
    reason = missing_extra(parsed.command)
    if reason is not None:
        print(f"loadlens {parsed.command}: error: {reason}", file=sys.stderr)
        return 2
    return dispatch(parsed)


if __name__ == "__main__":
    sys.exit(main())
