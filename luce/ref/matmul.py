"""Matmul reference y = x @ W^T (kernel family: quantized GEMV/GEMM; cpu: luce/cpu/matmul.c).

Plain f32 numpy (BLAS underneath): the readable statement of what every matmul computes.
It promises no bitwise property: BLAS picks its kernel by shape and CPU, so a row's rounding
may depend on the rows beside it. The kernels that must be batch-invariant (cpu, CUDA) fix
each output's reduction order by K alone and are checked against this with tolerances.
"""
from __future__ import annotations

import numpy as np


def matmul(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x [T, K] f32, w [N, K] f32, bias [N] f32 | None -> [T, N] f32 = x @ w^T (+ bias)."""
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"matmul wants x [T, K] and w [N, K], got {x.shape} and {w.shape}")
    out = np.matmul(x, w.T).astype(np.float32, copy=False)
    if bias is not None:
        out = out + bias.astype(np.float32)
    return out
