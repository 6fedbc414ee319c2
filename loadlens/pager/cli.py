"""``loadlens pager``: Alertmanager webhook receiver (prints pages, appends them to a JSONL log)."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadlens.util.cliutil import env_arg, port_number

DEFAULT_PORT = 9095


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pager",
        help="receive Alertmanager webhooks: print pages, log them as JSONL, count them",
        description="A webhook receiver for Alertmanager's version-4 payload (POST /alerts).",
    )
    env = "LOADLENS_PAGER_"
    env_arg(p, "--host", default="127.0.0.1", help="address to bind", env_prefix=env)
    env_arg(p, "--port", type=port_number, default=DEFAULT_PORT, help="TCP port", env_prefix=env)
    env_arg(
        p,
        "--log-file",
        type=Path,
        default=Path("pages.jsonl"),
        help="JSONL file every notification is appended to",
        env_prefix=env,
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from loadlens.pager.app import create_pager_app

    app = create_pager_app(args.log_file)
    print(f"loadlens pager: http://{args.host}:{args.port}/alerts -> {args.log_file}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
