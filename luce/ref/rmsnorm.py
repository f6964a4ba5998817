"""RMSNorm reference (kernel: cuda/rmsnorm.cu)."""
from __future__ import annotations

import numpy as np


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [..., D] f32, weight [D] -> [..., D] f32: x / sqrt(mean(x^2) + eps) * weight.

    Accumulates in float64 so the reference is more accurate than any kernel it checks."""
    x64 = x.astype(np.float64)
    scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (x64 * scale * weight.astype(np.float64)).astype(np.float32)
