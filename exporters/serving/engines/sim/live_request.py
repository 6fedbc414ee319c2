"""Engine-side state of an admitted request, and the pure pieces of producing its output: its seeded
generator, its output length, stop strings across token boundaries and the prefix-cache block hashes."""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from exporters.serving.engine import FinishReason, GenerationRequest, OutputEvent
from exporters.serving.engines.sim.roofline import BLOCK_SIZE
from exporters.serving.engines.sim.sched_types import SchedRequest
from exporters.serving.engines.sim.stats import FinishedRequestStats, IterationStats
from exporters.serving.engines.sim.stream import SimStream
from exporters.serving.engines.sim.tokenizer import WORD_BITS, stable_seed

NATURAL_LENGTH_SIGMA = 0.8
"""Spread of the lognormal natural output length (shape of chat answer lengths)."""


@dataclass(eq=False, slots=True)
class LiveRequest:
    """An admitted, unfinished request. The engine finds it by request id: the scheduler's request does not
    point back to it."""

    request: GenerationRequest
    """As the caller gave it; never modified."""
    sched: SchedRequest
    stream: SimStream
    rng: random.Random
    prompt_tokens: int
    max_tokens: int
    """The effective ``max_tokens`` (see :class:`~.admission.Admitted`)."""
    target: int
    """Output tokens to produce unless a stop string ends the request first."""
    natural: bool
    """``target`` is the natural (EOS) length: finishing there is ``stop``, not ``length``."""
    stops: tuple[str, ...]
    hold: int
    """Characters held back while streaming so a stop string is never half-emitted."""
    pending: str = ""
    last_t: float = 0.0


def new_live_request(
    request: GenerationRequest, sched: SchedRequest, stream: SimStream, rng: random.Random, *,
    prompt_tokens: int, max_tokens: int, mean_natural_output_tokens: int,
) -> LiveRequest:  # fmt: skip
    target, natural = output_target(
        rng, max_tokens, ignore_eos=request.sampling.ignore_eos, mean=mean_natural_output_tokens
    )
    stops = tuple(x for x in request.sampling.stop if x)
    return LiveRequest(
        request=request,
        sched=sched,
        stream=stream,
        rng=rng,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        target=target,
        natural=natural,
        stops=stops,
        hold=max((len(x) for x in stops), default=1) - 1,
    )


class LiveRequests:
    """The admitted, unfinished requests by id (how the loop finds a scheduler request's engine state), and
    what the engine reads from their comings and goings."""

    def __init__(self) -> None:
        self._by_id: dict[str, LiveRequest] = {}
        self.with_lora = 0
        """Live requests that use an adapter (while 0 the loop skips looking for adapter names)."""
        self._finish_times: deque[float] = deque(maxlen=64)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def __getitem__(self, request_id: str) -> LiveRequest:
        return self._by_id[request_id]

    def __iter__(self) -> Iterator[LiveRequest]:
        return iter(self._by_id.values())

    def ids(self) -> list[str]:
        return list(self._by_id)

    def add(self, live: LiveRequest) -> None:
        self._by_id[live.sched.request_id] = live
        if live.sched.lora is not None:
            self.with_lora += 1

    def pop(self, request_id: str) -> LiveRequest | None:
        live = self._by_id.pop(request_id, None)
        if live is not None and live.sched.lora is not None:
            self.with_lora -= 1
        return live

    def finish(self, live: LiveRequest, t: float) -> None:
        """``live`` produced its last token at ``t``."""
        live.stream.timing.finished = t
        self.pop(live.sched.request_id)
        self._finish_times.append(t)

    def retry_after(self) -> float:
        """Seconds until a slot likely frees: the recent mean gap between completions, 1 s without history."""
        times = self._finish_times
        if len(times) < 2 or times[-1] <= times[0]:
            return 1.0
        gap = (times[-1] - times[0]) / (len(times) - 1)
        return min(max(gap, 0.05), 30.0)

    def charge_block(self, start: float, end: float) -> None:
        """Every request in the engine while the loop was blocked waits for it (guide 2.4)."""
        for live in self._by_id.values():
            timing = live.stream.timing
            queued = timing.queued if timing.queued is not None else start
            if queued < end:
                timing.lora_blocked_seconds += end - max(start, queued)


def emit_tokens(
    lives: LiveRequests,
    sampled: list[SchedRequest],
    t: float,
    words: list[str],
    *,
    seen: float | None = None,
    deliver: Callable[[SimStream, OutputEvent], None] | None = None,
) -> tuple[IterationStats, list[SchedRequest]]:
    """Give every request that sampled at ``t`` its token (one pseudo-word), hand the events to ``deliver``
    (default: push them now), and retire the ones that finished. ``seen`` is when the API server would stamp
    them (the frontend's output part after ``t``; default ``t``): TTFT and E2E run to it, the engine's marks
    and the inter-token latencies use ``t``. Returns the step's stats and the finished scheduler requests."""
    seen = t if seen is None else seen
    it = IterationStats(num_generation_tokens=len(sampled))
    itls = it.inter_token_latencies
    finished: list[SchedRequest] = []
    for req in sampled:
        live = lives[req.request_id]
        n = req.num_output
        if n == 1:
            live.stream.timing.first_token = t
            it.time_to_first_tokens.append(seen - live.request.arrival_time)
            it.num_prompt_tokens += req.prompt_len
            it.num_cached_prompt_tokens += req.num_cached_tokens
        else:
            itls.append(t - live.last_t)
        live.last_t = t
        text, finish, stop_reason = next_text(live, words[live.rng.getrandbits(WORD_BITS)], n)
        event = OutputEvent(text, 1, live.prompt_tokens, n, finish, stop_reason, req.num_cached_tokens)
        if deliver is None:
            live.stream.push(event)
        else:
            deliver(live.stream, event)
        if finish is not None:
            finished.append(req)
            lives.finish(live, t)
            it.finished_requests.append(finished_stats(live, finish, t, seen))
    return it, finished


def output_rng(engine_seed: int, request: GenerationRequest, counter: int) -> random.Random:
    """Seeded by the request's ``seed``; else, when greedy, by the prompt (same prompt, same text); else by
    the engine's request counter."""
    sp = request.sampling
    if sp.seed is not None:
        return random.Random(stable_seed(engine_seed, "seed", sp.seed))
    if sp.temperature == 0:
        return random.Random(stable_seed(engine_seed, "prompt", request.prompt, request.image_count, request.model))
    return random.Random(stable_seed(engine_seed, "request", counter))


def output_target(rng: random.Random, max_tokens: int, *, ignore_eos: bool, mean: int) -> tuple[int, bool]:
    """(tokens to produce, whether that is the natural length). Draws from ``rng`` only without ignore_eos."""
    if ignore_eos:
        return max_tokens, False
    length = max(1, round(rng.lognormvariate(math.log(mean) - NATURAL_LENGTH_SIGMA**2 / 2, NATURAL_LENGTH_SIGMA)))
    if length < max_tokens:
        return length, True
    return max_tokens, False


def next_text(live: LiveRequest, word: str, n: int) -> tuple[str, FinishReason | None, str | None]:
    """For the ``n``-th output token (one pseudo-word): the text to send now, the finish reason if this token
    ends the request, and the stop string that ended it (None for EOS or length)."""
    piece = word if n == 1 else " " + word
    finish: FinishReason | None = None
    stop_reason: str | None = None
    if live.stops:
        text, stop_reason = check_stop(live, piece)
        if stop_reason is not None:
            finish = FinishReason.STOP
    else:
        text = piece
    if finish is None and n >= live.target:
        finish = FinishReason.STOP if live.natural else FinishReason.LENGTH
        text += live.pending
        live.pending = ""
    return text, finish, stop_reason


def finished_stats(
    live: LiveRequest, reason: FinishReason, t: float, seen: float | None = None
) -> FinishedRequestStats:
    """The record of a request that finished at ``t`` (the API server seeing it at ``seen``, default ``t``);
    marks it never got default to their predecessor."""
    req = live.sched
    timing = live.stream.timing
    queued = timing.queued if timing.queued is not None else t
    scheduled = timing.scheduled if timing.scheduled is not None else queued
    return FinishedRequestStats(
        reason,
        arrival=live.request.arrival_time,
        queued=queued,
        scheduled=scheduled,
        first_token=timing.first_token if timing.first_token is not None else t,
        last_token=t,
        prompt_tokens=live.prompt_tokens,
        output_tokens=req.num_output,
        max_tokens=live.max_tokens,
        preemptions=req.num_preemptions,
        computed_prompt_tokens=live.prompt_tokens - req.num_cached_tokens,
        last_token_seen=None if seen is None or seen == t else seen,
    )


def check_stop(live: LiveRequest, piece: str) -> tuple[str, str | None]:
    """Text to emit now and the stop string that ended the request, if any. The last ``hold`` characters are
    held back so a stop string split across tokens is never partly sent."""
    buf = live.pending + piece
    best = -1
    which: str | None = None
    for stop in live.stops:
        i = buf.find(stop)
        if i != -1 and (best == -1 or i < best):
            best, which = i, stop
    if which is not None:
        live.pending = ""
        return buf[:best], which
    cut = len(buf) - live.hold
    if cut > 0:
        live.pending = buf[cut:]
        return buf[:cut], None
    live.pending = buf
    return "", None


def block_hashes(ids: tuple[int, ...], salt: str) -> tuple[int, ...]:
    """Chained hashes of the full 16-token blocks (each covers its whole prefix, like vLLM's)."""
    out: list[int] = []
    parent = hash(salt)
    for start in range(0, len(ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = hash((parent, ids[start : start + BLOCK_SIZE]))
        out.append(parent)
    return tuple(out)
