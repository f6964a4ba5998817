"""Prompt-row matmul reference (kernel: cuda/matmul_prefill.cu; DESIGN 5 rule 1, prefill rows).

The kernel quantizes x to 8 bits per 32 values as ggml's q8_1 does (quantize_x8, bit for bit
what cuda/matmul_prefill_x.cuh computes), then multiplies exactly in integers and combines in
f32; so its result is luce.ref.matmul on the dequantized x8 and the dequantized weights, up to
f32 rounding. Against the f32 product of x itself it errs by at most error_bound: each x
value moves by at most half a step, d / 2 = max|x of its block| / 254.
"""
from __future__ import annotations

import numpy as np

from luce.ref.matmul import matmul

GROUP = 32
QMAX = np.float32(127.0)


def quantize_x8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [T, K] f32 (K % 32 == 0) -> q [T, K] int8 (|q| <= 127), d [T, K/32] f32 with
    q = rint(x * (127 / amax)), d = amax / 127 per 32-value block (amax = max |x|; q = d = 0
    where amax = 0). A block holding inf or NaN gets d = NaN."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % GROUP:
        raise ValueError(f"quantize_x8 wants x [T, K] with K a multiple of {GROUP}, got {x.shape}")
    t, k = x.shape
    blocks = x.reshape(t, k // GROUP, GROUP)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.abs(blocks).max(axis=2)                                   # [T, K/32] (NaN propagates)
        bad = ~np.isfinite(np.abs(blocks)).all(axis=2)
        live = (amax > 0) & ~bad
        inv = np.where(live, QMAX / np.where(live, amax, 1).astype(np.float32), 0).astype(np.float32)
        q = np.rint(np.where(bad[:, :, None], 0, blocks) * inv[:, :, None]).clip(-127, 127).astype(np.int8)
        d = np.where(bad, np.nan, np.where(live, amax, 0) / QMAX).astype(np.float32)
    return q.reshape(t, k), d


def dequantize_x8(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """q [T, K] int8, d [T, K/32] f32 -> [T, K] f32 = q * d per block."""
    t, k = q.shape
    return (q.reshape(t, k // GROUP, GROUP).astype(np.float32) * d[:, :, None]).reshape(t, k)


def matmul_prefill(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x [T, K] f32, w [N, K] f32 (dequantized weights), bias [N] | None -> [T, N] f32: the
    product the prompt-row kernel computes (x through quantize_x8)."""
    return matmul(dequantize_x8(*quantize_x8(x)), w, bias)


def error_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[T, N] float64: |matmul_prefill(x, w) - x @ w^T| <= this, before f32 rounding:
    sum over blocks b of max|x[t, b]| / 254 * sum over k in b of |w[r, k]|."""
    t, k = x.shape
    half_step = np.abs(np.asarray(x, np.float64)).reshape(t, k // GROUP, GROUP).max(axis=2) / 254.0
    w_abs = np.abs(np.asarray(w, np.float64)).reshape(w.shape[0], k // GROUP, GROUP).sum(axis=2)
    return half_step @ w_abs.T
