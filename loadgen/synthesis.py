"""Prompt texts of an exact token count: synthetic content, and trace rows with the trace's prefix sharing.

Without a tokenizer (the default) a text of n tokens is n words, each one token in the sim's tokenizer and in
common BPE vocabularies (``loadgen/words.py`` ``WORDS``). With one (``loadgen/tokenizer.py``) the words that
are one token under it are kept and every text is counted whole and corrected.

Usage::

    exact = ExactText(tokenizer, WORDS)                  # tokenizer None: the word scheme
    exact.content(rng, 300)                              # 300 tokens of plain text
    rows = TraceText(exact, seed=0)
    rows.text(row, "chat")                               # the row's prompt, input_length tokens as served
    rows.shared("tiny", row)                             # tokens of it an earlier row began with (hash_ids)

**Exactness** (docs/loadgen.md, *Prompts and tokenizers*). Words that are one token on their own and after a
space are kept from the candidates, so n of them joined by spaces are n tokens wherever the tokenizer splits
at spaces before merging (byte-level BPE as in GPT-2, Llama 3 and Qwen; SentencePiece with a Metaspace
pre-tokenizer; the sim's WordLevel). Every text is then counted whole and corrected by adding or removing
words at its end, at most :data:`FIT_ROUNDS` times, so a tokenizer that merges across words ends within those
corrections of the target (the closest text found is sent); the tests hold the sim's tokenizer to 0 tokens.

**Trace rows.** A Mooncake row's prompt is its blocks in order: block ``h`` is ``block_tokens`` words drawn
from a generator seeded by (seed, h), the last block cut to what the row's length leaves. Two rows whose
``hash_ids`` begin alike therefore begin with exactly the same text and tokens, for as many blocks as their ids
agree, so a prefix cache sees the sharing the trace recorded. A row without hash ids gets words of its own
(seeded by seed, stage and row). Under a tokenizer the template and special tokens are part of the row's
length: the content is shortened by them (from the last block), so the shared prefix is the template's opening
plus k whole blocks.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence

from loadgen.tokenizer import Endpoint, Tokenizer, TokenizerError
from loadgen.traces import TraceRow

FIT_ROUNDS = 4
"""Corrections of a text's length after counting it whole."""
MIN_WORDS = 16
"""Fewer one-token candidate words than this: the tokenizer is refused (prompts would repeat a handful)."""
BLOCK_CACHE = 4096
"""Block texts kept per process (4096 blocks of 512 words: about 2M word references)."""


class ExactText:
    """Texts of an exact token count: under ``tokenizer``, or the word scheme (a word a token) without one."""

    def __init__(self, tokenizer: Tokenizer | None, candidates: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        if tokenizer is None:
            self.words: tuple[str, ...] = tuple(candidates)
        else:
            self.words = tokenizer.one_token_words(candidates)
            if len(self.words) < MIN_WORDS:
                raise TokenizerError(
                    f"{tokenizer.file}: only {len(self.words)} of the {len(candidates)} prompt words are one token "
                    f"each (at least {MIN_WORDS} needed)"
                )

    def draw(self, rng: random.Random, n: int) -> list[str]:
        return rng.choices(self.words, k=max(0, n))

    def content(self, rng: random.Random, n: int) -> str:
        """Plain text of ``n`` tokens (at least 1), counted without special tokens."""
        n = max(1, n)
        words = self.draw(rng, n)
        if self.tokenizer is None:
            return " ".join(words)
        return self._fit(words, n, self.tokenizer.count, rng)

    def content_tokens(self, n: int, endpoint: Endpoint) -> int:
        """Content tokens a request of ``n`` prompt tokens leaves after the template and special tokens."""
        if self.tokenizer is None:
            return max(1, n)
        return max(1, n - self.tokenizer.overhead(endpoint))

    def prompt(self, words: list[str], n: int, endpoint: Endpoint, rng: random.Random) -> str:
        """A request's whole text from ``words`` (one per token, in order), fitted so the server counts ``n``
        prompt tokens, template and special tokens included, under the tokenizer. Without a tokenizer the text
        is the first ``n`` words and the server adds its chat template on top."""
        target = self.content_tokens(n, endpoint)
        if self.tokenizer is None:
            return " ".join(words[:target])
        tok = self.tokenizer
        return self._fit(words[:target], max(1, n), lambda text: tok.total(text, endpoint), rng)

    def _fit(self, words: list[str], n: int, count: Callable[[str], int], rng: random.Random) -> str:
        """Add or remove words at the end until ``count`` gives ``n`` (the closest after FIT_ROUNDS)."""
        words = list(words) or self.draw(rng, 1)
        text = " ".join(words)
        got = count(text)
        best = (abs(got - n), text)
        for _ in range(FIT_ROUNDS):
            if got == n:
                return text
            # Words to add or drop at the rate the text has shown so far (1 token a word when additive).
            step = max(1, round(abs(n - got) * len(words) / max(1, got)))
            if got < n:
                words.extend(self.draw(rng, step))
            else:
                del words[max(1, len(words) - step) :]
            text = " ".join(words)
            got = count(text)
            best = min(best, (abs(got - n), text))
        return text if got == n else best[1]


class TraceText:
    """Trace rows' prompts (block hashes become shared text) and the prefix sharing a process has sent."""

    def __init__(self, exact: ExactText, seed: int) -> None:
        self.exact = exact
        self.seed = seed
        self._blocks: OrderedDict[tuple[int, int], list[str]] = OrderedDict()
        self._seen: dict[str, _Node] = {}  # model -> trie of the hash ids sent

    def block(self, hash_id: int, size: int) -> list[str]:
        key = (hash_id, size)
        words = self._blocks.get(key)
        if words is None:
            words = self._blocks[key] = self.exact.draw(random.Random(f"block:{self.seed}:{hash_id}"), size)
            if len(self._blocks) > BLOCK_CACHE:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return words

    def words(self, row: TraceRow, n: int) -> list[str]:
        """The first ``n`` words of the row's content."""
        if not row.hash_ids:
            return self.exact.draw(random.Random(f"trace-row:{self.seed}:{row.stage}:{row.index}"), n)
        out: list[str] = []
        for h in row.hash_ids:
            if len(out) >= n:
                break
            out.extend(self.block(h, row.block_tokens))
        return out[:n]

    def text(self, row: TraceRow, endpoint: Endpoint) -> str:
        """The row's prompt: ``row.input_tokens`` tokens as the server counts them (see the module docstring)."""
        words = self.words(row, self.exact.content_tokens(row.input_tokens, endpoint))
        rng = random.Random(f"trace-fit:{self.seed}:{row.stage}:{row.index}")
        return self.exact.prompt(words, row.input_tokens, endpoint, rng)

    def shared(self, model: str, row: TraceRow) -> int:
        """Content tokens of ``row`` that an earlier row this process sent to ``model`` began with, then remember
        the row's blocks. Equal leading hash ids share their blocks' text; a block an earlier row sent only in
        part (its last, partial block) shares that part, and the sharing stops there. 0 without hash ids."""
        if not row.hash_ids:
            return 0
        node = self._seen.setdefault(model, _Node())
        shared, matching, left = 0, True, row.input_tokens
        for h in row.hash_ids:
            here = min(row.block_tokens, left)  # this row's tokens in the block
            left -= here
            child = node.children.get(h)
            if child is None:
                child = node.children[h] = _Node()
            if matching:
                shared += min(child.sent, here)
                matching = child.sent >= row.block_tokens  # a whole block sent before: the next may match
            child.sent = max(child.sent, here)
            node = child
        return shared


class _Node:
    """A block of a trie of hash ids: how many of its tokens have been sent, and the blocks that followed it."""

    __slots__ = ("children", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.children: dict[int, _Node] = {}
