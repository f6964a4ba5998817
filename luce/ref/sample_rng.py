"""Seeded sampling of logits rows (kernel: cuda/sample_rng.cu), the arithmetic of the engine's
host sampler (luce.engine.sampler adds parameters and penalties on top of it).

Counter-based randomness: the draw for a token at absolute position n depends only on
(seed, n) (`uniform`), so a seeded request samples the same text alone, among others, and
with or without speculation. splitmix64 over (seed, position, stream) is pure integer
arithmetic, which the device reproduces bit for bit.

Candidate order is (logit descending, token id ascending), so ties and cumulative sums are
reproducible. The float64 maths after the candidate order uses only IEEE-rounded +, -, *, /,
rint and ldexp in a fixed order (`det_exp`, sequential sums), so the device sampler draws
bitwise the same tokens.
"""
from __future__ import annotations

import math

import numpy as np

MASK64 = (1 << 64) - 1
TOPK_MAX = 64  # = LUCE_SAMPLE_TOPK_MAX: the largest top-k the device sampler draws from


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int, stream: int = 0) -> float:
    """A float64 in [0, 1) from the top 53 bits of a hash of (seed, position, stream)."""
    h = splitmix64((seed & MASK64) ^ splitmix64((position & MASK64) ^ splitmix64(stream & MASK64)))
    return (h >> 11) * (1.0 / (1 << 53))


# exp(x) for x <= 0 by Cody-Waite reduction and a degree-13 Taylor polynomial: within 2 ulp
# of exp, and reproducible bit for bit wherever +, -, *, rint and ldexp round as IEEE says
# (numpy on the host; __dadd_rn/__dmul_rn on the device, never fused).
LN2_HI = 6.93147180369123816490e-01   # 32 significant bits: k * LN2_HI is exact for |k| < 2^21
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e+00
EXP_COEFFS = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))   # 1/13!, ..., 1/1!, 1
EXP_FLOOR = -700.0                    # det_exp is 0 below (and at -inf)


def det_exp(x) -> np.ndarray:
    """x [n] float64, every x <= 0 -> exp(x) [n] float64, deterministic (see above)."""
    x = np.asarray(x, dtype=np.float64)
    xc = np.maximum(x, EXP_FLOOR)
    k = np.rint(xc * INV_LN2)
    r = (xc - k * LN2_HI) - k * LN2_LO
    p = np.full_like(r, EXP_COEFFS[0])
    for c in EXP_COEFFS[1:]:
        p = p * r + c
    return np.where(x < EXP_FLOOR, 0.0, np.ldexp(p, k.astype(np.int32)))


def candidates(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
               min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Filtered distribution of one row [V] for a sampled draw (temperature > 0): (ids [n] in
    draw order, probs [n] f64 summing to 1). Order is logit descending then id ascending;
    temperature, top-k (<= 0: off), top-p and min-p applied. Sums are sequential
    (np.cumsum), exponentials `det_exp`: the device sampler's order."""
    scaled = np.asarray(logits).astype(np.float64) / temperature
    order = np.lexsort((np.arange(scaled.shape[0]), -scaled))
    if top_k > 0:
        order = order[:top_k]
    vals = scaled[order]
    probs = det_exp(vals - vals[0])
    probs = probs / np.cumsum(probs)[-1]
    if top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), top_p, side="left")) + 1
        order, probs = order[:cut], probs[:cut]
    if min_p > 0.0:
        keep = probs >= min_p * probs[0]
        order, probs = order[keep], probs[keep]
    return order, probs / np.cumsum(probs)[-1]


def draw(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
         seed: int, position: int) -> int:
    """The token of one row [V] at absolute `position`: argmax (lowest id on ties) when
    temperature is 0, else the (seed, position) draw from `candidates`."""
    if temperature == 0.0:
        return int(np.argmax(logits))
    ids, probs = candidates(logits, temperature, top_k, top_p, min_p)
    idx = int(np.searchsorted(np.cumsum(probs), uniform(seed, position), side="right"))
    return int(ids[min(idx, len(ids) - 1)])


def sample_rng(logits: np.ndarray, temperature, top_k, top_p, min_p, seed, position) -> np.ndarray:
    """logits [L, V] f32; temperature, top_p, min_p [L] float; top_k [L] int; seed [L]
    (taken mod 2^64); position [L] int -> [L] int64 tokens (-1 for a row holding NaN)."""
    logits = np.asarray(logits, dtype=np.float32)
    out = np.empty(logits.shape[0], dtype=np.int64)
    for i, row in enumerate(logits):
        if np.isnan(row).any():
            out[i] = -1
            continue
        out[i] = draw(row, float(temperature[i]), int(top_k[i]), float(top_p[i]), float(min_p[i]),
                      int(seed[i]) & MASK64, int(position[i]))
    return out
