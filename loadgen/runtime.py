"""The locustfile's entry into loadgen, per Locust process: pick the role, set it up, hand it out.

Roles (``loadgen/roles/``): ``local`` (one process), ``master`` (stage clock, merging, /metrics, results, no
requests) and ``worker`` (sends requests, ships measurement deltas every report interval).

Imported only inside Locust processes: it imports locust (and so gevent's patching).
"""

from __future__ import annotations

import sys
from typing import Any

import locust
from locust.env import Environment
from locust.runners import WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner

from loadgen.dispatch import Slot
from loadgen.options import add_locust_arguments
from loadgen.roles import LocalRole, MasterRole, Role, WorkerRole


def add_arguments(parser: Any) -> None:
    """Custom Locust options; each also reads the same ``LOADLENS_LOAD_*`` variable as ``loadlens load``."""
    add_locust_arguments(parser)


RT: Role | None = None


def setup(environment: Environment) -> Role:
    """Called from ``events.init`` in every Locust process."""
    global RT
    runner = environment.runner
    kind: type[Role] = LocalRole
    if isinstance(runner, MasterRunner):
        kind = MasterRole
    elif isinstance(runner, WorkerRunner):
        kind = WorkerRole
    role = kind(environment, report_interval=WORKER_REPORT_INTERVAL, locust_version=locust.__version__)
    role.start()
    RT = role
    if isinstance(role, LocalRole):
        # Not SystemExit: with --processes the forked workers would wait a minute for a dead master. The
        # first tick ends the test instead, which also stops the workers.
        role.fatal = role.check_target()
        if role.fatal:
            print(role.fatal, file=sys.stderr, flush=True)
            environment.process_exit_code = 1
    environment.stop_timeout = max(environment.stop_timeout or 0.0, role.profile.stop_timeout_s)
    return role


def runtime() -> Role:
    if RT is None:
        raise RuntimeError("the loadlens runtime is set up by the locustfile's init listener")
    return RT


def clock() -> LocalRole:
    """The role that runs the stage clock (the shape ticks only in the master or local process)."""
    role = runtime()
    if not isinstance(role, LocalRole):
        raise RuntimeError("only the master or local process runs the stage clock")
    return role


__all__ = ["Slot", "add_arguments", "clock", "runtime", "setup"]
