"""The arithmetic of prompt-row attention (kernels: cuda/attention_prefill_f16.cuh, f16 tensor
cores, and cuda/attention_prefill.cu's TF32 one; LUCE_ATTN_PROMPT=f16 or tf32 picks one,
DEFAULT_KIND is the kernel a launch takes without it).

The math is luce/ref/attention.py. Prompt rows (DESIGN 5 rule 1: a row's kind picks its
arithmetic) take their own kernel, whose definition this module writes down in float64 except
for the roundings that set its accuracy. Keys are cut into splits of SPLIT at absolute KV
indices, each split into blocks of block_keys(D) keys, and the splits merge in order:
M = max m_i, O = sum o_i exp2(m_i - M) / sum l_i exp2(m_i - M). Per block, by kind:
  - "f16": q16 = f16(f32(q * f32(scale * log2 e))), k and v rounded to f16 (10 mantissa bits,
    nearest even: `f16`); s = q16 . k16, m' = max(m, max s), e = exp2(s - m'),
    l = l exp2(m - m') + sum e, o = o exp2(m - m') + f16(e) v16 (l sums e unrounded);
  - "tf32": q, k and v rounded to TF32 (10 mantissa bits, nearest, ties away: `tf32`);
    s = (q . k) * (scale * log2 e), p = tf32(exp2(s - m')), l = l exp2(m - m') + sum p,
    o = o exp2(m - m') + p v.
The kernels accumulate in f32 (the tensor core's own order inside one MMA) and the f16 one
takes exp2 from the hardware approximation, so each agrees with its model to f32 accumulation
error plus the rare p whose rounding flips, not bitwise; against the exact math the error is
that of a 10-bit mantissa (tests/kernels/tolerances.py).
"""
from __future__ import annotations

import numpy as np

from luce.ref.attention import gather_kv

PARTITION = 256   # LUCE_ATTN_PARTITION (the partition kernel's unit)
SPLIT = 1024      # kSplitKeys (cuda/attention_common.cuh)
DEFAULT_KIND = "f16"  # kPromptF16ByDefault (cuda/attention_prefill.cu): true
LOG2E = np.float32(1.44269504088896340736)


def block_keys(d: int) -> int:
    """Keys per block of either kernel at head dim d."""
    return 32 if d >= 256 else 64


def tf32(x) -> np.ndarray:
    """f32 -> TF32 values (as f32): round to nearest, ties away from zero; inf / NaN unchanged."""
    x = np.ascontiguousarray(x, np.float32)
    u = x.view(np.uint32)
    r = ((u.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return np.where((u & 0x7F800000) == 0x7F800000, u, r).view(np.float32)


def f16(x) -> np.ndarray:
    """f32 -> f16 values (as f32): round to nearest even, overflow to inf."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def attend_row_prompt(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, kind: str = "f16") -> np.ndarray:
    """One prompt row over its n keys in the arithmetic of `kind` ("f16" or "tf32"):
    q [G, D], k, v [n, D] f32 -> [G, D] f32."""
    scale_log2 = np.float32(scale) * LOG2E  # f32, as the kernels form it
    if kind == "f16":
        qr = f16(np.asarray(q, np.float32) * scale_log2).astype(np.float64)
        kr, vr = f16(k).astype(np.float64), f16(v).astype(np.float64)
        s_scale, p_round, l_rounded = 1.0, f16, False
    elif kind == "tf32":
        qr = tf32(q).astype(np.float64)
        kr, vr = tf32(k).astype(np.float64), tf32(v).astype(np.float64)
        s_scale, p_round, l_rounded = float(scale_log2), tf32, True
    else:
        raise ValueError(f"unknown prompt-row arithmetic {kind!r}")
    n, d = k.shape
    nb = block_keys(d)
    parts = []
    for s0 in range(0, n, SPLIT):
        m = np.full(q.shape[0], -np.inf)
        l, o = np.zeros(q.shape[0]), np.zeros(q.shape, np.float64)
        for b0 in range(s0, min(s0 + SPLIT, n), nb):
            b1 = min(b0 + nb, n)
            s = (qr @ kr[b0:b1].T) * s_scale
            m_new = np.maximum(m, s.max(axis=1))
            alpha = np.exp2(m - m_new)
            e = np.exp2(s - m_new[:, None])
            p = p_round(e.astype(np.float32)).astype(np.float64)
            l = l * alpha + (p if l_rounded else e).sum(axis=1)
            o = o * alpha[:, None] + p @ vr[b0:b1]
            m = m_new
        parts.append((o, m, l))
    big_m = np.max([m for _, m, _ in parts], axis=0)
    w = [np.exp2(m - big_m) for _, m, _ in parts]
    big_l = sum(l * wi for (_, _, l), wi in zip(parts, w))
    out = sum(o * wi[:, None] for (o, _, _), wi in zip(parts, w))
    return (out / big_l[:, None]).astype(np.float32)


def paged_attention_prompt(q, k_pages, v_pages, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                           seq_slots, scale: float, causal: bool = True, rows: int | None = None,
                           kind: str = "f16"):
    """luce.ref.attention.paged_attention's layout and key rule with every row (or rows
    0..rows-1; None: all) in the prompt-row arithmetic of `kind`; other rows are zeros."""
    T, hq, d = q.shape
    page_size, hkv = k_pages.shape[1], k_pages.shape[2]
    group, rows = hq // hkv, T if rows is None else rows
    out = np.zeros((T, hq, d), np.float32)
    for s in range(len(seq_slots)):
        r0, r1 = int(qo_indptr[s]), int(qo_indptr[s + 1])
        if seq_slots[s] < 0 or r0 >= rows:
            continue
        pages = kv_indices[kv_indptr[s]:kv_indptr[s + 1]].astype(np.int64)
        kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(kv_last_page_len[s])
        k, v = (a.astype(np.float32) for a in gather_kv(k_pages, v_pages, pages, kv_len))
        for j, row in enumerate(range(r0, min(r1, rows))):
            n = kv_len - (r1 - r0) + j + 1 if causal else kv_len
            for h in range(hkv):
                out[row, h * group:(h + 1) * group] = attend_row_prompt(
                    q[row, h * group:(h + 1) * group], k[:n, h], v[:n, h], scale, kind)
    return out
