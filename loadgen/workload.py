"""The workload around each request: which conversation it continues, the prefix-cache hits a perfect cache
would give it, and the figures that come of both (per stage, in ``benchmark_result.json``'s ``workload``).

**Expected prefix-cache hits** (docs/loadgen.md, *Shared prefixes and the prefix cache*). A request's *shared*
tokens are those an earlier request's prompt already began with, by the profile's design:

- a continued conversation turn: the whole previous turn's prompt (its ``usage.prompt_tokens``; minus one
  token on ``completions``, where the reply's first characters may merge with the prompt's last word);
- otherwise, a request that starts with a shared prefix (``prefix``) that this process has already sent to
  the same model: the prefix's ``tokens``;
- otherwise 0.

A perfect prefix cache of whole blocks (infinite, caching prompt blocks only, as the sim does) hits
``floor(min(shared, prompt_tokens − 1) / B) · B`` of them, B = the profile's ``cache_block_size``: never the
prompt's last token (one must be computed to produce output), never a partial block. The expected hit rate of
a stage is Σ hits ÷ Σ ``usage.prompt_tokens`` over its successful requests; the server's is
``vllm:prefix_cache_hits_total`` ÷ ``vllm:prefix_cache_queries_total`` over the stage (``--prometheus``).

Usage (the executor does this for every request)::

    workload = Workload(profile, prompts, seed=1, process_index=0)
    turn = workload.next(owner=user, now=time.perf_counter(), default_model="tiny", stage="c8", stats=stats)
    ...                                              # send turn.request, get record
    think_s = workload.finish(turn, record, now=time.perf_counter(), stage="c8", stats=stats)
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loadgen import conversations
from loadgen.conversations import Conversation
from loadgen.dist import Dist
from loadgen.profile import Profile
from loadgen.prompts import PreparedRequest, PromptFactory
from loadgen.record import RequestRecord

TURN_FIGURES_MAX = 32
"""Per-turn figures are kept for turns 1 … 31 one by one and for turn 32 and later together (key ``32+``)."""


def expected_hit_tokens(shared: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens a perfect cache of whole ``block_size`` blocks hits: the shared ones, never the last prompt token."""
    if shared <= 0 or prompt_tokens <= 1:
        return 0
    return (min(shared, prompt_tokens - 1) // block_size) * block_size


def turn_key(turn: int) -> str:
    return str(turn) if turn < TURN_FIGURES_MAX else f"{TURN_FIGURES_MAX}+"


# --- the figures ---------------------------------------------------------------------------------------------


class TurnStats:
    """Successful requests of one turn number of conversations within one stage."""

    __slots__ = ("completed", "prompt_tokens", "ttft")

    def __init__(self, ttft: Dist) -> None:
        self.completed = 0
        self.prompt_tokens = 0
        self.ttft = ttft


class StageWorkload:
    __slots__ = (
        "requests",
        "prompt_tokens",
        "expected_hit_tokens",
        "conversations_started",
        "conversations_completed",
        "conversations_ended_early",
        "turns",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.prompt_tokens = 0
        self.expected_hit_tokens = 0
        self.conversations_started = 0
        self.conversations_completed = 0
        self.conversations_ended_early = 0
        self.turns: dict[str, TurnStats] = {}

    _COUNTS = (
        "requests",
        "prompt_tokens",
        "expected_hit_tokens",
        "conversations_started",
        "conversations_completed",
        "conversations_ended_early",
    )


class WorkloadStats:
    """Per-stage workload figures of one process; merged exactly across workers like the rest of the store."""

    def __init__(self, ttft_bounds: tuple[float, ...]) -> None:
        self.ttft_bounds = ttft_bounds
        self.stages: dict[str, StageWorkload] = {}

    def stage(self, name: str) -> StageWorkload:
        entry = self.stages.get(name)
        if entry is None:
            entry = self.stages[name] = StageWorkload()
        return entry

    def _turn(self, stage: StageWorkload, key: str) -> TurnStats:
        entry = stage.turns.get(key)
        if entry is None:
            entry = stage.turns[key] = TurnStats(Dist(self.ttft_bounds))
        return entry

    def record(self, stage: str, record: RequestRecord, *, shared: int, block_size: int, turn: int | None) -> None:
        if not record.ok:
            return
        entry = self.stage(stage)
        entry.requests += 1
        entry.prompt_tokens += record.prompt_tokens
        entry.expected_hit_tokens += expected_hit_tokens(shared, record.prompt_tokens, block_size)
        if turn is not None:
            stats = self._turn(entry, turn_key(turn))
            stats.completed += 1
            stats.prompt_tokens += record.prompt_tokens
            if record.ttft is not None:
                stats.ttft.record(record.ttft)

    @classmethod
    def single(cls, name: str, stage: StageWorkload, ttft_bounds: tuple[float, ...]) -> WorkloadStats:
        stats = cls(ttft_bounds)
        stats.stages[name] = stage
        return stats

    def merge(self, other: WorkloadStats) -> None:
        for name, theirs in other.stages.items():
            mine = self.stage(name)
            for attr in StageWorkload._COUNTS:
                setattr(mine, attr, getattr(mine, attr) + getattr(theirs, attr))
            for key, t in theirs.turns.items():
                m = self._turn(mine, key)
                m.completed += t.completed
                m.prompt_tokens += t.prompt_tokens
                m.ttft.merge(t.ttft)

    def to_wire(self) -> dict[str, Any]:
        return {
            name: {
                **{attr: getattr(s, attr) for attr in StageWorkload._COUNTS},
                "turns": {
                    k: {"completed": t.completed, "prompt_tokens": t.prompt_tokens, "ttft": t.ttft.to_wire()}
                    for k, t in s.turns.items()
                },
            }
            for name, s in self.stages.items()
        }

    @classmethod
    def from_wire(cls, ttft_bounds: tuple[float, ...], doc: Mapping[str, Any]) -> WorkloadStats:
        stats = cls(ttft_bounds)
        for name, sdoc in doc.items():
            entry = stats.stage(str(name))
            for attr in StageWorkload._COUNTS:
                setattr(entry, attr, int(sdoc.get(attr, 0)))
            for key, tdoc in sdoc.get("turns", {}).items():
                t = entry.turns[str(key)] = TurnStats(Dist.from_wire(ttft_bounds, tdoc["ttft"]))
                t.completed = int(tdoc["completed"])
                t.prompt_tokens = int(tdoc["prompt_tokens"])
        return stats


def _turn_order(key: str) -> int:
    return int(key.rstrip("+"))


def _ms(x: float) -> float | None:
    return None if not math.isfinite(x) else round(x * 1e3, 6)


def workload_block(stats: WorkloadStats, stages: Iterable[str], block_size: int) -> dict[str, Any]:
    """``workload`` of a stage (one name) or of ``overall`` (the measured stages)."""
    merged = WorkloadStats(stats.ttft_bounds)
    for name in stages:
        if name in stats.stages:
            merged.merge(WorkloadStats.single("all", stats.stages[name], stats.ttft_bounds))
    total = merged.stage("all")
    return {
        "cache_block_size": block_size,
        "prompt_tokens": total.prompt_tokens,
        "expected_prefix_cache_hit_tokens": total.expected_hit_tokens,
        "expected_prefix_cache_hit_ratio": round(total.expected_hit_tokens / total.prompt_tokens, 6)
        if total.prompt_tokens
        else None,
        "conversations_started": total.conversations_started,
        "conversations_completed": total.conversations_completed,
        "conversations_ended_early": total.conversations_ended_early,
        "turns": {
            key: {
                "completed": t.completed,
                "mean_prompt_tokens": round(t.prompt_tokens / t.completed, 3) if t.completed else None,
                "mean_ttft_ms": _ms(t.ttft.mean),
                "p50_ttft_ms": _ms(t.ttft.quantile(0.5)),
                "p99_ttft_ms": _ms(t.ttft.quantile(0.99)),
            }
            for key, t in sorted(total.turns.items(), key=lambda kv: _turn_order(kv[0]))
        },
    }


# --- what to send next ----------------------------------------------------------------------------------------


@dataclass(eq=False)
class Turn:
    """One request about to be sent, with what the workload needs when it finishes."""

    request: PreparedRequest
    conversation: Conversation | None
    owner: object | None
    shared: int
    """Tokens an earlier request's prompt already began with, by design (see the module docstring)."""


class Workload:
    """Which request a user (closed loop) or an arrival (open loop) sends next.

    Closed loop: a user keeps its conversation; its next request is the conversation's next turn, sent after
    the think time (returned by :meth:`finish`, which the executor makes the user wait). Open loop: an arrival
    takes the next turn of the conversation that has been ready longest (reply received and think time over),
    else it starts a new request from the traffic mix, so arrivals keep the stage's rate and think time is the
    least gap between turns. Either way a request without a conversation to continue picks its traffic entry
    by the mix's round robin, and a pick of a conversation entry starts a conversation: weights share out
    conversation starts (a one-request entry counts as a conversation of one turn).
    """

    def __init__(self, profile: Profile, prompts: PromptFactory, *, seed: int, process_index: int) -> None:
        self.profile = profile
        self.prompts = prompts
        self.seed = seed
        self.process_index = process_index
        self.block_size = profile.cache_block_size
        self._owned: weakref.WeakKeyDictionary[Any, Conversation] = weakref.WeakKeyDictionary()
        self._ready: list[tuple[float, int, Conversation]] = []
        self._tie = itertools.count()
        self._conversations = itertools.count()
        self._turns = itertools.count()
        self._seen: set[tuple[str, str, int]] = set()
        """(model, traffic entry, prefix group) this process has sent: a perfect cache holds that prefix."""

    @property
    def pending(self) -> int:
        """Open-loop conversations waiting for their next turn."""
        return len(self._ready)

    def next(self, *, owner: object | None, now: float, default_model: str, stage: str, stats: WorkloadStats) -> Turn:
        """The next request of ``owner`` (a closed-loop user), or of an open-loop arrival (``owner`` None)."""
        conv: Conversation | None = None
        if owner is not None:
            conv = self._owned.pop(owner, None)
        elif self._ready and self._ready[0][0] <= now:
            conv = heapq.heappop(self._ready)[2]
        if conv is not None:
            request = conversations.next_turn(conv, index=next(self._turns))
            shared = conv.last_prompt_tokens - (0 if request.traffic.endpoint == "chat" else 1)
            return Turn(request, conv, owner, shared)
        request = self.prompts.next(default_model)
        traffic = request.traffic
        shared = 0
        if request.prefix_group is not None and traffic.prefix is not None:
            key = (request.model, traffic.name, request.prefix_group)
            if key in self._seen:
                shared = traffic.prefix.group_tokens(request.prefix_group)
            else:
                self._seen.add(key)
        if traffic.conversation is None:
            return Turn(request, None, owner, shared)
        conv = conversations.start(
            request, index=next(self._conversations), seed=self.seed, process_index=self.process_index
        )
        stats.stage(stage).conversations_started += 1
        return Turn(request, conv, owner, shared)

    def finish(self, turn: Turn, record: RequestRecord, *, now: float, stage: str, stats: WorkloadStats) -> float:
        """Record the request's workload figures; returns the think time the user waits (closed loop), else 0."""
        conv = turn.conversation
        stats.record(
            stage, record, shared=turn.shared, block_size=self.block_size, turn=None if conv is None else conv.turn
        )
        if conv is None:
            think_time = turn.request.traffic.think_time_s
            if think_time is None or turn.owner is None:
                return 0.0  # open loop: arrivals keep the stage's rate
            rng = random.Random(f"think:{self.seed}:{self.process_index}:{turn.request.index}")
            return think_time.sample(rng.gauss)
        if not record.ok:
            # A failed turn ends its conversation: the next turn would lack this reply. A cancelled one went
            # with its user (the load generator stopped it) and ends nothing.
            if record.outcome != "cancelled":
                stats.stage(stage).conversations_ended_early += 1
            return 0.0
        conversations.add_reply(conv, record.content or "", record.prompt_tokens)
        if conv.done:
            stats.stage(stage).conversations_completed += 1
            return 0.0
        spec = conv.request.traffic.conversation
        assert spec is not None
        think = spec.think_time_s.sample(conv.rng.gauss)
        if turn.owner is not None:
            self._owned[turn.owner] = conv
            return think
        conv.ready_at = now + think
        heapq.heappush(self._ready, (conv.ready_at, next(self._tie), conv))
        return 0.0


# --- the end-of-run summary ------------------------------------------------------------------------------------


def _pct(x: Any) -> str:
    return f"{x * 100:.1f} %" if isinstance(x, int | float) else "-"


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per measured stage (and ``overall``) that had conversations or prefix-cache figures."""
    rows = [s for s in doc.get("stages") or [] if not s.get("warmup")]
    if doc.get("overall"):
        rows.append({**doc["overall"], "name": "overall"})
    lines: list[str] = []
    for row in rows:
        w = row.get("workload") or {}
        server = row.get("server") or {}
        parts: list[str] = []
        if w.get("conversations_started"):
            parts.append(
                f"{w['conversations_started']} conversations started, {w.get('conversations_completed', 0)}"
                f" completed, {w.get('conversations_ended_early', 0)} ended early"
            )
            turns = w.get("turns") or {}
            ttft = [f"{k}: {t['p50_ttft_ms']:.1f}" for k, t in turns.items() if t.get("p50_ttft_ms") is not None]
            if ttft:
                parts.append("TTFT p50 ms by turn " + ", ".join(ttft[:8]) + (" ..." if len(ttft) > 8 else ""))
        expected = w.get("expected_prefix_cache_hit_ratio")
        measured = server.get("prefix_cache_hit_ratio")
        if expected or measured is not None:
            parts.append(f"prefix cache hit rate: expected {_pct(expected)}, server {_pct(measured)}")
        if parts:
            lines.append(f"  {row.get('name')}: " + "; ".join(parts))
    return (["workload (conversations, prefix cache; tokens):", *lines]) if lines else []
