"""N-gram / prompt-lookup drafter: no model, proposals from earlier text of the sequence.

The longest suffix of the sequence (max_ngram tokens down to min_ngram) that occurred
before is looked up; the tokens that followed each earlier occurrence are the candidates,
depth by depth. A candidate's log-prob is the log of its share among the occurrences that
reach that depth; ties go to the most recent occurrence. Nothing is kept per slot.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.spec.drafters.base import DraftLane
from luce.spec.proposal import DraftProposal


class NgramDrafter:
    kind = "ngram"
    feature_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_depth: int | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram, self.max_depth = max_ngram, min_ngram, max_depth

    def propose(self, lanes: Sequence[DraftLane]) -> list[DraftProposal]:
        return [self.propose_one(lane.tokens, lane.depth if self.max_depth is None
                                 else min(lane.depth, self.max_depth), lane.top_k) for lane in lanes]

    def release(self, slot: int) -> None:
        pass

    def match_starts(self, tokens: np.ndarray) -> tuple[int, np.ndarray]:
        """(n, ends): the longest n whose final n-gram occurred before, and the index right
        after each earlier occurrence (most recent first); (0, []) when none did."""
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:length - 1], n)  # starts 0..len-1-n
            hits = np.nonzero((windows == tokens[length - n:]).all(axis=1))[0]
            if len(hits):
                return n, (hits + n)[::-1]
        return 0, np.zeros(0, dtype=np.int64)

    def propose_one(self, tokens: Sequence[int], depth: int, top_k: int) -> DraftProposal:
        toks = np.asarray(list(tokens), dtype=np.int64)
        _, ends = self.match_starts(toks)
        ids = np.full((depth, top_k), -1, dtype=np.int64)
        lps = np.full((depth, top_k), -np.inf, dtype=np.float32)
        for d in range(depth):
            follow = ends + d
            follow = follow[follow < len(toks)]
            if not len(follow):
                break
            cands = toks[follow]                      # most recent occurrence first
            uniq, first, counts = np.unique(cands, return_index=True, return_counts=True)
            order = np.lexsort((first, -counts))[:top_k]
            ids[d, :len(order)] = uniq[order]
            lps[d, :len(order)] = np.log(counts[order] / len(cands))
        return DraftProposal(ids, np.minimum(lps, 0.0))
