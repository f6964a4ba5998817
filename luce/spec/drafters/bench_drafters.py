"""Benchmark drafters that bound speculative decoding from above and below.

Both know the true greedy continuation of every request (from a plain greedy AR run of the
same target): `sequences` are the full token lists, prompt then continuation. A lane is
matched to the sequence its tokens are a prefix of.
- `OracleDrafter`: proposes the true continuation at every depth (best case: a verify of
  depth d commits d + 1 tokens), plus `top_k - 1` wrong siblings per depth so a DDTree
  has the same shape as with a real drafter; with `acceptance_length` a the truth is
  proposed only at the first a - 1 depths (wrong tokens after), so every verify deep enough
  commits exactly a tokens (the seed workload's set acceptance length).
- `AlwaysWrongDrafter`: proposes, at every depth, only tokens that differ from the true
  one (worst case: every verify commits exactly one token, at the cost of the whole tree).
With `inner` (a real drafter: DFlash or a draft model) the inner drafter runs on the same
lanes first, so a step pays the real draft cost, and its proposals are thrown away.
A lane that matches no sequence (the target left the greedy path: not an exact backend)
gets an empty proposal and is counted in `misses`. `depths` lists every proposal's depth.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np

from luce.spec.drafters.base import DraftLane
from luce.spec.proposal import DraftProposal

PREFIX = 8     # tokens that index the known sequences (a lane's tokens start with its prompt)


class _ContinuationDrafter(ABC):
    kind = "bench"

    def __init__(self, sequences: Sequence[Sequence[int]], vocab: int, inner=None,
                 acceptance_length: int | None = None):
        if vocab < 2:
            raise ValueError(f"a benchmark drafter needs a vocabulary of at least 2 tokens, got {vocab}")
        self.sequences = [np.asarray(list(s), dtype=np.int64) for s in sequences]
        self._lists = [seq.tolist() for seq in self.sequences]
        self._by_start: dict[tuple, list[int]] = {}    # first PREFIX tokens -> sequences starting so
        for i, seq in enumerate(self._lists):
            self._by_start.setdefault(tuple(seq[:PREFIX]), []).append(i)
        self.vocab, self.inner = int(vocab), inner
        if acceptance_length is not None and acceptance_length < 1:
            raise ValueError(f"acceptance_length must be >= 1, got {acceptance_length}")
        self.acceptance_length = acceptance_length
        self.feature_layers = tuple(getattr(inner, "feature_layers", ()))
        self.max_depth = getattr(inner, "max_depth", None)
        self.misses = 0
        self.depths: list[int] = []           # depth of every proposal made, in order

    def truth(self, tokens: Sequence[int]) -> np.ndarray | None:
        """The true tokens after `tokens` ([n] int64, possibly empty), or None if `tokens`
        is not a prefix of any known sequence. A lookup by the first PREFIX tokens, then one
        list comparison: a benchmark drafter must not cost what a real one does not."""
        toks = list(tokens)
        n = len(toks)
        starts = self._by_start.get(tuple(toks[:PREFIX])) if n >= PREFIX else range(len(self._lists))
        for i in starts or ():
            seq = self._lists[i]
            if len(seq) >= n and seq[:n] == toks:
                return self.sequences[i][n:]
        return None

    def propose(self, lanes: Sequence[DraftLane]) -> list[DraftProposal]:
        lanes = list(lanes)
        if self.inner is not None and lanes:
            self.inner.propose(lanes)            # the real draft work, for its cost only
        out = []
        for lane in lanes:
            truth = self.truth(lane.tokens)
            if truth is None:
                self.misses += 1
                out.append(DraftProposal.empty())
            else:
                out.append(self._proposal(truth, lane.depth, lane.top_k))
            self.depths.append(out[-1].depth)
        return out

    def release(self, slot: int) -> None:
        if self.inner is not None:
            self.inner.release(slot)

    def prefill(self, lanes) -> None:
        """Completed prompts to the inner drafter that keeps model state (a draft model), as
        the server's drafter gets them: its prompt catch-up is paid where the server pays it."""
        prefill = getattr(self.inner, "prefill", None)
        if prefill is not None:
            prefill(lanes)

    def check_context(self, segments) -> None:
        if self.inner is not None and hasattr(self.inner, "check_context"):
            self.inner.check_context(segments)

    def add_context(self, segments, features) -> None:
        """The inner drafter's (DFlash) committed features."""
        if self.inner is not None and hasattr(self.inner, "add_context"):
            self.inner.add_context(segments, features)

    def _others(self, tokens: np.ndarray, count: int) -> np.ndarray:
        """[n, min(count, vocab - 1)]: per token, that many distinct tokens, none equal to it."""
        return (tokens[:, None] + 1 + np.arange(min(count, self.vocab - 1))) % self.vocab

    @abstractmethod
    def _proposal(self, truth: np.ndarray, depth: int, top_k: int) -> DraftProposal:
        """The proposal for a lane whose true continuation is `truth` [n] int64."""


class OracleDrafter(_ContinuationDrafter):
    kind = "oracle"

    def _proposal(self, truth: np.ndarray, depth: int, top_k: int) -> DraftProposal:
        depth = min(depth, len(truth))
        ids = np.full((depth, top_k), -1, np.int64)
        lps = np.full((depth, top_k), -np.inf, np.float32)
        t = truth[:depth]
        k = min(top_k - 1, self.vocab - 1)
        ids[:, 0], ids[:, 1:1 + k] = t, self._others(t, k)      # the truth ranks first
        lps[:, :1 + k] = -np.arange(1 + k, dtype=np.float32)
        a = self.acceptance_length
        if a is not None and depth >= a:       # past the set acceptance length the truth is left out
            k = min(top_k, self.vocab - 1)
            ids[a - 1:], lps[a - 1:] = -1, -np.inf
            ids[a - 1:, :k] = self._others(t[a - 1:], k)
            lps[a - 1:, :k] = -np.arange(k, dtype=np.float32)
        return DraftProposal(ids, lps)


class AlwaysWrongDrafter(_ContinuationDrafter):
    kind = "always-wrong"

    def _proposal(self, truth: np.ndarray, depth: int, top_k: int) -> DraftProposal:
        if not len(truth):
            return DraftProposal.empty()
        ids = np.full((depth, top_k), -1, np.int64)
        lps = np.full((depth, top_k), -np.inf, np.float32)
        # beyond the known continuation any token will do: depth 0 is already wrong
        t = truth[np.minimum(np.arange(depth), len(truth) - 1)]
        k = min(top_k, self.vocab - 1)
        ids[:, :k] = self._others(t, k)
        lps[:, :k] = -1.0 - np.arange(k, dtype=np.float32)
        return DraftProposal(ids, lps)
