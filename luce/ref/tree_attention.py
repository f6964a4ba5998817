"""Paged GQA attention of tree rows (kernel: cuda/attention.cu, tree mode), DESIGN.md 3 and 7.

A tree segment of N rows belongs to a slot whose committed KV has `prefix_len` rows. The
tree rows' K/V are written to scratch KV rows right after the committed ones, in node
order: node j at KV index prefix_len + j (in the slot's own pages, beyond what is
committed). Node j attends to the committed rows 0..prefix_len-1 and then to the scratch
rows of its root path (root first, itself last): exactly the keys, in the same order, that
an AR row at the same position sees once the path is committed, so each row reduces
bitwise like that AR row (`luce.ref.attention.attend_row`, float64, one row at a time).
"""
from __future__ import annotations

import numpy as np

from luce.ref.attention import attend_row, gather_kv
from luce.ref.tree import check_parents


def tree_key_indices(prefix_len: int, parents: np.ndarray, node: int) -> np.ndarray:
    """KV indices [prefix_len + depth + 1] node `node` attends to, in order."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return np.concatenate([np.arange(prefix_len), prefix_len + np.asarray(path[::-1])]).astype(np.int64)


def paged_tree_attention(q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray, pages: np.ndarray,
                         prefix_len: int, parents, scale: float) -> np.ndarray:
    """q [N, Hq, D] f32 tree rows; k_pages, v_pages [n_pages, PAGE_SIZE, Hkv, D]; pages [P]
    the slot's pages, holding prefix_len + N rows (committed then scratch) -> [N, Hq, D] f32."""
    n = q.shape[0]
    parents = check_parents(parents, n)
    k, v = gather_kv(k_pages, v_pages, np.asarray(pages, dtype=np.int64), prefix_len + n)
    out = np.empty(q.shape, dtype=np.float32)
    for node in range(n):
        idx = tree_key_indices(prefix_len, parents, node)
        out[node] = attend_row(q[node], np.ascontiguousarray(k[idx]), np.ascontiguousarray(v[idx]),
                               scale).astype(np.float32)
    return out


def paged_attention_with_trees(q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray,
                               qo_indptr: np.ndarray, kv_indptr: np.ndarray, kv_indices: np.ndarray,
                               kv_last_page_len: np.ndarray, seq_slots: np.ndarray,
                               tree_parents: np.ndarray | None, scale: float, causal: bool = True) -> np.ndarray:
    """`luce.ref.attention.paged_attention` for batches that may carry tree segments
    (tree_parents [T]: global parent row, -1 for roots and ordinary rows; a segment with a
    parented row is a tree whose n rows are the last n of its kv_len KV rows)."""
    from luce.ref.attention import paged_attention

    tree_segments = []
    slots = np.array(seq_slots, copy=True)
    if tree_parents is not None:
        tp = np.asarray(tree_parents)
        for s in range(len(seq_slots)):
            r0, r1 = int(qo_indptr[s]), int(qo_indptr[s + 1])
            if seq_slots[s] >= 0 and (tp[r0:r1] >= 0).any():
                tree_segments.append(s)
                slots[s] = -1
    out = paged_attention(q, k_pages, v_pages, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                          slots, scale, causal)
    page_size = k_pages.shape[1]
    for s in tree_segments:
        r0, r1 = int(qo_indptr[s]), int(qo_indptr[s + 1])
        pages = np.asarray(kv_indices[kv_indptr[s]:kv_indptr[s + 1]], dtype=np.int64)
        kv_len = (len(pages) - 1) * page_size + int(kv_last_page_len[s])
        local = np.where(tp[r0:r1] >= 0, tp[r0:r1] - r0, -1)
        out[r0:r1] = paged_tree_attention(q[r0:r1], k_pages, v_pages, pages, kv_len - (r1 - r0), local, scale)
    return out
