"""Paged GQA attention reference (kernel: cuda/attention.cu).

Each row is computed on its own, in float64 (scores, softmax and the weighted sum of
values), and rounded to f32 once: q.k over D, then softmax over the row's keys 0..n-1 in
KV-index order, then the sum over those keys. Nothing depends on other rows, so the result
is batch-invariant by construction; the f32 kernels are checked against it with tolerances.
Prompt rows take their own kernel (cuda/attention_prefill.cu, TF32 tensor cores): the same
math with TF32 roundings, written down in luce/ref/attention_prefill.py; this reference bounds
its error with a looser tolerance (tests/kernels/tolerances.py, "attention_prompt_exact").

KV layout: k_pages, v_pages [n_pages, PAGE_SIZE, Hkv, D]; segment s's KV index j lives at
page kv_indices[kv_indptr[s] + j // PAGE_SIZE], offset j % PAGE_SIZE (luce/models/batch.py).
"""
from __future__ import annotations

import numpy as np

# The kernel's cut of a decode or tree row's keys (cuda/attention_common.cuh, chunk_keys): a
# row of n keys takes chunks of chunk_keys(n, cmin) keys at absolute (logical) key positions,
# each reduced on its own (max, sum of exponentials, weighted values) and then merged in
# order; the chunk length is a function of the row's own key count, never of the batch.
CHUNK_MIN = 32      # kChunkMin: the floor of cmin at D <= 128 (a power of two in [32, 256]; D = 256: 256); chunk_min(D): the default
ROW_CHUNKS = 16     # kRowChunks: a row takes at most this many chunks, or ceil(n / 256)
PARTITION = 256     # LUCE_ATTN_PARTITION: the longest chunk


def chunk_min(head_dim: int) -> int:
    """The cmin a launch at this head dim takes unless LUCE_ATTN_CHUNK_MIN sets it
    (cuda/attention_config.cuh chunk_default): 128 keys at D <= 64, 64 at D <= 128, else PARTITION."""
    return 128 if head_dim <= 64 else 64 if head_dim <= 128 else PARTITION


def chunk_keys(n: int, cmin: int = CHUNK_MIN) -> int:
    """Keys per chunk of a row of n keys: the smallest power of two >= cmin giving at most
    ROW_CHUNKS chunks, capped at PARTITION."""
    length = cmin
    while length < PARTITION and length * ROW_CHUNKS < n:
        length *= 2
    return length


def chunk_grid(max_kv: int, cmin: int = CHUNK_MIN) -> int:
    """The most chunks a row of at most max_kv keys takes (>= 1): the workspace holds this many
    partials a head for each decode or tree row (cmin = CHUNK_MIN: any cmin)."""
    n = max(max_kv, 0)
    return max(1, min(ROW_CHUNKS, -(-n // cmin)), -(-n // PARTITION))


def gather_kv(k_pages: np.ndarray, v_pages: np.ndarray, pages: np.ndarray, length: int):
    """First `length` KV rows stored in `pages [P]` -> (k, v) [length, Hkv, D] float64."""
    hkv, d = k_pages.shape[2:]
    k = k_pages[pages].reshape(-1, hkv, d)[:length].astype(np.float64)
    v = v_pages[pages].reshape(-1, hkv, d)[:length].astype(np.float64)
    return k, v


def attend_row(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """One row over its keys. q [Hq, D], k, v [n, Hkv, D] float64 -> [Hq, D] float64."""
    hq, d = q.shape
    n, hkv, _ = k.shape
    group = hq // hkv
    qg = q.astype(np.float64).reshape(hkv, group, d)             # [Hkv, G, D]
    scores = np.matmul(qg, k.transpose(1, 2, 0)) * scale          # [Hkv, G, n]
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v.transpose(1, 0, 2)).reshape(hq, d)      # [Hkv, G, D] -> [Hq, D]


def paged_attention(q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray,
                    qo_indptr: np.ndarray, kv_indptr: np.ndarray, kv_indices: np.ndarray,
                    kv_last_page_len: np.ndarray, seq_slots: np.ndarray, scale: float,
                    causal: bool = True) -> np.ndarray:
    """q [T, Hq, D] f32 -> o [T, Hq, D] f32 (zeros on padding segments, seq_slots == -1).

    Segment s (rows qo_indptr[s]:qo_indptr[s+1]) reads its kv_len(s) KV rows; with `causal`
    its j-th row (of n) sees KV indices 0..kv_len(s) - n + j, else all kv_len(s)."""
    T, hq, d = q.shape
    page_size, hkv = k_pages.shape[1], k_pages.shape[2]
    if hq % hkv:
        raise ValueError(f"attention: {hq} query heads are not a multiple of {hkv} KV heads")
    out = np.zeros((T, hq, d), dtype=np.float32)
    for s in range(len(seq_slots)):
        if seq_slots[s] < 0:
            continue
        r0, r1 = int(qo_indptr[s]), int(qo_indptr[s + 1])
        pages = kv_indices[kv_indptr[s]:kv_indptr[s + 1]].astype(np.int64)
        kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(kv_last_page_len[s])
        if r1 - r0 > kv_len:
            raise ValueError(f"attention: segment {s} has {r1 - r0} rows but {kv_len} KV rows")
        k, v = gather_kv(k_pages, v_pages, pages, kv_len)
        for j, row in enumerate(range(r0, r1)):
            n = kv_len - (r1 - r0) + j + 1 if causal else kv_len
            out[row] = attend_row(q[row], k[:n], v[:n], scale).astype(np.float32)
    return out
