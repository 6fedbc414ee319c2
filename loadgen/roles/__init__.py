"""One class per Locust process role (they import gevent, never locust itself: ``loadgen.runtime`` picks one).

``LocalRole`` (one process: stage clock, requests, /metrics, results), ``MasterRole`` (the clock, merging
and output, no requests) and ``WorkerRole`` (requests; ships measurements to the master).
"""

from loadgen.roles.base import Role
from loadgen.roles.local import LocalRole
from loadgen.roles.master import MasterRole
from loadgen.roles.worker import WorkerRole

__all__ = ["LocalRole", "MasterRole", "Role", "WorkerRole"]
