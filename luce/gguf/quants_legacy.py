"""Float types and the 32-value legacy blocks: F32, F16, BF16, Q8_0, Q5_0.

Every codec here works on whole blocks: `dequantize_*(blocks [nb, bytes] u8, out [nb, values]
f32)` fills `out`, `quantize_*(x [nb, values] f32) -> [nb, bytes] u8`. The float types are
"blocks" of one value. The arithmetic order of every dequantizer matches ggml's reference
(and the `gguf` package) so results are bit-identical: a product of two float32 values is
rounded once, nothing is fused.

Layouts (little-endian):
  Q8_0  34 B / 32 values: f16 d, int8 q[32];                      x = q * d
  Q5_0  22 B / 32 values: f16 d, u32 qh, u8 qs[16];               x = d * (q - 16)
        q[j] = (qs[j] & 15) | bit j of qh << 4,  q[j + 16] = (qs[j] >> 4) | bit j+16 of qh << 4
"""
from __future__ import annotations

import numpy as np

from .quants_search import f16_scale, safe_inverse, symmetric_grid_fit


# ---- float types -------------------------------------------------------------------------

def dequantize_f32(blocks: np.ndarray, out: np.ndarray) -> None:
    out[...] = blocks.view(np.float32)


def quantize_f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8)


def dequantize_f16(blocks: np.ndarray, out: np.ndarray) -> None:
    out[...] = blocks.view(np.float16)


def quantize_f16(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8)


def dequantize_bf16(blocks: np.ndarray, out: np.ndarray) -> None:
    # bf16 is the top half of an f32: widen the bits, no arithmetic
    out.view(np.uint32)[...] = blocks.view(np.uint16).astype(np.uint32) << 16


def quantize_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on the dropped 16 bits; NaNs stay NaN (quiet, sign kept)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    quiet_nan = (bits >> 16) | 0x40
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16).view(np.uint8)


# ---- Q8_0 --------------------------------------------------------------------------------

def dequantize_q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    d = blocks[:, :2].view(np.float16).astype(np.float32)          # [nb, 1]
    np.multiply(blocks[:, 2:].view(np.int8), d, out=out)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Round to nearest with d = max|x| / 127 (already f16-rounded when q is chosen)."""
    nb = x.shape[0]
    d = f16_scale(np.abs(x).max(axis=1, keepdims=True) / np.float32(127))
    q = np.clip(np.rint(x * safe_inverse(d)), -127, 127).astype(np.int8)
    out = np.empty((nb, 34), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out


# ---- Q5_0 --------------------------------------------------------------------------------

def dequantize_q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    nb = blocks.shape[0]
    d = blocks[:, :2].view(np.float16).astype(np.float32)          # [nb, 1]
    q = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")    # [nb, 32] bit 4 of each
    q <<= 4
    qs = blocks[:, 6:22]
    q2 = q.reshape(nb, 2, 16)
    q2[:, 0] |= qs & 15
    q2[:, 1] |= qs >> 4
    np.multiply(d, q.view(np.int8) - np.int8(16), out=out)


_Q5_0_MULTIPLIERS = -16 + np.linspace(-0.8, 0.8, 9)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """Grid search over the block scale around max|x| -> level -16, then round to nearest."""
    nb = x.shape[0]
    d = f16_scale(symmetric_grid_fit(x, -16, 15, _Q5_0_MULTIPLIERS))[:, None]
    q = (np.clip(np.rint(x * safe_inverse(d)), -16, 15) + 16).astype(np.uint8)  # [nb, 32]
    qh = np.packbits(q >> 4, axis=1, bitorder="little")              # [nb, 4], bit j = value j
    out = np.empty((nb, 22), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:6] = qh
    out[:, 6:] = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    return out


def q5_0_as_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q5_0 blocks [nb, 22] u8 -> the same values as Q8_0 blocks [nb, 34] u8, exactly: d kept, the
    ints q - 16 in [-16, 15] (so a Q5_0 matrix can share one weight, and one launch, with Q8_0 ones)."""
    nb = blocks.shape[0]
    q = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little") << 4   # [nb, 32] bit 4 of each
    qs = blocks[:, 6:22]
    q[:, :16] |= qs & 15
    q[:, 16:] |= qs >> 4
    out = np.empty((nb, 34), np.uint8)
    out[:, :2] = blocks[:, :2]
    out[:, 2:] = (q.astype(np.int16) - 16).astype(np.int8).view(np.uint8)
    return out
