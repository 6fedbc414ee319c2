"""Serve a ScriptedEngine (exact, fixed TTFT and ITL) on 127.0.0.1 as a process: ground truth for the loadgen.

``python -m tests.loadgen.scripted_server --port P --ttft 0.05 --itl 0.01`` prints ``ready`` when listening.
Used by the benchmark, which needs the server in a process of its own (the tests serve it in a thread).
"""

from __future__ import annotations

import argparse
import sys

import uvicorn
from prometheus_client import CollectorRegistry

from exporters.serving.app import ServeSettings, create_app
from exporters.serving.tracing import Tracing
from tests.serving.fakes import ScriptedEngine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--max-active", type=int, default=100000)
    args = p.parse_args(argv)
    engine = ScriptedEngine(ttft_s=args.ttft, itl_s=args.itl, max_active=args.max_active)
    app = create_app(engine, ServeSettings(), registry=CollectorRegistry(), tracing=Tracing.disabled())
    print("ready", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, http="httptools")
    return 0


if __name__ == "__main__":
    sys.exit(main())
