"""Random GGUF tensor bytes made directly in each type's block layout (no float quantizing).

`random_tensor_bytes(qtype, rows, n, rng)` -> u8 [rows * row_nbytes(qtype, n)]: every packed
quant field (nibbles, high bits, 6-bit sub-block scales, int8 values) is raw random bits;
only the f16 super-block scales are set, to small positive values (+-25% jitter per block)
chosen so the dequantized values have a standard deviation of about `std` (0.02 by
default) and mean about 0. That is what a weight-bandwidth benchmark needs, at the speed of
the random generator (about 1-2 GB/s per core), instead of a quantizer's scale search.

Per type (x = dequantized value, q = stored level, uniform over its range):
- Q8_0: x = d q, q int8.                   Q5_0: x = d (q - 16), q 0..31.
- Q4_K/Q5_K: x = d sc q - dmin m; the packed mins are made equal to the scales (m = sc) and
  dmin = d * (mid level), so each sub-block is centred: x = d sc (q - 7.5) (Q5_K: 15.5).
- Q6_K: x = d sc (q - 32), sc int8.        IQ4_XS: x = d (ls - 32) TABLE[i].
- F32/F16/BF16: uniform values in [-sqrt(3) std, sqrt(3) std].
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from luce.gguf.quants import block_info, row_nbytes
from luce.gguf.quants_iq import TABLE as IQ4_TABLE

TARGET_STD = 0.02


def _rms(levels) -> float:
    levels = np.asarray(levels, dtype=np.float64)
    return float(np.sqrt(np.mean(levels * levels)))


_RMS_INT8 = _rms(np.arange(-128, 128))
_RMS_SCALE6 = _rms(np.arange(64))            # Q4_K / Q5_K 6-bit sub-block scales
_RMS_SIGNED6 = _rms(np.arange(-32, 32))      # IQ4_XS (ls - 32), Q6_K (q - 32)
_RMS_Q4_CENTRED = _rms(np.arange(16) - 7.5)
_RMS_Q5_CENTRED = _rms(np.arange(32) - 15.5)
_RMS_Q5_0 = _rms(np.arange(32) - 16)
_RMS_IQ4_TABLE = _rms(IQ4_TABLE)

# qtype -> (byte offset of the f16 d, d that gives values of rms 1 at jitter 1)
_SCALE_AT = {
    Q.Q8_0: (0, 1.0 / _RMS_INT8),
    Q.Q5_0: (0, 1.0 / _RMS_Q5_0),
    Q.Q4_K: (0, 1.0 / (_RMS_SCALE6 * _RMS_Q4_CENTRED)),
    Q.Q5_K: (0, 1.0 / (_RMS_SCALE6 * _RMS_Q5_CENTRED)),
    Q.Q6_K: (208, 1.0 / (_RMS_INT8 * _RMS_SIGNED6)),
    Q.IQ4_XS: (0, 1.0 / (_RMS_SIGNED6 * _RMS_IQ4_TABLE)),
}
_K_MIN_LEVEL = {Q.Q4_K: 7.5, Q.Q5_K: 15.5}   # dmin = d * this centres every sub-block
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
SYNTHESIZED_TYPES = FLOAT_TYPES + tuple(_SCALE_AT)


def random_bits(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """u8 [nbytes] of raw generator output (the fastest numpy path: no range reduction)."""
    words = rng.bit_generator.random_raw((nbytes + 7) // 8)
    return words.view(np.uint8)[:nbytes]


def _uniform(rng: np.random.Generator, count: int, std: float) -> np.ndarray:
    """f32 [count] uniform in [-sqrt(3) std, sqrt(3) std) (standard deviation std)."""
    u = rng.bit_generator.random_raw((count + 1) // 2).view(np.uint32)[:count]
    x = (u >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24) - np.float32(0.5)
    return x * np.float32(2.0 * np.sqrt(3.0) * std)


def _set_f16(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    blocks[:, offset:offset + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _jitter(blocks: np.ndarray, offset: int) -> np.ndarray:
    """f32 [nb] in [0.75, 1.25] from the (random) byte at `offset`, read before it is overwritten."""
    return blocks[:, offset].astype(np.float32) * np.float32(0.5 / 255.0) + np.float32(0.75)


def _fix_quant_blocks(blocks: np.ndarray, qtype: Q, std: float) -> None:
    """Overwrite the scale fields of random blocks [nb, bytes] in place."""
    offset, unit = _SCALE_AT[qtype]
    d = (_jitter(blocks, offset) * np.float32(unit * std)).astype(np.float16)
    if qtype in _K_MIN_LEVEL:
        # scales[12] sit at bytes 4..15: bytes 8-11 (mins 0-3 and the top bits of mins 4-7)
        # copy bytes 4-7 (scales 0-3 and their top bits); in bytes 12-15 the mins' low nibble
        # copies the scales' low nibble. Then m == sc for all 8 sub-blocks.
        blocks[:, 8:12] = blocks[:, 4:8]
        blocks[:, 12:16] = (blocks[:, 12:16] & np.uint8(15)) * np.uint8(17)
        _set_f16(blocks, 2, d.astype(np.float32) * np.float32(_K_MIN_LEVEL[qtype]))
    _set_f16(blocks, offset, d)


def random_tensor_bytes(qtype, rows: int, n: int, rng: np.random.Generator,
                        std: float = TARGET_STD) -> np.ndarray:
    """u8 [rows * row_nbytes(qtype, n)]: `rows` rows of `n` values of GGML type `qtype`
    (one of SYNTHESIZED_TYPES), dequantizing to values of standard deviation about `std`."""
    qtype = Q(int(qtype))
    count = rows * n
    if qtype == Q.F32:
        return _uniform(rng, count, std).view(np.uint8)
    if qtype == Q.F16:
        return _uniform(rng, count, std).astype(np.float16).view(np.uint8)
    if qtype == Q.BF16:
        bits = _uniform(rng, count, std).view(np.uint32)
        return (bits >> np.uint32(16)).astype(np.uint16).view(np.uint8)
    if qtype not in _SCALE_AT:
        raise ValueError(f"no random block synthesis for {qtype.name}; types: "
                         f"{', '.join(t.name for t in SYNTHESIZED_TYPES)}")
    nbytes = rows * row_nbytes(qtype, n)
    _, block_bytes = block_info(qtype)
    raw = random_bits(rng, nbytes)
    _fix_quant_blocks(raw.reshape(-1, block_bytes), qtype, std)
    return raw
