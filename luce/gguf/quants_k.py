"""K-quants (256-value super-blocks): Q4_K, Q5_K, Q6_K.

Codecs work on whole blocks: `dequantize_*(blocks [nb, bytes] u8, out [nb, 256] f32)` fills
`out`; `quantize_*(x [nb, 256] f32) -> [nb, bytes] u8`. Dequantizers follow ggml's order of
float32 operations exactly (bit-identical to the `gguf` package).

Layouts (little-endian):
  Q4_K 144 B: f16 d, f16 dmin, scales[12], qs[128]
  Q5_K 176 B: f16 d, f16 dmin, scales[12], qh[32], qs[128]
       8 sub-blocks of 32; x = (d * sc[j]) * q - dmin * m[j]; sc, m 6-bit packed in scales[12]
       (bytes 0-3: sc[0:4] | top 2 bits of sc[4:8] << 6; bytes 4-7: m[0:4] | top of m[4:8] << 6;
       bytes 8-11: low 4 bits of sc[4:8] | low 4 bits of m[4:8] << 4).
       qs[32 i + l]: low nibble = sub-block 2i value l, high nibble = sub-block 2i+1 value l.
       Q5_K: bit j of qh[l] is bit 4 of sub-block j value l.
  Q6_K 210 B: ql[128], qh[64], int8 scales[16], f16 d
       16 sub-blocks of 16; x = (d * scales[v // 16]) * (q - 32), q 6 bits. Per half h (128 values,
       groups g0..g3 of 32): ql[64h + l] = g0 low | g2 low << 4, ql[64h + 32 + l] = g1 low |
       g3 low << 4, qh[32h + l] = g0 hi | g1 hi << 2 | g2 hi << 4 | g3 hi << 6.
"""
from __future__ import annotations

import numpy as np

from .quants_search import asymmetric_grid_fit, f16_scale, safe_inverse, signed_absmax, \
    symmetric_grid_fit

_QH_SHIFTS_8 = np.arange(8, dtype=np.uint8)[None, :, None]           # [1, 8, 1] (quantize)
_QH_SHIFTS_Q6 = np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]  # [1, 1, 4, 1]


# ---- shared: 6-bit packed scales and mins, f16 header ------------------------------------

def unpack_k_scales(packed: np.ndarray):
    """packed [nb, 12] u8 -> (sc [nb, 8] u8, m [nb, 8] u8), each 0..63."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, m


def pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """sc, m [nb, 8] u8 in 0..63 -> packed [nb, 12] u8 (inverse of unpack_k_scales)."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 at byte `offset` of every block, as f32 [nb, 1]."""
    return blocks[:, offset:offset + 2].view(np.float16).astype(np.float32)


def _sub_block_affine(blocks: np.ndarray):
    """Q4_K/Q5_K header -> (scale [nb, 8] f32, min [nb, 8] f32) as the decoder computes them."""
    sc, m = unpack_k_scales(blocks[:, 4:16])
    return _f16_at(blocks, 0) * sc.astype(np.float32), _f16_at(blocks, 2) * m.astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """qs [nb, 128] u8 -> levels [nb, 8, 32] u8 in sub-block order (low nibbles first)."""
    nb = qs.shape[0]
    pairs = qs.reshape(nb, 4, 1, 32)
    q = np.empty((nb, 4, 2, 32), np.uint8)
    np.bitwise_and(pairs, 15, out=q[:, :, :1])
    np.right_shift(pairs, 4, out=q[:, :, 1:])
    return q.reshape(nb, 8, 32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """levels [nb, 8, 32] (low 4 bits used) -> qs [nb, 128] u8."""
    return ((q[:, 0::2] & 15) | ((q[:, 1::2] & 15) << 4)).reshape(q.shape[0], 128)


def _apply_affine(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray, out: np.ndarray):
    """out [nb, 256] = scale * q - min per 32-value sub-block (two roundings, as ggml)."""
    nb = q.shape[0]
    o = out.reshape(nb, 8, 32)
    np.multiply(scale[:, :, None], q, out=o)
    np.subtract(o, minimum[:, :, None], out=o)


# ---- Q4_K / Q5_K -------------------------------------------------------------------------

def dequantize_q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    scale, minimum = _sub_block_affine(blocks)
    _apply_affine(_nibbles(blocks[:, 16:144]), scale, minimum, out)


def dequantize_q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    scale, minimum = _sub_block_affine(blocks)
    q = _nibbles(blocks[:, 48:176])
    qh = blocks[:, 16:48]                                            # bit j: sub-block j
    for j in range(8):
        q[:, j] |= ((qh >> j) & 1) << 4
    _apply_affine(q, scale, minimum, out)


_ASYM_STEPS = np.linspace(-1.0, 1.0, 21)


def _quantize_affine(x: np.ndarray, nmax: int):
    """x [nb, 256] -> (d [nb,1], dmin [nb,1] f32 f16-exact, sc, m [nb, 8] u8, q [nb, 8, 32] u8).

    Per sub-block grid search for (scale, min); both are then stored as 6-bit multiples of
    the super-block d / dmin, rounding each down or up, whichever pair fits the sub-block best.
    """
    nb = x.shape[0]
    scale, minimum = asymmetric_grid_fit(x.reshape(nb * 8, 32), nmax, nmax + _ASYM_STEPS)
    scale, minimum = scale.reshape(nb, 8), minimum.reshape(nb, 8)
    d = f16_scale(scale.max(axis=1, keepdims=True) / np.float32(63))
    dmin = f16_scale(minimum.max(axis=1, keepdims=True) / np.float32(63))
    sc_exact, m_exact = scale * safe_inverse(d), minimum * safe_inverse(dmin)
    xs = x.reshape(nb, 8, 32)
    best_err = np.full((nb, 8), np.inf, np.float32)
    best_sc, best_m, best_q = np.zeros((nb, 8)), np.zeros((nb, 8)), np.zeros((nb, 8, 32))
    rounded = lambda v: [np.clip(np.floor(v), 0, 63), np.clip(np.ceil(v), 0, 63)]  # noqa: E731
    for sc in rounded(sc_exact):
        for m in rounded(m_exact):
            eff_scale, eff_min = d * sc, dmin * m                    # [nb, 8] as the decoder
            q = np.rint((xs + eff_min[:, :, None]) * safe_inverse(eff_scale)[:, :, None])
            q = np.clip(q, 0, nmax)
            err = np.square(eff_scale[:, :, None] * q - eff_min[:, :, None] - xs).sum(axis=2)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_sc, best_m = np.where(better, sc, best_sc), np.where(better, m, best_m)
            best_q = np.where(better[:, :, None], q, best_q)
    return d, dmin, best_sc.astype(np.uint8), best_m.astype(np.uint8), best_q.astype(np.uint8)


def _k_header(d, dmin, sc, m) -> np.ndarray:
    """[nb, 16] u8: f16 d, f16 dmin, packed scales."""
    return np.concatenate([d.astype(np.float16).view(np.uint8),
                           dmin.astype(np.float16).view(np.uint8),
                           pack_k_scales(sc, m)], axis=1)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _quantize_affine(x, 15)
    return np.concatenate([_k_header(d, dmin, sc, m), _pack_nibbles(q)], axis=1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _quantize_affine(x, 31)
    qh = ((q >> 4) << _QH_SHIFTS_8).sum(axis=1, dtype=np.uint8)      # [nb, 32], bit j = sub j
    return np.concatenate([_k_header(d, dmin, sc, m), qh, _pack_nibbles(q)], axis=1)


# ---- Q6_K --------------------------------------------------------------------------------

def dequantize_q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    nb = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(nb, 2, 2, 32)                      # [half, pair, l]
    qh = blocks[:, 128:192].reshape(nb, 2, 32)
    q = np.empty((nb, 2, 4, 32), np.uint8)                          # [half, group, l]
    np.bitwise_and(ql, 15, out=q[:, :, 0:2])
    np.right_shift(ql, 4, out=q[:, :, 2:4])
    for group in range(4):
        q[:, :, group] |= ((qh >> 2 * group) & 3) << 4
    centred = q.view(np.int8) - np.int8(32)
    scale = _f16_at(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    np.multiply(scale[:, :, None], centred.reshape(nb, 16, 16), out=out.reshape(nb, 16, 16))


_Q6_MULTIPLIERS = -(32 + 0.1 * np.arange(-9, 10))


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Per 16-value sub-block scale search, int8 scales against the super-block maximum."""
    nb = x.shape[0]
    scale = symmetric_grid_fit(x.reshape(nb * 16, 16), -32, 31, _Q6_MULTIPLIERS).reshape(nb, 16)
    d = f16_scale(-signed_absmax(scale) / np.float32(128))          # [nb, 1]
    sc = np.clip(np.rint(scale * safe_inverse(d)), -128, 127).astype(np.int8)
    eff_scale = d * sc.astype(np.float32)                            # [nb, 16] as the decoder
    xs = x.reshape(nb, 16, 16)
    q = np.clip(np.rint(xs * safe_inverse(eff_scale)[:, :, None]), -32, 31)
    g = (q + 32).astype(np.uint8).reshape(nb, 2, 4, 32)             # [half, group, l]
    ql = (g[:, :, 0:2] & 15) | ((g[:, :, 2:4] & 15) << 4)            # [nb, 2, 2, 32]
    qh = ((g >> 4) << _QH_SHIFTS_Q6).sum(axis=2, dtype=np.uint8)     # [nb, 2, 32]
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8),
                           d.astype(np.float16).view(np.uint8)], axis=1)
