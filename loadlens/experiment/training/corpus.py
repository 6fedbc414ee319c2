"""The training corpus: sequences from a fixed first-order Markov chain over the model's vocabulary, generated
on the fly (nothing packaged or downloaded). Every token has ``branches`` successors drawn once from the
corpus seed, taken with the probabilities ``probs``; so the best achievable cross-entropy of every predicted
token is exactly the entropy of ``probs`` (0.5623 nats for 0.75/0.25), whatever the token, and a model that
learns the chain's table sees its validation loss fall from about ln(vocab) towards that floor.

Usage::

    chain = MarkovChain.make(vocab=64, seed=0)
    ids = chain.sample(8, 32, torch.Generator().manual_seed(1))   # (8, 32) token ids
    chain.entropy_nats                                              # the loss floor
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PROBS = (0.75, 0.25)


@dataclass(frozen=True)
class MarkovChain:
    successors: torch.Tensor
    """(vocab, branches) token ids: row t holds the tokens that may follow t."""
    probs: tuple[float, ...]

    @classmethod
    def make(cls, vocab: int, seed: int, probs: tuple[float, ...] = PROBS) -> MarkovChain:
        if vocab < len(probs) or abs(sum(probs) - 1.0) > 1e-9:
            raise ValueError(f"a chain needs vocab >= {len(probs)} and probabilities summing to 1")
        g = torch.Generator().manual_seed(seed)
        rows = [torch.randperm(vocab, generator=g)[: len(probs)] for _ in range(vocab)]
        return cls(torch.stack(rows), tuple(probs))

    @property
    def vocab(self) -> int:
        return int(self.successors.shape[0])

    @property
    def entropy_nats(self) -> float:
        """The cross-entropy floor of every predicted token: H(probs)."""
        return -sum(p * math.log(p) for p in self.probs if p > 0)

    def sample(self, n: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` sequences of ``seq_len`` tokens: a uniform first token, then the chain."""
        cumulative = torch.tensor(self.probs).cumsum(0)
        out = torch.empty((n, seq_len), dtype=torch.long)
        out[:, 0] = torch.randint(0, self.vocab, (n,), generator=generator)
        for t in range(1, seq_len):
            branch = torch.searchsorted(cumulative, torch.rand(n, generator=generator), right=True)
            branch = branch.clamp(max=len(self.probs) - 1)
            out[:, t] = self.successors[out[:, t - 1], branch]
        return out
