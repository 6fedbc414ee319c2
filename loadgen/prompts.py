"""Request bodies: the weighted traffic mix, synthetic or ShareGPT prompts, images, shared prefixes.

Deterministic under a seed: the k-th request a load-generator process builds is the same in every run with
the same profile, seed and process index (worker index in distributed mode). The traffic entry is chosen by
smooth weighted round robin, so a 15 % share is exactly 15 of every 100 requests, interleaved, not 15 % on
average; lengths and words come from a ``random.Random`` seeded with (seed, process, k).

Synthetic text is made of two- and three-letter English words, each one token (with its leading space) in
common BPE vocabularies and in the simulator's tokenizer, so ``tokens: {mean: 256}`` gives prompts of about
256 tokens plus the chat template. The server's ``usage.prompt_tokens`` is what the results report.

Usage::

    factory = PromptFactory(profile, seed=42, process_index=0)
    req = factory.next(default_model="tiny")
    req.path, req.body                    # '/v1/chat/completions', b'{"model": "tiny", ...}'
"""

from __future__ import annotations

import base64
import functools
import json
import math
import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.profile import Profile, Traffic
from loadgen.synthesis import ExactText, TraceText
from loadgen.traces import TraceRow
from loadgen.words import WORDS

IMAGE_VARIANTS = 8
"""Distinct synthetic images per resolution (cached; each request picks one)."""

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    traffic: Traffic
    path: str
    body: bytes
    model: str
    max_tokens: int
    index: int
    prefix_group: int | None = None
    """Which of the entry's shared prefixes the request starts with (None: none)."""


class SmoothWeightedRoundRobin:
    """nginx's smooth weighted round robin: exact shares over every cycle, evenly interleaved."""

    def __init__(self, weights: list[float]) -> None:
        if not weights or any(w <= 0 for w in weights):
            raise ValueError("weights must be positive")
        self.weights = weights
        self.total = sum(weights)
        self.current = [0.0] * len(weights)

    def next(self) -> int:
        best = 0
        for i, w in enumerate(self.weights):
            self.current[i] += w
            if self.current[i] > self.current[best]:
                best = i
        self.current[best] -= self.total
        return best


def share_weights(shares: tuple[float, ...]) -> list[float]:
    """Integer round-robin weights for prefix-group shares, plus one for the rest (no prefix) when they sum
    below 1: integers so that every cycle is exact (float weights drift). Shares are kept to 1e-6."""
    scaled = [round(s * 1_000_000) for s in shares]
    rest = 1_000_000 - sum(scaled)
    if rest > 0:
        scaled.append(rest)
    divisor = math.gcd(*scaled)
    return [float(w // divisor) for w in scaled]  # whole numbers: exact in float arithmetic


def synthetic_text(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choices(WORDS, k=max(1, tokens)))


@functools.lru_cache(maxsize=64)
def png_data_url(width: int, height: int, variant: int = 0) -> str:
    """A ``data:image/png;base64,...`` URL of a noisy ``width`` × ``height`` RGB image.

    Rows repeat with a period of 8 so the PNG stays small (about 8 rows of noise) while every variant differs.
    """
    rng = random.Random(f"png:{width}:{height}:{variant}")
    row_bytes = width * 3
    rows = [b"\x00" + rng.randbytes(row_bytes) for _ in range(8)]
    raw = b"".join(rows[y % 8] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@functools.lru_cache(maxsize=16)
def load_sharegpt(path: Path) -> tuple[tuple[str, int], ...]:
    """(first human turn, estimated tokens of the reply) for every usable conversation in a ShareGPT file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read ShareGPT file {path}: {err}") from err
    if not isinstance(doc, list):
        raise ValueError(f"ShareGPT file {path}: top level must be a list of conversations")
    out: list[tuple[str, int]] = []
    for item in doc:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            continue
        prompt = reply = None
        for turn in turns:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                continue
            who = turn.get("from")
            if prompt is None and who in ("human", "user"):
                prompt = turn["value"]
            elif prompt is not None and who in ("gpt", "assistant", "chatgpt"):
                reply = turn["value"]
                break
        if prompt and reply is not None:
            out.append((prompt, max(1, min(4096, round(len(reply) / 4)))))
    if not out:
        raise ValueError(f"ShareGPT file {path}: no conversation with a human turn followed by a reply")
    return tuple(out)


class PromptFactory:
    def __init__(self, profile: Profile, *, seed: int, process_index: int = 0) -> None:
        self.profile = profile
        self.seed = seed
        self.process_index = process_index
        self._wrr = SmoothWeightedRoundRobin([t.weight for t in profile.traffic])
        self._k = 0
        self._prefixes: dict[str, list[str]] = {}
        self._datasets: dict[str, list[tuple[str, int]]] = {}
        self._dataset_pos: dict[str, int] = {}
        self._group_wrr: dict[str, SmoothWeightedRoundRobin] = {}
        self._adapter_wrr: dict[str, SmoothWeightedRoundRobin] = {}
        # With a tokenizer, synthetic and trace prompts are counted and fitted exactly (loadgen/synthesis.py).
        self.exact = None if profile.tokenizer is None else ExactText(profile.tokenizer, WORDS)
        self.trace_text = TraceText(self.exact or ExactText(None, WORDS), seed)
        for t in profile.traffic:
            if t.prefix is not None:
                self._prefixes[t.name] = [
                    synthetic_text(random.Random(f"prefix:{seed}:{t.name}:{i}"), t.prefix.group_tokens(i))
                    for i in range(t.prefix.count)
                ]
                if t.prefix.shares:
                    self._group_wrr[t.name] = SmoothWeightedRoundRobin(share_weights(t.prefix.shares))
            if t.adapters:
                self._adapter_wrr[t.name] = SmoothWeightedRoundRobin([w for _, w in t.adapters])
            if t.prompt.source == "sharegpt" and t.prompt.path is not None:
                items = list(load_sharegpt(t.prompt.path))
                random.Random(f"sharegpt:{seed}:{t.name}").shuffle(items)
                self._datasets[t.name] = items
                # Processes start at different offsets so workers do not send the same conversations.
                self._dataset_pos[t.name] = (process_index * 7919) % len(items)

    def next(self, default_model: str, row: TraceRow | None = None) -> PreparedRequest:
        """The next request; a trace ``row`` gives its prompt (``input_tokens`` as served) and ``max_tokens``."""
        k = self._k
        self._k += 1
        traffic = self.profile.traffic[self._wrr.next()]
        rng = random.Random(f"req:{self.seed}:{self.process_index}:{k}")
        model = traffic.model or default_model
        adapters = self._adapter_wrr.get(traffic.name)
        if adapters is not None:
            model = traffic.adapters[adapters.next()][0] or model
        if row is not None:
            text, reply_tokens = self.trace_text.text(row, traffic.endpoint), row.output_tokens
        elif traffic.prompt.source == "sharegpt":
            items = self._datasets[traffic.name]
            pos = self._dataset_pos[traffic.name]
            self._dataset_pos[traffic.name] = pos + 1
            text, reply_tokens = items[pos % len(items)]
        else:
            n = traffic.prompt.tokens.sample(rng.gauss)
            text = synthetic_text(rng, n) if self.exact is None else self.exact.content(rng, n)
            reply_tokens = 0
        if traffic.output_from_dataset or row is not None:
            max_tokens = reply_tokens
        else:
            assert traffic.output_tokens is not None
            max_tokens = traffic.output_tokens.sample(rng.gauss)
        prefixes = self._prefixes.get(traffic.name)
        group: int | None = None
        groups = self._group_wrr.get(traffic.name)
        if groups is not None:
            pick = groups.next()
            group = pick if prefixes is not None and pick < len(prefixes) else None  # the last pick: no prefix
        elif prefixes:
            group = rng.randrange(len(prefixes))
        prefix = prefixes[group] if prefixes and group is not None else None
        body: dict[str, Any] = {"model": model}
        if traffic.endpoint == "chat":
            messages: list[dict[str, Any]] = []
            if prefix is not None:
                messages.append({"role": "system", "content": prefix})
            if traffic.images.count:
                parts: list[dict[str, Any]] = [
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": png_data_url(
                                traffic.images.width, traffic.images.height, rng.randrange(IMAGE_VARIANTS)
                            )
                        },
                    }
                    for _ in range(traffic.images.count)
                ]
                parts.append({"type": "text", "text": text})
                messages.append({"role": "user", "content": parts})
            else:
                messages.append({"role": "user", "content": text})
            body["messages"] = messages
        else:
            body["prompt"] = text if prefix is None else f"{prefix}\n{text}"
        body["max_tokens"] = max_tokens
        body["temperature"] = traffic.temperature
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if traffic.ignore_eos:
            body["ignore_eos"] = True
        if traffic.priority is not None:
            body["priority"] = traffic.priority
        return PreparedRequest(
            traffic=traffic,
            path=PATHS[traffic.endpoint],
            body=json.dumps(body, separators=(",", ":")).encode(),
            model=model,
            max_tokens=max_tokens,
            index=k,
            prefix_group=group,
        )
