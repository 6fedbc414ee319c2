"""``python -m exporters.gpu [flags]``: the GPU exporter alone, with the flags of ``loadlens gpu-exporter``.

It builds only this subcommand's parser, so the nvml backend needs nothing beyond prometheus-client and
nvidia-ml-py: none of the serving layer's or the load generator's imports (FastAPI, Locust, pydantic). This
suits a lean install on a GPU node.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from exporters.gpu.cli import register
from loadlens.util.cliutil import dispatch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters.gpu")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    sub.choices["gpu-exporter"].prog = parser.prog  # usage and errors name the command the user typed
    return dispatch(parser.parse_args(["gpu-exporter", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
