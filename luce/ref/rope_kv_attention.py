"""Reference of the attention input fused into a decode launch (cuda/attention_rope_input.cuh,
luce_rope_kv_attention): exactly the composition of luce/ref/rope_kv.py (q/k norm, rotary,
the KV write of k' and v) and luce/ref/attention.py (paged attention over the pages with the
step's keys written). The kernel gives the unfused kernels' bits (rope_kv, then attention)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.ref.attention import paged_attention
from luce.ref.rope_kv import rope_kv_write


def rope_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, kv_dst: np.ndarray,
                      k_pages: np.ndarray, v_pages: np.ndarray, csr: Sequence[np.ndarray], scale: float,
                      rope_dim: int, theta: float, q_norm: np.ndarray | None = None,
                      k_norm: np.ndarray | None = None, eps: float = 0.0) -> np.ndarray:
    """q [T, Hq, D], k, v [T, Hkv, D] of a step's rows; kv_dst [T] the flat KV row of each row
    (< 0: padding); k_pages, v_pages [n_pages, page_size, Hkv, D], updated in place with the
    rows' k' and v; csr (qo_indptr, kv_indptr, kv_indices, kv_last_page_len, seq_slots) as
    luce/models/batch.py -> attention output [T, Hq, D] f32 (causal)."""
    q2, k2, v2 = rope_kv_write(q, k, v, positions, rope_dim, theta, (), q_norm, k_norm, eps)
    flat_k = k_pages.reshape(-1, *k_pages.shape[2:])
    flat_v = v_pages.reshape(-1, *v_pages.shape[2:])
    for row, dst in enumerate(np.asarray(kv_dst).tolist()):
        if dst >= 0:
            flat_k[dst], flat_v[dst] = k2[row], v2[row]
    return paged_attention(q2.astype(np.float32), k_pages, v_pages, *csr, scale, True)
