"""``python -m exporters.gpu [flags]``: the GPU exporter alone, with the flags of ``loadlens gpu-exporter``.

It builds only this subcommand's parser, so the nvml backend needs nothing beyond prometheus-client and
nvidia-ml-py: none of the serving layer's or the load generator's imports (FastAPI, Locust, pydantic). This
suits a lean install on a GPU node.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from exporters.common.cliutil import UsageError
from exporters.gpu.cli import register


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters.gpu")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["gpu-exporter", *(sys.argv[1:] if argv is None else argv)])
    try:
        code: int = args.handler(args)
    except UsageError as err:
        print(f"loadlens gpu-exporter: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
