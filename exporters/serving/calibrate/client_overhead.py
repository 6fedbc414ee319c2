"""The time a closed-loop user spends outside vLLM's own measure, as ``loadlens calibrate`` models it for its
replay (docs/calibration.md, *Client overhead*), in two parts, per stage:

- **outside**: the client's mean E2E minus vLLM's mean E2E (HTTP, the API server before its arrival stamp,
  delivery to the client): inside the client's TTFT and E2E;
- **turnaround**: the user's cycle (``users × duration / completed``, Little's law for a closed loop) minus the
  client's mean E2E and the think time the load asked for (its mean: user_draws.py): the load generator's own
  time between one answer and the next request, in no latency the client reports but in every request's
  cycle, so in the server's concurrency and throughput.

Each is fitted as ``fixed + per_user × users`` over the fitted stages, because on a host whose load generator
and API server share cores both grow with the streams they handle (on the 2-core rig: outside 3 to 110 ms,
turnaround 0 to 83 ms, from one user to eight). Where the data cannot tell a growth (fewer than three stages,
one number of users, a slope not above zero or not above its standard error), or ``--constant-client-overhead``
asks, a part is one constant, its mean. Neither is in the profile: the sim has no field for them and
``loadlens serve`` has an HTTP layer of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporters.serving.calibrate.observations import Stage


@dataclass(frozen=True, slots=True)
class Line:
    fixed_s: float
    per_user_s: float
    """0 where the part is a constant."""
    note: str
    """How it was modeled, and why a constant where it is one."""
    points: dict[str, tuple[int, float]]
    """Stage -> (users, the part's value, seconds)."""

    @property
    def mean_s(self) -> float:
        return sum(v for _, v in self.points.values()) / len(self.points)

    def at(self, users: int) -> float:
        """The part for a stage of ``users`` (never below 0)."""
        return max(0.0, self.fixed_s + self.per_user_s * users)


@dataclass(frozen=True, slots=True)
class ClientOverhead:
    outside: Line
    """Added before each replayed request's arrival, inside its client TTFT and E2E."""
    turnaround: Line | None
    """Waited after each replayed answer before the user's next request; None without the stages' counts."""


def stage_gap(stage: Stage) -> float | None:
    """The client's mean E2E minus vLLM's mean E2E, seconds; None without both."""
    server = stage.server_mean("vllm:e2e_request_latency_seconds")
    client = stage.figures.get("mean_e2el_ms")
    return client / 1000 - server if server is not None and client else None


def stage_turnaround(stage: Stage) -> float | None:
    """The closed loop's cycle per user minus the client's mean E2E and the users' mean think time (known: the
    load asked for it, and the replay draws it apart), seconds; None without both. Per run: a stage read from
    repeats has their requests summed and one run's duration."""
    client = stage.figures.get("mean_e2el_ms")
    if not client or stage.completed <= 0 or stage.duration_s <= 0:
        return None
    cycle = stage.users * stage.duration_s * stage.runs / stage.completed
    return cycle - client / 1000 - stage.think_time.expected()


def fit_line(points: dict[str, tuple[int, float]], constant: bool = False) -> Line | None:
    """``fixed + per_user × users`` by least squares, or the mean with the reason; None without points."""
    if not points:
        return None
    users = np.array([u for u, _ in points.values()], dtype=float)
    y = np.array([v for _, v in points.values()])
    mean = float(y.mean())

    def flat(why: str) -> Line:
        return Line(mean, 0.0, f"constant, the mean over the fitted stages: {why}", points)

    if constant:
        return flat("--constant-client-overhead")
    if len(points) < 3 or len(set(users.tolist())) < 2:
        return flat(f"{len(points)} stages, {len(set(users.tolist()))} numbers of users (a growth needs 3 and 2)")
    x = np.column_stack([np.ones_like(users), users])
    (fixed, slope), *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ np.array([fixed, slope])
    sigma2 = float(resid @ resid) / (len(y) - 2)
    se = float(np.sqrt(np.linalg.inv(x.T @ x)[1, 1] * sigma2))
    if slope <= 0:
        return flat(f"no growth with users in the data ({slope * 1000:.3g} ms per user)")
    if se > slope:
        return flat(f"its growth with users not determined ({slope * 1000:.3g} ± {se * 1000:.3g} ms per user)")
    note = f"{fixed * 1000:.3g} ms + {slope * 1000:.3g} ms per user (± {se * 1000:.2g}), fitted over the stages"
    return Line(float(fixed), float(slope), note, points)


def fit_client_overhead(stages: Sequence[Stage], constant: bool = False) -> ClientOverhead | None:
    """Both parts over ``stages`` (the fitted ones); None where no stage has both E2E means."""
    outside = fit_line({s.name: (s.users, g) for s in stages if (g := stage_gap(s)) is not None}, constant)
    if outside is None:
        return None
    turns = {s.name: (s.users, t) for s in stages if (t := stage_turnaround(s)) is not None}
    return ClientOverhead(outside, fit_line(turns, constant))
