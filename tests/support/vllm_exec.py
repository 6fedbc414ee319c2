"""Become the rig's vLLM: one command line for ``loadlens experiment --server-command`` (docs/real-vllm.md).

    python -m tests.support.vllm_exec --port 8001 --max-num-seqs 8 --max-num-batched-tokens 512

builds (or finds) the tiny model, adds the rig's environment (``tests.support.vllm_server.ENV``, and its
temporary files sent to ``runtime_dir(port)``) and replaces itself (``exec``) with ``vllm_argv(model, port)``
plus every argument it does not know, which go to vLLM's API server as they are. Being an ``exec``, the
process the experiment started, and whose process group it kills after the trial, is vLLM's API server itself.
The first line of its output is the command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tests.support import vllm_server as rig
from tests.support.vllm_model import tiny_model


def command(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """vLLM's argv and environment for these arguments (``--port`` and ``--max-loras`` read, the rest
    passed on)."""
    p = argparse.ArgumentParser(prog="python -m tests.support.vllm_exec", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True, help="the port vLLM listens on (127.0.0.1)")
    p.add_argument("--max-loras", type=int, default=1, help="adapters held at once (vLLM's --max-loras)")
    args, rest = p.parse_known_args(argv)
    exe = rig.python()
    if exe is None:
        p.error(f"vLLM's CPU build is not installed at {rig.venv()}: make vllm-env")
    full = rig.vllm_argv(tiny_model(), args.port, interpreter=exe, max_loras=args.max_loras, extra_args=rest)
    return full, {**os.environ, **rig.ENV, **rig.runtime_env(rig.runtime_dir(args.port))}


def main(argv: Sequence[str] | None = None) -> int:
    full, env = command(sys.argv[1:] if argv is None else argv)
    print("$ " + " ".join(full), flush=True)
    os.execve(full[0], full, env)
    return 1  # not reached: execve replaces the process or raises


if __name__ == "__main__":
    raise SystemExit(main())
