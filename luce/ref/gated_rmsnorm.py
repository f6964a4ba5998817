"""Gated RMSNorm reference (kernel: cuda/gated_rmsnorm.cu): the GDN output norm,
transformers' `Qwen3_5RMSNormGated` (norm first, then the SiLU gate)."""
from __future__ import annotations

import numpy as np


def gated_rmsnorm(x: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [..., D] f32, z [..., D] f32 (gate), weight [D] -> [..., D] f32:
    x / sqrt(mean(x^2) + eps) * weight * silu(z). Accumulates in float64."""
    if x.shape != z.shape:
        raise ValueError(f"gated_rmsnorm: x {x.shape} and gate z {z.shape} must have one shape")
    x64 = x.astype(np.float64)
    z64 = z.astype(np.float64)
    scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    gate = z64 / (1.0 + np.exp(-z64))
    return (x64 * scale * weight.astype(np.float64) * gate).astype(np.float32)
