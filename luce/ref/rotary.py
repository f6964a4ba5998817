"""Rotary position embedding reference (kernel: cuda/rotary.cu).

NEOX style (llama.cpp GGML_ROPE_TYPE_NEOX, transformers' rotate_half): on the first
`rope_dim` dims of each head, pair i = (x[i], x[i + rope_dim/2]) rotates by
angle_i = p_i * theta^(-2i / rope_dim); the other dims pass through (partial rotary).

M-RoPE (qwen35, llama.cpp GGML_ROPE_TYPE_IMROPE): each row has 4 positions (t, h, w, e)
and pair i takes one of them by the interleaved rule of ggml's mrope cache:
sector = i mod sum(sections); sector % 3 == 1 and sector < 3*sections[1] -> h,
== 2 and < 3*sections[2] -> w, == 0 and < 3*sections[0] -> t, otherwise e.
Text tokens carry the same position on every section, which reduces to plain NEOX.
Angles, cos and sin are computed in float64 and the result is rounded to f32 once.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def imrope_section_of_pair(n_pairs: int, sections: Sequence[int]) -> np.ndarray:
    """[n_pairs] int: which position (0=t, 1=h, 2=w, 3=e) rotates each pair under IMROPE."""
    if len(sections) != 4:
        raise ValueError(f"M-RoPE needs 4 section sizes, got {list(sections)}")
    total = int(sum(sections))
    if total <= 0:
        raise ValueError(f"M-RoPE sections {list(sections)} sum to {total}")
    out = np.empty(n_pairs, dtype=np.int64)
    for i in range(n_pairs):
        sector = i % total
        if sector % 3 == 1 and sector < 3 * sections[1]:
            out[i] = 1
        elif sector % 3 == 2 and sector < 3 * sections[2]:
            out[i] = 2
        elif sector % 3 == 0 and sector < 3 * sections[0]:
            out[i] = 0
        else:
            out[i] = 3
    return out


def rope_angles(positions: np.ndarray, rope_dim: int, theta: float,
                sections: Sequence[int] = ()) -> np.ndarray:
    """positions [T] int (or [T, 4] with sections) -> angles [T, rope_dim/2] float64."""
    if rope_dim % 2:
        raise ValueError(f"rope_dim must be even, got {rope_dim}")
    n_pairs = rope_dim // 2
    inv_freq = float(theta) ** (-2.0 * np.arange(n_pairs, dtype=np.float64) / rope_dim)
    pos = np.asarray(positions, dtype=np.float64)
    if not sections:
        if pos.ndim != 1:
            raise ValueError(f"plain rotary wants positions [T], got {pos.shape}")
        return pos[:, None] * inv_freq[None, :]
    if pos.ndim == 1:
        pos = np.repeat(pos[:, None], 4, axis=1)
    if pos.ndim != 2 or pos.shape[1] != 4:
        raise ValueError(f"M-RoPE wants positions [T] or [T, 4], got {pos.shape}")
    per_pair = pos[:, imrope_section_of_pair(n_pairs, sections)]  # [T, n_pairs]
    return per_pair * inv_freq[None, :]


def rope(x: np.ndarray, positions: np.ndarray, rope_dim: int, theta: float,
         sections: Sequence[int] = ()) -> np.ndarray:
    """x [T, H, D] f32 -> [T, H, D] f32 with NEOX rotary on dims [0, rope_dim) of each head."""
    if x.ndim != 3 or rope_dim > x.shape[2]:
        raise ValueError(f"rope wants x [T, H, D] with rope_dim <= D, got {x.shape}, rope_dim={rope_dim}")
    half = rope_dim // 2
    ang = rope_angles(positions, rope_dim, theta, sections)[:, None, :]  # [T, 1, half]
    if ang.shape[0] != x.shape[0]:
        raise ValueError(f"rope: {x.shape[0]} rows but {ang.shape[0]} positions")
    cos, sin = np.cos(ang), np.sin(ang)
    x0 = x[..., :half].astype(np.float64)
    x1 = x[..., half:rope_dim].astype(np.float64)
    out = x.copy()
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:rope_dim] = x0 * sin + x1 * cos
    return out
