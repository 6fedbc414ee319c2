"""The API server's share of a request's time (docs/sim-engine.md §1, *Frontend*): what vLLM's TTFT and E2E
include outside its engine core. vLLM stamps a request's arrival in its API server before input processing
(rendering, tokenization, the hop to the engine core), and its TTFT and E2E end when the API server's output
handler processes the step's outputs (``IterationStats.iteration_timestamp``), after the hop back; its queue,
prefill, decode, inference and inter-token intervals are engine-core stamps. So the sim:

- holds a request for ``frontend_fixed_seconds`` after its arrival stamp before it enters the waiting queue
  (vLLM's series cannot split the fixed part between input and output: it is in both TTFT and E2E, and a
  constant delay before the queue or after the step moves a closed or an open loop's engine schedule by
  a constant, so every figure is the same either way; the sim spends it before the queue);
- hands a step's tokens to the streams, and stamps TTFT and E2E, ``frontend_per_running_seconds`` × the
  step's sequences after the step ends, in order (never before the previous step's tokens).

Both default to 0: then nothing waits and every stamp is the step's end, as before the stage existed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from exporters.serving.engine import OutputEvent
from exporters.serving.engines.sim.profile import GPUProfile
from exporters.serving.engines.sim.stream import SimStream

Deliver = Callable[[SimStream, OutputEvent], None]


def _push_all(pushes: list[tuple[SimStream, OutputEvent]]) -> None:
    for stream, event in pushes:
        stream.push(event)


class Frontend:
    def __init__(self, gpu: GPUProfile, speed: float, clock: Callable[[], float]) -> None:
        self.input_seconds = gpu.frontend_fixed_seconds / speed
        self.per_running_seconds = gpu.frontend_per_running_seconds / speed
        self._clock = clock
        self._last_seen = -math.inf

    async def enter(self) -> None:
        """The input part: returns when the request reaches the engine's waiting queue."""
        if self.input_seconds > 0:
            await asyncio.sleep(self.input_seconds)

    def output(self, end: float, seqs: int) -> tuple[float, Deliver | None]:
        """(when the API server sees the tokens of a step of ``seqs`` sequences that ended at ``end``, how to
        deliver them: None to push them now, else a collector whose events are pushed then)."""
        if not self.per_running_seconds:
            return end, None
        seen = max(end + self.per_running_seconds * seqs, self._last_seen)
        self._last_seen = seen
        pushes: list[tuple[SimStream, OutputEvent]] = []
        asyncio.get_running_loop().call_later(max(0.0, seen - self._clock()), _push_all, pushes)
        return seen, lambda stream, event: pushes.append((stream, event))
