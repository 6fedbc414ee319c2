"""Multi-turn conversations: each turn's request carries the conversation so far, then a new user turn.

A conversation starts from an ordinary first request of its traffic entry (``PromptFactory.next``: the shared
prefix as a system message, the first user turn). Every later turn repeats the previous turn's request with
the assistant's reply as it was actually streamed appended, then a new synthetic user turn, and a new
``max_tokens``:

- chat: ``messages`` + ``{"role": "assistant", "content": reply}`` + ``{"role": "user", "content": text}``;
- completions: ``prompt`` + reply + ``"\\n"`` + text (the transcript continues the text it completed).

Lengths and words of later turns come from a ``random.Random`` of the conversation (seed, process,
conversation number), so a conversation's user turns are the same in every run whatever the timing; the
replies are the server's. docs/loadgen.md, *Conversations*, says what the load generator does around this
(closed and open loop, think time, failures).

Usage::

    conv = start(first_request, index=0, seed=1, process_index=0)   # turns drawn from conversation.turns
    add_reply(conv, record.content or "", record.prompt_tokens)
    request = next_turn(conv, index=1)          # the conversation so far + a new user turn
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from loadgen.prompts import PreparedRequest, synthetic_text


@dataclass(eq=False)
class Conversation:
    """One conversation in progress; ``turn`` is the 1-based turn of the request sent last."""

    index: int
    request: PreparedRequest
    """The last request sent (its body is the conversation up to that turn)."""
    body: dict[str, Any]
    turns: int
    rng: random.Random
    turn: int = 1
    last_prompt_tokens: int = 0
    """The server's ``usage.prompt_tokens`` of the last turn: the context a perfect prefix cache holds."""
    reply: str = ""
    ready_at: float = 0.0
    """Open loop: ``time.perf_counter()`` after which its next turn may be sent (reply + think time)."""
    history: list[int] = field(default_factory=list)
    """Prompt tokens of every finished turn, in order (what the tests and per-turn figures look at)."""

    @property
    def done(self) -> bool:
        return self.turn >= self.turns


def start(first: PreparedRequest, *, index: int, seed: int, process_index: int) -> Conversation:
    """A conversation whose first turn is ``first`` (already built by the prompt factory); its number of turns
    is drawn from the entry's ``conversation.turns``."""
    spec = first.traffic.conversation
    assert spec is not None
    rng = random.Random(f"conversation:{seed}:{process_index}:{index}")
    turns = max(1, spec.turns.sample(rng.gauss))
    return Conversation(index=index, request=first, body=json.loads(first.body), turns=turns, rng=rng)


def add_reply(conv: Conversation, reply: str, prompt_tokens: int) -> None:
    """The last turn succeeded with ``reply`` (the streamed text) and the server counted ``prompt_tokens``."""
    conv.reply = reply
    conv.last_prompt_tokens = prompt_tokens
    conv.history.append(prompt_tokens)


def next_turn(conv: Conversation, *, index: int) -> PreparedRequest:
    """The next turn's request: the conversation so far, the reply, a new user turn, a new ``max_tokens``."""
    traffic = conv.request.traffic
    rng = conv.rng
    text = synthetic_text(rng, traffic.prompt.tokens.sample(rng.gauss))
    assert traffic.output_tokens is not None  # conversations need synthetic prompts (validated)
    max_tokens = traffic.output_tokens.sample(rng.gauss)
    body = dict(conv.body)
    if traffic.endpoint == "chat":
        body["messages"] = [
            *body["messages"],
            {"role": "assistant", "content": conv.reply},
            {"role": "user", "content": text},
        ]
    else:
        body["prompt"] = f"{body['prompt']}{conv.reply}\n{text}"
    body["max_tokens"] = max_tokens
    conv.body = body
    conv.turn += 1
    conv.reply = ""
    conv.request = PreparedRequest(
        traffic=traffic,
        path=conv.request.path,
        body=json.dumps(body, separators=(",", ":")).encode(),
        model=conv.request.model,
        max_tokens=max_tokens,
        index=index,
        prefix_group=conv.request.prefix_group,
    )
    return conv.request
