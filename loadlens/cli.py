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
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with ``only`` that one (the others' modules stay unimported)."""
    parser = argparse.ArgumentParser(
        prog="loadlens",
        description="Load-test, watch and alert on LLM inference servers and their GPUs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    only = args[0] if args and args[0] in SUBCOMMANDS else None
    return dispatch(build_parser(only).parse_args(args))


if __name__ == "__main__":
    sys.exit(main())
