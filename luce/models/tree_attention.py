"""Attention with tree rows on backends whose `attention` does not know trees yet.

A backend that implements tree rows in `attention` (ancestor mask, luce.models.tree_rows)
sets `supports_tree_rows = True`; then this is plain `layers.attend`. Otherwise ordinary
segments go through `backend.attention` (tree segments masked out as padding) and tree
rows through the reference (luce/ref/tree_attention.py) on host arrays.
"""
from __future__ import annotations

import numpy as np

from luce.models.layers import attend
from luce.models.tree_rows import has_tree_segments, ordinary_view, segment_tree_parents
from luce.ref.tree_attention import paged_tree_attention


def attend_with_trees(backend, q, k, v, kv, batch, scale: float):
    """Write k, v [T, Hkv, D] at the rows' KV locations, then attend q [T, Hq, D] -> [T, Hq*D]."""
    if not has_tree_segments(batch) or getattr(backend, "supports_tree_rows", False):
        return attend(backend, q, k, v, kv, batch, scale)
    backend.kv_write(kv, batch, k, v)
    T = q.shape[0]
    out = np.array(backend.to_numpy(backend.attention(q, kv, ordinary_view(batch), scale)), dtype=np.float32)
    qh = np.asarray(backend.to_numpy(q), dtype=np.float32)
    k_pages, v_pages = np.asarray(backend.to_numpy(kv.k)), np.asarray(backend.to_numpy(kv.v))
    for s in range(batch.n_segments):
        parents = segment_tree_parents(batch, s)
        if parents is None:
            continue
        r0, r1 = batch.segment_rows(s)
        out[r0:r1] = paged_tree_attention(qh[r0:r1], k_pages, v_pages, batch.segment_pages(s),
                                          batch.kv_len(s) - (r1 - r0), parents, scale)
    return backend.asarray(out).reshape(T, -1)
