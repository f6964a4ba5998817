"""What every drafter returns for one slot: per-depth top-k tokens and log-probs.

Depth d (0-based) is the token d + 1 places after the root (the slot's newest token, whose
target pass has not run yet). Row d lists candidates best first; a drafter with fewer than
k candidates at a depth pads with token -1 and log-prob -inf, and a depth whose best entry
is -inf ends the proposal (n-gram lookup often proposes fewer depths than asked).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DraftProposal:
    ids: np.ndarray        # [D, K] int64 candidate tokens per depth, best first (-1 = none)
    logprobs: np.ndarray   # [D, K] f32 their draft log-probs (-inf = none), non-increasing

    def __post_init__(self):
        ids = np.asarray(self.ids, dtype=np.int64)
        lps = np.asarray(self.logprobs, dtype=np.float32)
        if ids.ndim != 2 or ids.shape != lps.shape:
            raise ValueError(f"DraftProposal: ids {ids.shape} and logprobs {lps.shape} must both be [D, K]")
        if np.isnan(lps).any() or (lps > 0).any():
            raise ValueError("DraftProposal: log-probs must be <= 0 and not NaN")
        present = np.isfinite(lps)
        if (ids[present] < 0).any() or (ids[~present] != -1).any():
            raise ValueError("DraftProposal: a candidate has a token >= 0 and a finite log-prob; "
                             "padding entries have token -1 and log-prob -inf")
        if ids.shape[1] > 1:
            if (present[:, 1:] & ~present[:, :-1]).any():
                raise ValueError("DraftProposal: padding entries must come after the candidates")
            finite_pairs = present[:, 1:] & present[:, :-1]
            if (finite_pairs & (lps[:, 1:] > lps[:, :-1])).any():
                raise ValueError("DraftProposal: candidates of a depth must be sorted best first")
        if ids.shape[1] > 1 and ids.shape[0]:   # padding gets distinct negative stand-ins, then sort each depth
            ranked = np.sort(np.where(present, ids, -2 - np.arange(ids.shape[1])), axis=1)
            twice = (ranked[:, 1:] == ranked[:, :-1]).any(axis=1)
            if twice.any():
                d = int(np.argmax(twice))
                raise ValueError(f"DraftProposal: depth {d} lists a token twice: {ids[d][present[d]].tolist()}")
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "logprobs", lps)

    @property
    def depth(self) -> int:
        """Depths with at least one candidate, counted from the first (a proposal ends at
        the first empty depth)."""
        empty = ~np.isfinite(self.logprobs[:, 0]) if self.ids.shape[1] else np.ones(len(self.ids), bool)
        return int(np.argmax(empty)) if empty.any() else int(self.ids.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.ids.shape[1])

    @classmethod
    def empty(cls) -> "DraftProposal":
        """No draft at all (the slot decodes as an AR row)."""
        return cls(np.zeros((0, 1), np.int64), np.zeros((0, 1), np.float32))

    @classmethod
    def from_chain(cls, tokens, logprobs=None) -> "DraftProposal":
        """A single candidate per depth (n-gram lookup, greedy draft chains); log-prob 0 when
        not given."""
        tokens = np.asarray(list(tokens), dtype=np.int64).reshape(-1, 1)
        lps = np.zeros(tokens.shape, np.float32) if logprobs is None else \
            np.asarray(list(logprobs), dtype=np.float32).reshape(-1, 1)
        return cls(tokens, lps)

    @classmethod
    def from_logprobs(cls, logprobs: np.ndarray, k: int) -> "DraftProposal":
        """Top-k of full log-prob rows [D, V] (ties to the lowest token id)."""
        logprobs = np.minimum(np.asarray(logprobs, dtype=np.float64), 0.0)
        k = min(k, logprobs.shape[1])
        ids = np.argsort(-logprobs, axis=1, kind="stable")[:, :k]
        return cls(ids, np.take_along_axis(logprobs, ids, axis=1).astype(np.float32))
