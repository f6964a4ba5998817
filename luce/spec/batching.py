"""Pack ordinary segments and draft trees into one ForwardBatch (tree rows as defined in
luce.models.tree_rows): a tree of N nodes over a slot with `start` committed tokens takes
N rows at positions start + depth, scratch KV rows start..start+N-1 in the slot's own
pages, and every row reaches the LM head.

For models without recurrent layers a chain is an ordinary causal segment (its ancestor
mask is the causal mask and its positions are consecutive), so `chains_as_segments`
packs chains without tree parents; such models then need no tree support at all for
chain speculation.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from luce.models.batch import ForwardBatch, SegmentSpec, build_batch
from luce.models.kv_cache import pages_needed
from luce.spec.tree import DraftTree


@dataclass(frozen=True)
class TreeSegment:
    slot: int
    tree: DraftTree
    start: int                 # the slot's committed length = the root's position
    pages: Sequence[int]       # the slot's pages, enough for start + tree.n_nodes rows

    @property
    def is_chain(self) -> bool:
        return self.tree.max_depth == self.tree.n_nodes - 1


def pages_for_tree(start: int, tree: DraftTree) -> int:
    """Pages a slot needs to verify `tree` (its scratch rows included)."""
    return pages_needed(start + tree.n_nodes)


def build_spec_batch(items: Sequence[Union[SegmentSpec, TreeSegment]], capture_layers=(),
                     chains_as_segments: bool = False) -> tuple[ForwardBatch, list[int]]:
    """-> (batch, first logits row of each item, -1 for items without logits). A tree's
    logits rows follow its nodes in order."""
    specs = [SegmentSpec(it.slot, [int(t) for t in it.tree.tokens], it.start, it.pages, logits="all")
             if isinstance(it, TreeSegment) else it for it in items]
    batch = build_batch(specs, capture_layers)
    parents = np.full(batch.n_rows, -1, dtype=np.int32)
    positions = np.array(batch.positions, copy=True)
    first_logits, n_logits = [], 0
    for s, it in enumerate(items):
        r0, r1 = batch.segment_rows(s)
        n_rows_logits = int(np.count_nonzero((batch.logits_indices >= r0) & (batch.logits_indices < r1)))
        first_logits.append(n_logits if n_rows_logits else -1)
        n_logits += n_rows_logits
        if not isinstance(it, TreeSegment) or (chains_as_segments and it.is_chain):
            continue
        positions[r0:r1] = it.start + it.tree.depths
        tp = it.tree.parents.astype(np.int64)
        parents[r0:r1] = np.where(tp >= 0, tp + r0, -1)
    has_tree = bool((parents >= 0).any())
    batch = dataclasses.replace(batch, positions=positions, tree_parents=parents if has_tree else None)
    return batch, first_logits
