"""When the admission window lets waiting requests join the running batch (``batching_window_mode=admission``).

Pure: the engine's loop asks it before every step, on the loop's clock; a modeled-time replay of the loop
(tests/sim/test_admission_window.py) asks it on modeled seconds.
"""

from __future__ import annotations

import math

from exporters.serving.engines.sim.knobs import Knobs
from exporters.serving.engines.sim.scheduler import Scheduler


def window_close(k: Knobs, s: Scheduler, last_admission: float, seconds_per_us: float) -> float | None:
    """When the window gathering the waiting requests closes: ``batching_window_us`` after the later of the
    oldest waiting arrival and the last admission (``seconds_per_us`` converts the knob to the clock's
    seconds: 1e-6 / speed on the loop). None when they may join now: the mode is off, nothing waits, or the
    waiting requests would fill a batch (``max_num_seqs`` of them or ``max_num_batched_tokens`` of prompt)."""
    if k.batching_window_mode != "admission" or k.batching_window_us <= 0 or not s.num_waiting:
        return None
    if s.num_waiting >= k.max_num_seqs or s.waiting_tokens >= k.max_num_batched_tokens:
        return None
    oldest = s.earliest_arrival()
    opened = max(last_admission, oldest if oldest is not None else -math.inf)
    return opened + k.batching_window_us * seconds_per_us
