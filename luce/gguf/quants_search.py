"""Scale searches shared by the quantizers: pick per-group scales that minimize squared error.

All work on many groups at once: `x [R, n] f32` holds R groups (sub-blocks) of n values.
Each search tries a small grid of candidate inverse scales, rounds every candidate to levels,
fits the best scale (and offset) for those levels by least squares and keeps the candidate
with the smallest squared error (the idea of llama.cpp's make_qx_quants / make_qkx2_quants,
unweighted because the target here is plain RMS error).
"""
from __future__ import annotations

import numpy as np

F16_MAX = 65504.0


def f16_scale(x: np.ndarray) -> np.ndarray:
    """Round scales to f16 and back to f32 (the value the decoder will see). Shape kept."""
    return np.clip(x, -F16_MAX, F16_MAX).astype(np.float16).astype(np.float32)


def safe_inverse(d: np.ndarray) -> np.ndarray:
    """1/d where d != 0, else 0 (an all-zero group quantizes to zeros). Same shape, f32."""
    d = np.asarray(d, dtype=np.float32)
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def signed_absmax(x: np.ndarray) -> np.ndarray:
    """x [R, n] -> [R, 1]: the value of largest magnitude in each row, with its sign."""
    pick = np.abs(x).argmax(axis=1)
    return np.take_along_axis(x, pick[:, None], axis=1)


def symmetric_grid_fit(x: np.ndarray, nmin: int, nmax: int, multipliers: np.ndarray):
    """Best scale per row for x ~ s * q, q = clip(rint(x / s), nmin, nmax).

    x [R, n] f32. Candidate inverse scales are `m / v` for m in `multipliers` (in levels;
    negative m sends v to the negative end) and v the row's signed_absmax. Returns the
    least-squares scale of the best candidate, [R] f32 (0 for all-zero rows).
    """
    inv = safe_inverse(signed_absmax(x))[:, :, None] * multipliers.astype(np.float32)
    q = np.clip(np.rint(x[:, :, None] * inv), nmin, nmax)            # [R, n, C]
    sum_qx = np.einsum("rnc,rn->rc", q, x, dtype=np.float64)
    sum_qq = np.einsum("rnc,rnc->rc", q, q, dtype=np.float64)
    return _best_least_squares(sum_qx, sum_qq)


def table_grid_fit(x: np.ndarray, table: np.ndarray, multipliers: np.ndarray):
    """Best scale per row for x ~ s * table[i], i = index of the entry nearest x / s.

    x [R, n] f32, table [K] sorted ascending. Candidates as in symmetric_grid_fit, with
    multipliers in table units. Returns [R] f32.
    """
    table = table.astype(np.float32)
    inv = safe_inverse(signed_absmax(x))[:, :, None] * multipliers.astype(np.float32)
    t = table[nearest_table_index(x[:, :, None] * inv, table)]      # [R, n, C]
    sum_tx = np.einsum("rnc,rn->rc", t, x, dtype=np.float64)
    sum_tt = np.einsum("rnc,rnc->rc", t, t, dtype=np.float64)
    return _best_least_squares(sum_tx, sum_tt)


def nearest_table_index(v: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index of the entry of the ascending `table` nearest each element of v (same shape)."""
    midpoints = (table[:-1] + table[1:]) / 2
    return np.searchsorted(midpoints, v).astype(np.uint8)


def _best_least_squares(sum_qx: np.ndarray, sum_qq: np.ndarray) -> np.ndarray:
    """[R, C] sums -> [R] scale of the candidate whose LS fit removes the most energy."""
    scale = sum_qx / np.where(sum_qq > 0, sum_qq, 1)
    gain = sum_qx * scale                                            # error = |x|^2 - gain
    best = gain.argmax(axis=1)
    return np.take_along_axis(scale, best[:, None], axis=1)[:, 0].astype(np.float32)


def asymmetric_grid_fit(x: np.ndarray, nmax: int, steps: np.ndarray):
    """Best (scale, min) per row for x ~ scale * q - min, q = clip(rint((x + min) / scale)).

    x [R, n] f32; q in 0..nmax; min >= 0 (the offset is never positive, as in K-quants).
    Candidate inverse scales are `step / (max(x) - min(x, 0))` for step in `steps` (levels);
    for each the levels get a joint least-squares fit of scale and offset. Returns
    (scale [R] f32 >= 0, min [R] f32 >= 0).
    """
    n = x.shape[1]
    lo = np.minimum(x.min(axis=1), 0)                                # [R]
    span = x.max(axis=1) - lo
    inv = safe_inverse(span)[:, None] * steps.astype(np.float32)     # [R, C]
    q = np.clip(np.rint((x - lo[:, None])[:, :, None] * inv[:, None, :]), 0, nmax)
    x64 = x.astype(np.float64)
    s_q = q.sum(axis=1, dtype=np.float64)                            # [R, C]
    s_qq = np.einsum("rnc,rnc->rc", q, q, dtype=np.float64)
    s_qx = np.einsum("rnc,rn->rc", q, x, dtype=np.float64)
    s_x = x64.sum(axis=1)[:, None]
    s_xx = (x64 * x64).sum(axis=1)[:, None]
    det = n * s_qq - s_q * s_q
    ok = det > 0
    det = np.where(ok, det, 1)
    scale = np.where(ok, (n * s_qx - s_q * s_x) / det, 0)
    offset = np.where(ok, (s_qq * s_x - s_q * s_qx) / det, s_x / n)
    # the offset must be <= 0: refit the scale alone with offset 0 where it is not
    positive = offset > 0
    scale = np.where(positive, s_qx / np.where(s_qq > 0, s_qq, 1), scale)
    offset = np.where(positive, 0, offset)
    scale = np.maximum(scale, 0)
    err = (s_xx + scale * scale * s_qq + n * offset * offset
           - 2 * scale * s_qx - 2 * offset * s_x + 2 * scale * offset * s_q)
    best = err.argmin(axis=1)[:, None]
    pick = lambda a: np.take_along_axis(a, best, axis=1)[:, 0].astype(np.float32)  # noqa: E731
    return pick(scale), -pick(offset)
