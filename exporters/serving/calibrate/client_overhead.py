"""The time a request spends outside vLLM's own measure, as ``loadlens calibrate`` models it for its replay
(docs/calibration.md, *Client overhead*): per stage, the client's mean E2E minus vLLM's mean E2E (HTTP, the
API server before its arrival stamp, delivery to the client, the client's turnaround), fitted as
``fixed + per_user × users`` over the fitted stages, because on a host whose client and API server share
cores it grows with the streams they handle (6 ms at one user, 120 ms at eight on the 2-core rig). Where the
data cannot tell a growth (fewer than three stages, one number of users, a slope not above its standard error
or below zero), or ``--constant-client-overhead`` asks, it is one constant, the mean. It is not in the profile:
the sim has no field for it and ``loadlens serve`` has an HTTP layer of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporters.serving.calibrate.observations import Stage


@dataclass(frozen=True, slots=True)
class ClientOverhead:
    fixed_s: float
    per_user_s: float
    """0 where the model is a constant."""
    note: str
    """How it was modeled, and why a constant where it is one."""
    gaps: dict[str, tuple[int, float]]
    """Stage -> (users, the client's mean E2E minus vLLM's, seconds)."""

    @property
    def mean_s(self) -> float:
        return sum(g for _, g in self.gaps.values()) / len(self.gaps)

    def at(self, users: int) -> float:
        """The overhead the replay adds before each request of a stage of ``users`` (never below 0)."""
        return max(0.0, self.fixed_s + self.per_user_s * users)


def stage_gap(stage: Stage) -> float | None:
    """The client's mean E2E minus vLLM's mean E2E, seconds; None without both."""
    server = stage.server_mean("vllm:e2e_request_latency_seconds")
    client = stage.figures.get("mean_e2el_ms")
    return client / 1000 - server if server is not None and client else None


def fit_client_overhead(stages: Sequence[Stage], constant: bool = False) -> ClientOverhead | None:
    """The model over ``stages`` (the fitted ones); None where no stage has both means."""
    gaps = {s.name: (s.users, g) for s in stages if (g := stage_gap(s)) is not None}
    if not gaps:
        return None
    users = np.array([u for u, _ in gaps.values()], dtype=float)
    y = np.array([g for _, g in gaps.values()])
    mean = float(y.mean())

    def flat(why: str) -> ClientOverhead:
        return ClientOverhead(mean, 0.0, f"constant, the mean over the fitted stages: {why}", gaps)

    if constant:
        return flat("--constant-client-overhead")
    if len(gaps) < 3 or len(set(users.tolist())) < 2:
        return flat(f"{len(gaps)} stages, {len(set(users.tolist()))} numbers of users (a growth needs 3 and 2)")
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
    return ClientOverhead(float(fixed), float(slope), note, gaps)
