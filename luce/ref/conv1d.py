"""Causal depthwise conv1d reference (kernel: cuda/conv1d.cu), the GDN input mixer.

The window of each channel is the K-1 previous inputs (carried in `state`) plus the current
one; the last tap `weight[:, K-1]` multiplies the current token, as in transformers'
`causal_conv1d_fn` / `causal_conv1d_update` and ggml's `ssm_conv`.
"""
from __future__ import annotations

import numpy as np


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def causal_conv1d(x: np.ndarray, weight: np.ndarray, state: np.ndarray,
                  silu: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """x [T, C] f32, weight [C, K] f32, state [K-1, C] f32 (the K-1 inputs before x[0],
    oldest first) -> (y [T, C] f32, new_state [K-1, C] f32: the last K-1 inputs).

    y[t, c] = sum_j weight[c, j] * window[t + j, c] with window = concat(state, x), then SiLU
    when `silu`. Accumulates in float64."""
    T, C = x.shape
    if weight.ndim != 2 or weight.shape[0] != C:
        raise ValueError(f"causal_conv1d: weight must be [C={C}, K], got {weight.shape}")
    K = weight.shape[1]
    if state.shape != (K - 1, C):
        raise ValueError(f"causal_conv1d: state must be [K-1={K - 1}, C={C}], got {state.shape}")
    window = np.concatenate([state.astype(np.float64), x.astype(np.float64)], axis=0)  # [K-1+T, C]
    w = weight.astype(np.float64)
    y = np.zeros((T, C), dtype=np.float64)
    for j in range(K):
        y += window[j:j + T] * w[:, j]
    if silu:
        y = _silu(y)
    new_state = window[T:].astype(np.float32)  # last K-1 rows of the window
    return y.astype(np.float32), new_state
