"""References of the fused kernels (cuda/norm_quant.cu, cuda/rope_kv.cu): each is the composition of the
references of the ops it fuses, which is all a fused kernel may compute.

The CUDA kernels also quantize their output for the next matmul (cuda/matmul_x.cuh); that
quantization is the matmul's own, so its reference is luce.ref.matmul on the f32 output.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.ref.matmul import matmul
from luce.ref.pointwise import add
from luce.ref.rmsnorm import rmsnorm
from luce.ref.rotary import rope
from luce.ref.swiglu import swiglu


def add_rmsnorm(x: np.ndarray, residual: np.ndarray | None, weight: np.ndarray,
                eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x, residual [T, D] f32 (residual None: x alone), weight [D] -> (s, rmsnorm(s) * weight)
    with s = x + residual (a transformer block's residual add, then the next block's norm)."""
    s = x if residual is None else add(x, residual)
    return s, rmsnorm(s, weight, eps)


def add_rmsnorm_matmuls(x: np.ndarray, residual: np.ndarray | None, weight: np.ndarray, eps: float,
                        weights: Sequence[np.ndarray], biases: Sequence | None = None):
    """(s, [matmul(rmsnorm(s) * weight, w, b) for each weight]): weights [N_i, D] f32."""
    s, normed = add_rmsnorm(x, residual, weight, eps)
    biases = list(biases) if biases is not None else [None] * len(weights)
    return s, [matmul(normed, w, b) for w, b in zip(weights, biases)]


def swiglu_matmul(gate: np.ndarray, up: np.ndarray | None, w: np.ndarray) -> np.ndarray:
    """gate, up [T, F] -> matmul(silu(gate) * up, w) [T, N], w [N, F]. up None: gate is the
    fused projection [T, 2F], gate its first F columns and up the last F."""
    if up is None:
        F = gate.shape[-1] // 2
        gate, up = gate[..., :F], gate[..., F:]
    return matmul(swiglu(gate, up), w)


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
