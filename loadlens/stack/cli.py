"""``loadlens stack up|down|status|restart SERVICE``: the whole local stack as child processes, no Docker."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from loadlens.contracts.ports import PORT
from loadlens.util.cliutil import UsageError, env_arg, port_number, positive_float


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stack",
        help="run the local stack (Prometheus, Alertmanager, sim server, GPU exporter, pager) without Docker",
        description=(
            "up: start every process on 127.0.0.1 with generated configs in --run-dir and wait until each is ready; "
            "down: stop them by PID; status: show each process and whether it answers; restart SERVICE: stop one "
            "and start it again with the same command line, configs and data (a failure drill)."
        ),
    )
    p.add_argument("action", choices=["up", "down", "status", "restart"], help="what to do")
    p.add_argument(
        "service",
        nargs="?",
        default=None,
        help="restart only: the service to restart (pager, alertmanager, serve, gpu-exporter, prometheus)",
    )
    env = "LOADLENS_STACK_"
    env_arg(p, "--run-dir", type=Path, default=Path(".run/stack"), help="configs, data, logs, PIDs", env_prefix=env)
    for name in ("serve", "gpu", "pager", "loadgen", "training", "prometheus", "alertmanager"):
        env_arg(p, f"--{name}-port", type=port_number, default=PORT[name], help=f"{name} port", env_prefix=env)
    env_arg(p, "--model-profile", default="deepseek-vl-7b", help="sim model profile", env_prefix=env)
    env_arg(p, "--gpu-profile", default="a100-40gb-pcie", help="sim GPU profile", env_prefix=env)
    env_arg(p, "--speed", type=positive_float, default=1.0, help="sim time compression", env_prefix=env)
    p.add_argument("--knob", action="append", default=None, help="sim knob NAME=VALUE (repeatable)")
    env_arg(p, "--slo-file", type=Path, default=None, help="SLO file for the server and the rules", env_prefix=env)
    env_arg(p, "--scrape-interval", default="2s", help="Prometheus scrape and rule evaluation interval", env_prefix=env)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from loadlens.stack.runner import Stack, StackOptions

    options = StackOptions(
        run_dir=args.run_dir,
        serve_port=args.serve_port,
        gpu_port=args.gpu_port,
        pager_port=args.pager_port,
        loadgen_port=args.loadgen_port,
        training_port=args.training_port,
        prometheus_port=args.prometheus_port,
        alertmanager_port=args.alertmanager_port,
        model_profile=args.model_profile,
        gpu_profile=args.gpu_profile,
        speed=args.speed,
        knobs=args.knob if args.knob is not None else ["scheduling_policy=priority"],
        slo_file=args.slo_file,
        scrape_interval=args.scrape_interval,
    )
    stack = Stack(options)
    if (args.service is not None) != (args.action == "restart"):
        raise UsageError("restart needs a SERVICE, and only restart takes one")
    if args.action == "restart":
        try:
            service = stack.restart(args.service)
        except RuntimeError as err:
            print(f"loadlens stack: {err}")
            return 1
        print(f"loadlens stack: restarted {service.name} (pid {service.pid}), ready at {service.url}")
        return 0
    if args.action == "up":
        print(f"loadlens stack: starting in {stack.run_dir}")
        try:
            services = stack.up()
        except RuntimeError as err:
            print(f"loadlens stack: {err}")
            return 1
        print("loadlens stack: up")
        for s in services:
            print(f"  {s.name:<13} {s.url:<28} pid {s.pid:<7} log {stack.run_dir / s.log}")
        for what, url in stack.ui_links():
            print(f"  {what + ':':<18} {url}")
        return 0
    if args.action == "down":
        print(f"loadlens stack: stopping the processes recorded in {stack.run_dir / 'stack.json'}", flush=True)
        stopped = stack.down()
        print(f"loadlens stack: stopped {', '.join(stopped) if stopped else 'nothing (no live processes)'}")
        return 0
    rows = stack.status()
    if not rows:
        print(f"loadlens stack: not running (no {stack.run_dir / 'stack.json'})")
        return 3
    for service, alive, ready in rows:
        state = "ready" if ready else ("running, not answering" if alive else "stopped")
        print(f"  {service.name:<13} {service.url:<28} pid {service.pid:<7} {state}")
    firing, pages, last = stack.alerts_and_pages()
    if firing is None:
        print("  alerts firing: unknown (Prometheus does not answer)")
    else:
        print(f"  alerts firing: {len(firing)}{': ' + ', '.join(firing) if firing else ''}")
    when = time.strftime("%H:%M:%S", time.localtime(last)) if last is not None else ""
    print(f"  notifications received by the pager: {pages}{f' (last at {when})' if when else ''}")
    return 0 if all(ready for _, _, ready in rows) else 1
