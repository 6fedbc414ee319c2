"""How late the step loop woke against each deadline: a :class:`~.stats.WakeupStats` per wake-up, and a
warning, at most every :data:`LAG_LOG_INTERVAL` seconds, while the loop is far behind real time."""

from __future__ import annotations

import logging
import math

from exporters.serving.engines.sim.stats import WakeupStats

SLIP_SECONDS = 0.25
"""Lateness beyond which the loop gives up catching up and restarts its schedule from now."""

LATE_SECONDS = 0.002
"""A wake-up later than this against its deadline is a late step (the sim's 2 ms p99 timing goal)."""

LAG_LOG_SECONDS = 0.05
"""A wake-up this late is worth a warning (late steps below it are only counted)."""

LAG_LOG_INTERVAL = 10.0
"""Seconds between two "behind real time" warnings, at most."""


class Lateness:
    """Judges each wake-up; warns on ``log`` (the engine's logger) with the late steps since the last warning."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._last_log = -math.inf
        self._late_since_log = 0
        self._slips_since_log = 0

    def woke(self, deadline: float, now: float) -> WakeupStats:
        late = now - deadline
        slipped = late > SLIP_SECONDS
        if late > LATE_SECONDS:
            self._late_since_log += 1
            self._slips_since_log += slipped
            if late > LAG_LOG_SECONDS and now - self._last_log >= LAG_LOG_INTERVAL:
                self._log.warning(
                    "sim engine is %.3f s behind real time (%d late steps, %d schedule restarts since the last "
                    "such warning); its latencies are measured as delivered, so they include this lag",
                    late, self._late_since_log, self._slips_since_log,
                )  # fmt: skip
                self._last_log = now
                self._late_since_log = self._slips_since_log = 0
        return WakeupStats(late, late > LATE_SECONDS, slipped)
