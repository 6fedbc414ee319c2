"""Sim tokenizer memory against unique long prompts (issue 13).

Run: ``python -m benchmarks.tokenizer_memory [--quick] [--prompts N] [--tokens T]``

Encodes N unique prompts of about T tokens each (English-like pseudo-words; each prompt starts with its own
number, so every one misses the cache) through ``encode`` exactly as the sim's admission does, keeps nothing,
and reports the growth of the process's resident set (``/proc/self/statm``) and of traced Python memory
(``tracemalloc``, current after the run) over the run, plus encode time per prompt (first pass, all misses;
second pass over the most recent prompts, hits where the cache holds them). Before the byte-bounded cache, the
``lru_cache(maxsize=4096)`` kept every prompt's text and a tuple of int objects: 600 prompts of 21k tokens
grew the RSS by about 600 MB.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
import tracemalloc
from collections.abc import Sequence

from exporters.serving.engines.sim import tokenizer

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _prompt(i: int, tokens: int) -> str:
    rng = random.Random(i)
    words = tokenizer.make_words(7)
    # Pseudo-words are one token each ("lo", " ka"): ``tokens`` words are ``tokens`` tokens.
    return f"{i}" + "".join(" " + words[rng.getrandbits(tokenizer.WORD_BITS)] for _ in range(tokens - 1))


def measure(prompts: int, tokens: int, trace: bool) -> dict[str, float]:
    texts = (_prompt(i, tokens) for i in range(prompts))
    gc.collect()
    if trace:
        tracemalloc.start()
    rss0 = _rss_bytes()
    count = 0
    spent = 0.0
    for text in texts:
        t0 = time.perf_counter()
        count += len(tokenizer.encode(text))
        spent += time.perf_counter() - t0
    miss_s = spent / prompts
    recent = [_prompt(i, tokens) for i in range(max(0, prompts - 20), prompts)]
    t1 = time.perf_counter()
    for text in recent:
        tokenizer.encode(text)
    again_s = (time.perf_counter() - t1) / len(recent)
    gc.collect()
    rss1 = _rss_bytes()
    traced = tracemalloc.get_traced_memory()[0] if trace else 0
    if trace:
        tracemalloc.stop()
    return {
        "tokens_per_prompt": count / prompts,
        "rss_growth_mb": (rss1 - rss0) / 1e6,
        "traced_mb": traced / 1e6,
        "encode_ms": miss_s * 1000,
        "encode_again_ms": again_s * 1000,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 prompts of 21k tokens")
    ap.add_argument("--prompts", type=int, default=600)
    ap.add_argument("--tokens", type=int, default=21_000)
    ap.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (slower)")
    args = ap.parse_args(argv)
    prompts = 100 if args.quick else args.prompts
    r = measure(prompts, args.tokens, args.tracemalloc)
    print(f"{prompts} unique prompts of {r['tokens_per_prompt']:.0f} tokens")
    print(f"  RSS growth       {r['rss_growth_mb']:8.1f} MB")
    if args.tracemalloc:
        print(f"  traced (current) {r['traced_mb']:8.1f} MB")
    print(f"  encode, miss     {r['encode_ms']:8.2f} ms/prompt")
    print(f"  encode, again    {r['encode_again_ms']:8.2f} ms/prompt (last 20 prompts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
