"""Pointwise maths of the models (kernel: cuda/pointwise.cu); the numpy backend's
add/mul/silu/sigmoid/softplus/exp/l2norm are these functions.

binary ops round once in f32 (numpy's f32 add/multiply); the transcendental ones compute in
float64 and round to f32 once; l2norm sums squares in float64.
"""
from __future__ import annotations

import numpy as np

from luce.ref.swiglu import silu  # noqa: F401  (x / (1 + exp(-x)) in float64)

UNARY_OPS = ("silu", "sigmoid", "softplus", "exp")


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def add(a, b) -> np.ndarray:
    """a + b, numpy broadcasting, f32."""
    return np.add(_f32(a), _f32(b), dtype=np.float32)


def mul(a, b) -> np.ndarray:
    """a * b, numpy broadcasting, f32."""
    return np.multiply(_f32(a), _f32(b), dtype=np.float32)


def mul_sigmoid(a, b) -> np.ndarray:
    """a * sigmoid(b), numpy broadcasting: the sigmoid rounded to f32, then the f32 product."""
    return mul(a, sigmoid(b))


def sigmoid(x) -> np.ndarray:
    x64 = _f32(x).astype(np.float64)
    return (1.0 / (1.0 + np.exp(-x64))).astype(np.float32)


def softplus(x) -> np.ndarray:
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), in float64."""
    return np.logaddexp(0.0, _f32(x).astype(np.float64)).astype(np.float32)


def exp(x) -> np.ndarray:
    return np.exp(_f32(x).astype(np.float64)).astype(np.float32)


def l2norm(x, eps: float) -> np.ndarray:
    """x [..., D] -> x / sqrt(sum(x^2) + eps) per row of D."""
    x64 = _f32(x).astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).sum(axis=-1, keepdims=True) + eps)).astype(np.float32)


def unary(x, op: str) -> np.ndarray:
    """op in UNARY_OPS applied elementwise."""
    if op not in UNARY_OPS:
        raise ValueError(f"unary op must be one of {UNARY_OPS}, got {op!r}")
    return {"silu": lambda v: silu(_f32(v)), "sigmoid": sigmoid, "softplus": softplus, "exp": exp}[op](x)
