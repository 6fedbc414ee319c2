"""The ``loadlens`` command: one entry point, one module per subcommand.

Each subcommand module exposes ``register(subparsers)``; its parser sets ``handler`` to a function that
takes the parsed namespace and returns an exit code. Usage errors exit 2 with a one-line reason.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from exporters.common.cliutil import UsageError

# Subcommand modules, imported lazily only to build the parser (their heavy imports stay inside handlers).
SUBCOMMANDS: tuple[str, ...] = (
    "exporters.serving.cli",
    "exporters.gpu.cli",
    "loadgen.cli",
    "exporters.pager.cli",
    "exporters.stack.cli",
    "exporters.report.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadlens",
        description="Load-test, watch and alert on LLM inference servers and their GPUs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue  # not built yet in this checkout
            raise
        module.register(sub)
    return parser


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed subcommand: a usage error exits 2 with one line, Ctrl-C exits 130."""
    try:
        code: int = args.handler(args)
    except UsageError as err:
        print(f"loadlens {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
