"""A deterministic approximate tokenizer and the sim's pseudo-word text generator.

Counting: text splits into word pieces the way byte-level BPE tokenizers roughly do - a letter run with its
leading space, digit groups of up to three (Llama-3 style), punctuation runs, whitespace runs - and every piece
longer than four characters costs one token per four characters. English prose comes out near 1.3 tokens per
word (about 4 characters per token), close to real BPE vocabularies. Token ids are a stable hash of the piece
(CRC-32, not Python's salted ``hash``), so equal prompts give equal ids in every process; prefix caching hashes
those ids.

Generation: a fixed vocabulary of two- and three-letter pseudo-words drawn from the engine seed. Each output
token is one pseudo-word (with a leading space after the first), so re-tokenizing generated text with
:func:`count_tokens` gives back exactly the engine's output token count.
"""

from __future__ import annotations

import functools
import random
import re
import zlib

PIECE_CHARS = 4
"""Characters per token for long pieces (BPE merges about four characters of English)."""
VOCAB_WORDS = 4096
WORD_BITS = 12
_PIECE = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\w\s]+|\s+|_+")
_CONSONANTS = "bdfghklmnprstvz"
_VOWELS = "aeiou"


@functools.lru_cache(maxsize=4096)
def encode(text: str, vocab: int = 32000) -> tuple[int, ...]:
    """Token ids of ``text`` (cached: load tests repeat prompts)."""
    ids: list[int] = []
    for match in _PIECE.finditer(text):
        piece = match.group()
        for start in range(0, len(piece), PIECE_CHARS):
            ids.append(zlib.crc32(piece[start : start + PIECE_CHARS].encode()) % vocab)
    return tuple(ids)


def count_tokens(text: str) -> int:
    """Approximate token count of ``text``."""
    n = 0
    for match in _PIECE.finditer(text):
        n += -(-len(match.group()) // PIECE_CHARS)
    return n


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from ``parts``, identical across processes (unlike ``hash``)."""
    digest = zlib.crc32(repr(parts).encode())
    return (digest << 32) | zlib.adler32(repr(parts).encode())


def make_words(seed: int, n: int = VOCAB_WORDS) -> list[str]:
    """``n`` distinct pseudo-words of 2-3 letters (consonant-vowel syllables), shuffled by ``seed``."""
    words = [c + v for c in _CONSONANTS for v in _VOWELS]
    words += [c + v + e for c in _CONSONANTS for v in _VOWELS for e in "lnrst"]
    rng = random.Random(seed)
    rng.shuffle(words)
    # 450 base words: repeat them (with equal frequency) to fill a power-of-two table for getrandbits.
    return [words[i % len(words)] for i in range(n)]
