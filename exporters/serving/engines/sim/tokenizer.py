"""A deterministic approximate tokenizer and the sim's pseudo-word text generator.

Counting: text splits into word pieces the way byte-level BPE tokenizers roughly do - a letter run with its
leading space, digit groups of up to three (Llama-3 style), punctuation runs, whitespace runs - and every piece
longer than four characters costs one token per four characters. English prose comes out near 1.3 tokens per
word (about 4 characters per token), close to real BPE vocabularies. Token ids are a stable hash of the piece
(CRC-32, not Python's salted ``hash``), so equal prompts give equal ids in every process; prefix caching hashes
those ids.

Memory: ``encode`` keeps recent results in a cache bounded by bytes (:data:`CACHE_BYTES`), keyed by a 128-bit
BLAKE2b digest of the text (not the text itself) and holding the ids as a compact ``array`` (2 bytes a token for
vocabularies up to 65,536), so unique long prompts cannot grow the process without bound. Text that cannot be
UTF-8 encoded (lone surrogates) is counted as its code points encoded with ``surrogatepass``; the serving layer
refuses such text with a 400 before it gets here.

Generation: a fixed vocabulary of two- and three-letter pseudo-words drawn from the engine seed. Each output
token is one pseudo-word (with a leading space after the first), so re-tokenizing generated text with
:func:`count_tokens` gives back exactly the engine's output token count.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import zlib
from array import array
from collections import OrderedDict

PIECE_CHARS = 4
"""Characters per token for long pieces (BPE merges about four characters of English)."""
VOCAB_WORDS = 4096
WORD_BITS = 12
PIECE_CLASSES = {"letter": r"[^\W\d_]", "digit": r"\d", "punct": r"[^\w\s]", "space": r"\s"}
"""The character classes of the pieces (Python ``re`` semantics). The Hugging Face ``tokenizer.json``
(:mod:`exporters.serving.engines.sim.hf_tokenizer`) spells out the same classes as explicit code point
ranges enumerated from these, so both split text identically."""
PIECE_TEMPLATE = " ?{letter}+| ?{digit}{{1,3}}| ?{punct}+|{space}+|_+"
"""The piece pattern over :data:`PIECE_CLASSES`: a letter run with its leading space, up to three digits, a
punctuation run, a whitespace run, an underscore run."""
PIECE_PATTERN = PIECE_TEMPLATE.format(**PIECE_CLASSES)
"""How text splits into pieces before each piece is cut into :data:`PIECE_CHARS`-character tokens."""
_PIECE = re.compile(PIECE_PATTERN)
_CONSONANTS = "bdfghklmnprstvz"
_VOWELS = "aeiou"

CACHE_BYTES = 32 * 1024 * 1024
"""Bytes of token ids the encode cache may hold (about 800 prompts of 21k tokens, 16M tokens in all)."""
_ENTRY_OVERHEAD = 200
"""Per cached prompt beyond its ids: the digest key, the array header and the dict slot (measured ~190)."""


class _EncodeCache:
    """LRU of ``digest(text, vocab) -> ids`` bounded by the bytes it holds, not by entry count."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _cost(ids: array[int]) -> int:
        return len(ids) * ids.itemsize + _ENTRY_OVERHEAD

    def get(self, key: bytes) -> array[int] | None:
        with self._lock:
            ids = self._entries.get(key)
            if ids is not None:
                self._entries.move_to_end(key)
            return ids

    def put(self, key: bytes, ids: array[int]) -> None:
        cost = self._cost(ids)
        if cost > self.max_bytes // 4:
            return  # one huge prompt must not flush everything else
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = ids
            self.bytes += cost
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= self._cost(old)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


_cache = _EncodeCache(CACHE_BYTES)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _encode(text: str, vocab: int) -> array[int]:
    ids = array("H" if vocab <= 1 << 16 else "I")
    append = ids.append
    crc32 = zlib.crc32
    for match in _PIECE.finditer(text):
        piece = match.group()
        for start in range(0, len(piece), PIECE_CHARS):
            append(crc32(_utf8(piece[start : start + PIECE_CHARS])) % vocab)
    return ids


def encode(text: str, vocab: int = 32000) -> tuple[int, ...]:
    """Token ids of ``text``; recent results are cached (load tests repeat prompts) within CACHE_BYTES."""
    key = hashlib.blake2b(_utf8(text), digest_size=16, person=vocab.to_bytes(8, "little")).digest()
    ids = _cache.get(key)
    if ids is None:
        ids = _encode(text, vocab)
        _cache.put(key, ids)
    return tuple(ids)


def cache_bytes() -> int:
    """Bytes the encode cache holds now (ids plus per-entry overhead)."""
    return _cache.bytes


def clear_cache() -> None:
    _cache.clear()


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
