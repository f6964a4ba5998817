"""Batch-invariant matmul reference y = x @ W^T (kernel family: quantized GEMV/GEMM).

BLAS picks its kernel by the row count (gemv for one row, gemm otherwise), and a row's
rounding changes with that choice. Multiplying in fixed tiles of ROW_TILE rows (the last
tile zero-padded) makes every call use the same gemm shape, so a row's result does not
depend on how many rows share the call or where it sits; tests/ops/test_numpy_backend.py
checks this bitwise with multithreaded OpenBLAS.
"""
from __future__ import annotations

import numpy as np

ROW_TILE = 16


def matmul(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x [T, K] f32, w [N, K] f32, bias [N] f32 | None -> [T, N] f32 = x @ w^T (+ bias)."""
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"matmul wants x [T, K] and w [N, K], got {x.shape} and {w.shape}")
    T, K = x.shape
    wt = w.T  # a view; every call hands BLAS the same (transposed) layout
    out = np.empty((T, w.shape[0]), dtype=np.float32)
    tile = np.zeros((ROW_TILE, K), dtype=np.float32)
    for r0 in range(0, T, ROW_TILE):
        n = min(ROW_TILE, T - r0)
        tile[:n] = x[r0:r0 + n]
        tile[n:] = 0.0
        out[r0:r0 + n] = np.matmul(tile, wt)[:n]
    if bias is not None:
        out += bias.astype(np.float32)
    return out
