"""The f32 operation order of paged attention (kernels: cuda/attention.cu, per row, and
cuda/attention_prefill.cu, tiles of prompt rows, which must agree bit for bit).

The math is luce/ref/attention.py (float64, the tolerance reference of both kernels). This
module spells out the ORDER of the f32 operations both kernels share, the contract that makes
a prompt row's bits independent of its tile and of the kernel that took it (DESIGN 5):
  - keys are cut into partitions of PARTITION at absolute KV indices;
  - score(j) = (((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))) * scale, p_i the running
    sum over float4 slices c * 8 + i of q . k_j (c increasing, components x, y, z, w);
  - per partition m = max score; l = the 32 lane sums (lane L: keys j = L mod 32 in order)
    folded by the butterfly (masks 16, 8, 4, 2, 1); weights exp(score - m);
  - o = chain 0 + chain 1 + ... (in order), chain u summing weight * v over keys j = u mod KL,
    KL = 512 / D, in increasing j;
  - partitions merge in order: M = max m_i, L = sum l_i exp(m_i - M), O = sum o_i exp(m_i - M) / L.
The kernels multiply-add with fmaf (one rounding); numpy rounds a * b + c twice, so this model
agrees with them to f32 rounding, not bitwise. [G, D] arrays hold the G query heads of one
KV head.
"""
from __future__ import annotations

import numpy as np

PARTITION = 256   # LUCE_ATTN_PARTITION
LANES = 32        # lanes of the softmax sums
SLICES = 8        # lanes that share one key's dot product in the per-row kernel


def _butterfly(x: np.ndarray) -> np.ndarray:
    """[..., LANES] -> [...]: lane 0 after the xor butterfly sum."""
    for mask in (16, 8, 4, 2, 1):
        x = x + x[..., np.arange(LANES) ^ mask]
    return x[..., 0]


def partition_partial(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float):
    """q [G, D], k, v [n, D] f32 (n <= PARTITION) -> (o [G, D], m [G], l [G]) f32 unnormalized."""
    q, k, v = (np.asarray(a, np.float32) for a in (q, k, v))
    g, d = q.shape
    n = k.shape[0]
    q4, k4 = q.reshape(g, -1, SLICES, 4), k.reshape(n, -1, SLICES, 4)
    p = np.zeros((SLICES, g, n), np.float32)
    for c in range(q4.shape[1]):
        for x in range(4):
            p += q4[:, c, :, x].T[:, :, None] * k4[None, :, c, :, x].transpose(2, 0, 1)
    s = (((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]))) * np.float32(scale)   # [G, n]
    m = s.max(axis=1)
    e = np.exp(s - m[:, None])
    lanes = np.zeros((g, LANES), np.float32)
    for j in range(n):
        lanes[:, j % LANES] += e[:, j]
    kl = 512 // d
    chains = np.zeros((kl, g, d), np.float32)
    for j in range(n):
        chains[j % kl] += e[:, j, None] * v[j][None, :]
    o = chains[0].copy()
    for u in range(1, kl):
        o += chains[u]
    return o, m, _butterfly(lanes)


def attend_row_f32(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """One row over its n keys in the kernels' order: q [G, D], k, v [n, D] -> [G, D] f32."""
    parts = [partition_partial(q, k[i:i + PARTITION], v[i:i + PARTITION], scale)
             for i in range(0, k.shape[0], PARTITION)]
    big_m = np.max([m for _, m, _ in parts], axis=0)
    big_l = np.zeros_like(big_m)
    out = np.zeros_like(q, dtype=np.float32)
    for o, m, l in parts:
        w = np.exp(m - big_m)
        big_l += l * w
        out += o * w[:, None]
    return out / big_l[:, None]
