"""Reference of the fused attention input of a step (cuda/rope_kv.cu): the composition of
the RMSNorm and rotary references; the kernel also writes k' and v to the KV pages (kv_write)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.ref.rmsnorm import rmsnorm
from luce.ref.rotary import rope


def rope_kv_write(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, rope_dim: int,
                  theta: float, sections: Sequence[int] = (), q_norm: np.ndarray | None = None,
                  k_norm: np.ndarray | None = None, eps: float = 0.0):
    """The attention input of a step (cuda/rope_kv.cu): q [T, Hq, D], k, v [T, Hkv, D] ->
    (q', k', v) with q' = rope(rmsnorm(q) * q_norm), k' likewise (no norm where None); the
    kernel also writes k' and v to each row's KV location (kv_write)."""
    if q_norm is not None:
        q = rmsnorm(q, q_norm, eps)
    if k_norm is not None:
        k = rmsnorm(k, k_norm, eps)
    return rope(q, positions, rope_dim, theta, sections), rope(k, positions, rope_dim, theta, sections), v
