"""SwiGLU reference (kernel: cuda/swiglu.cu): silu(gate) * up, elementwise in f32."""
from __future__ import annotations

import numpy as np


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) in f32 (computed in float64, rounded once)."""
    x64 = x.astype(np.float64)
    return (x64 / (1.0 + np.exp(-x64))).astype(np.float32)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gate, up [..., F] f32 -> silu(gate) * up [..., F] f32."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} differ")
    g64 = gate.astype(np.float64)
    return (g64 / (1.0 + np.exp(-g64)) * up.astype(np.float64)).astype(np.float32)
