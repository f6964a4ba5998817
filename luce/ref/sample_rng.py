"""Seeded sampling of logits rows (kernel: cuda/sample_rng.cu): the engine's host sampler,
luce.engine.sampler.sample_token without penalties, applied row by row."""
from __future__ import annotations

import numpy as np

from luce.engine.rng import MASK64
from luce.engine.sampler import SamplingParams, sample_token


def sample_rng(logits: np.ndarray, temperature, top_k, top_p, min_p, seed, position) -> np.ndarray:
    """logits [L, V] f32; temperature, top_p, min_p [L] float; top_k [L] int; seed [L]
    (taken mod 2^64); position [L] int -> [L] int64 tokens (-1 for a row holding NaN)."""
    logits = np.asarray(logits, dtype=np.float32)
    out = np.empty(logits.shape[0], dtype=np.int64)
    for i, row in enumerate(logits):
        if np.isnan(row).any():
            out[i] = -1
            continue
        params = SamplingParams(temperature=float(temperature[i]), top_k=int(top_k[i]), top_p=float(top_p[i]),
                                min_p=float(min_p[i]))
        out[i] = sample_token(row, params, int(seed[i]) & MASK64, int(position[i]))
    return out

