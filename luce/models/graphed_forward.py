"""Graph replay of a model's forward (DESIGN.md section 4) on backends that capture graphs.

`GraphedForward(model)(batch, state)` is `model.forward(batch, state)`. For a batch of
decode rows and tree segments (no multi-row prompt chunk) it picks a graph key that fixes
every launch: the rows of each segment, each segment's slot (the state pools' rows a
graph reads and writes), the KV page count (padded to its bucket here when the caller did
not pad), the logits rows, the attention grid span (bucketed pages of the longest
segment), which segments are trees, the captured layers, and the model, state and kernel
choices. Per step, only token ids, positions, the KV CSR, KV destinations, logits rows and
tree parents change: they go to the graph's metadata arena (luce/ops/cuda_step_meta.py).

A key runs eagerly once (recording the constant uploads), is captured the next time and
replayed after that. Host side effects of the captured forward are repeated on replay:
the GDN layers' staged trees are re-staged with this step's parents. A forward that
cannot be captured (GraphUnsafe: a host fallback, an unexpected upload) keeps its key
eager. Graphs are dropped when the state object changes (`invalidate`), and the least
recently used beyond `max_graphs`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from luce.models.batch import ForwardBatch
from luce.models.graph_cache import GraphCache
from luce.models.kv_cache import PAGE_SIZE, bucket
from luce.models.tree_rows import local_tree_parents, segment_tree_parents, validate_batch

def pad_pages(batch: ForwardBatch) -> ForwardBatch:
    """The batch with a trailing padding segment (no rows, page 0) so its KV page count is a
    bucket; itself when it already is."""
    nnz = len(batch.kv_indices)
    extra = bucket(nnz) - nnz
    if extra == 0:
        return batch
    i32 = lambda a: np.asarray(a, dtype=np.int32)  # noqa: E731
    return dataclasses.replace(
        batch, qo_indptr=i32([*batch.qo_indptr, batch.n_rows]), seq_slots=i32([*batch.seq_slots, -1]),
        kv_indptr=i32([*batch.kv_indptr, nnz + extra]), kv_indices=i32([*batch.kv_indices, *([0] * extra)]),
        kv_last_page_len=i32([*batch.kv_last_page_len, PAGE_SIZE]))


class GraphedForward:
    """model.forward with graph replay; `counters` as luce.models.graph_cache.GraphCache's."""

    def __init__(self, model, enabled: bool = True, max_graphs: int = 64):
        self.model = model
        self.backend = model.backend
        self.enabled = bool(enabled) and bool(getattr(self.backend, "supports_graphs", False))
        self.cache = GraphCache(self.backend, max_graphs)
        self.counters = self.cache.counters
        self._state = None

    @property
    def graphs(self):
        return self.cache.graphs

    @property
    def unsafe(self):
        return self.cache.unsafe

    # ---- keys ---------------------------------------------------------------------------------
    def key(self, batch: ForwardBatch, state):
        """The graph key of `batch` (already page-padded), or None to run it eagerly."""
        from luce.ops.cuda_step_meta import max_kv_span

        rows = np.diff(batch.qo_indptr)
        live = batch.seq_slots >= 0
        if batch.tree_parents is not None:
            local = local_tree_parents(batch)
            tree = tuple(bool(live[s] and (local[batch.qo_indptr[s]:batch.qo_indptr[s + 1]] >= 0).any())
                         for s in range(batch.n_segments))
        else:
            tree = (False,) * batch.n_segments
        multi_row = getattr(self.model, "graphs_multi_row_segments", False)
        if not multi_row and any(live[s] and rows[s] > 1 and not tree[s] for s in range(batch.n_segments)):
            return None   # a prompt chunk: eager (compute-bound; its shapes rarely repeat)
        return (tuple(rows.tolist()), tuple(batch.seq_slots.tolist()), len(batch.kv_indices),
                len(batch.logits_indices), max_kv_span(batch), tree, tuple(batch.capture_layers),
                getattr(self.model, "gdn_tree_mode", None), getattr(self.backend, "tree_attention_kernel", None))

    # ---- the call -------------------------------------------------------------------------------
    def __call__(self, batch: ForwardBatch, state):
        if not self.enabled:
            return self.model.forward(batch, state)
        from luce.ops import cuda_step_meta

        if state is not self._state:
            self.invalidate()
            self._state = state
        batch = pad_pages(batch)
        recurrent = getattr(state, "recurrent", None)
        trees = self._tree_segments(batch) if recurrent is not None else []

        def captured(graph):
            graph.extra = {int(batch.seq_slots[s]): recurrent.staged(int(batch.seq_slots[s])) for s in trees}

        def replaying(graph):
            self._check(batch, state)
            for s in trees:
                slot = int(batch.seq_slots[s])
                recurrent.restage(slot, graph.extra[slot], segment_tree_parents(batch, s))

        return self.cache.call(self.key(batch, state), lambda: self.model.forward(batch, state),
                               lambda allocator: cuda_step_meta.bind(self.backend, batch, allocator),
                               lambda meta: cuda_step_meta.rewrite(self.backend, meta, batch), captured, replaying)

    @staticmethod
    def _tree_segments(batch) -> list[int]:
        if batch.tree_parents is None:
            return []
        return [s for s in range(batch.n_segments) if segment_tree_parents(batch, s) is not None]

    def _check(self, batch, state) -> None:
        """What the model's forward checks before it launches anything."""
        validate_batch(batch)
        for s in range(batch.n_segments):
            if batch.seq_slots[s] >= state.max_slots:
                raise IndexError(f"segment {s}: slot {batch.seq_slots[s]} >= max_slots {state.max_slots}")
        ids = batch.token_ids
        vocab = int(self.model.config.vocab)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise IndexError(f"token id out of range [0, {vocab}): {ids.min()}..{ids.max()}")

    def invalidate(self) -> None:
        """Drop every graph (the state, owner or topology they were captured over is gone)."""
        self.cache.invalidate()
