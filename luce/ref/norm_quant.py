"""References of the fused producers of a quantized matmul's input (cuda/norm_quant.cu): each
is the composition of the references of the ops it fuses, which is all the kernel may compute.

The CUDA kernels also quantize their output for the next matmul (cuda/matmul_x.cuh); that
quantization is the matmul's own, so its reference is luce.ref.matmul on the f32 output.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.ref.matmul import matmul
from luce.ref.pointwise import add, mul_sigmoid
from luce.ref.rmsnorm import rmsnorm
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



def gate_output_matmul(o: np.ndarray, qg: np.ndarray, w: np.ndarray) -> np.ndarray:
    """o [T, H*D], qg [T, H, 2D] (each head's query, then its gate) -> matmul(o * sigmoid(gates),
    w) [T, N], w [N, H*D]: the gated attention's output projection (luce_gate_quant, then the
    matmul on its quantized x)."""
    T, H, D = qg.shape[0], qg.shape[1], qg.shape[2] // 2
    return matmul(mul_sigmoid(o, np.ascontiguousarray(qg[:, :, D:]).reshape(T, H * D)), w)
