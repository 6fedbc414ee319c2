"""loadlens Locust file: LLM users streaming from an OpenAI-compatible server, driven by a load profile.

Run it through ``loadlens load`` or directly::

    locust -f loadgen/locustfile.py --host http://127.0.0.1:8000 --load-profile quick            # web UI
    locust -f loadgen/locustfile.py --host http://127.0.0.1:8000 --load-profile quick --headless
    locust -f loadgen/locustfile.py --host ... --headless --processes 4                          # 4 workers

Options (``--load-profile``, ``--model``, ``--time-scale``, ...) and measurement definitions: docs/loadgen.md.
"""

import locust  # noqa: F401, I001 - first, so gevent patches the standard library before anything else

import logging
import os
import sys
from typing import Any

from locust import LoadTestShape, User, events, task
from locust.env import Environment
from locust.exception import RescheduleTask
from locust.runners import WorkerRunner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plain `locust -f` from anywhere

from loadgen import runtime
from loadgen.profile import ProfileError
from loadlens.contracts.slo import SLOConfigError


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: Any, **kwargs: Any) -> None:
    runtime.add_arguments(parser)


@events.init.add_listener  # type: ignore[untyped-decorator]
def _init(environment: Environment, **kwargs: Any) -> None:
    try:
        runtime.setup(environment)
    except (ProfileError, SLOConfigError) as err:
        print(f"loadlens: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def _quiet_locust_tables(environment: Environment, **kwargs: Any) -> None:
    """Locust prints its request tables right after this event. They are not printed: their *Aggregated* row
    adds each request's TTFT, TPOT and E2E events (three rows of samples per request, averaged together);
    the run's own table (loadgen/summary.py) has been printed from the results instead."""
    if not isinstance(environment.runner, WorkerRunner):
        logging.getLogger("locust.stats_logger").disabled = True


class LLMUser(User):
    """Streams one request at a time. Closed-loop stages: the next request starts when the last one ends.

    Open-loop stages: the user is a sender from a pool; ``wait_time`` hands it the next scheduled arrival,
    and latency is measured from that scheduled time, not from when the user got round to sending.
    """

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.rt = runtime.runtime()
        self.http = self.rt.target.client(self.rt.profile.request_timeout_s)
        self.slot: runtime.Slot | None = None
        self.backoff = 0.0

    def wait_time(self) -> float:
        return self.rt.wait_time(self)

    def reconnect(self) -> None:
        """Drop the connection (after an error or a cancelled stream) so the next request starts clean."""
        self.http.close()
        self.http = self.rt.target.client(self.rt.profile.request_timeout_s)

    def on_stop(self) -> None:
        self.http.close()

    @task
    def generate(self) -> None:
        if not self.rt.run_request(self):
            raise RescheduleTask()  # no valid open-loop slot: go through wait_time to claim one


class ProfileShape(LoadTestShape):
    """Stages come from the profile file (data, not code), for example::

        stages:
          - {name: warmup, users: 4, until_requests: 100, warmup: true}
          - {name: c8, users: 8, duration: 180}
          - {name: c16, users: 16, duration: 180}
          - {name: open-10rps, rate: 10, arrival: poisson, max_concurrency: 64, duration: 60}

    ``tick`` returns (users, spawn rate) for the current stage, (0, rate) while in-flight requests finish
    after the last stage, and None to end the test.
    """

    def tick(self) -> tuple[int, float] | None:
        return runtime.clock().tick()
