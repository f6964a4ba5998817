"""GGUF tensor codecs in numpy: dequantize file bytes to float32, quantize float32 to bytes.

Supported: F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q5_K, Q6_K, IQ4_XS. Dequantization is
bit-identical to ggml (and to `gguf.quants.dequantize`); quantization uses small per-group
scale searches (see docs/QUANTS.md for the error each type reaches).

Conventions: a tensor with numpy shape [..., n] stores rows of n values (n = ggml ne0, the
contiguous axis), each row a whole number of blocks; bytes are in row-major order.

    raw = memmap[offset:offset + nbytes]            # u8
    w = dequantize(raw, Q.Q4_K, (rows, n))          # f32 [rows, n]
    back = quantize(w, Q.Q4_K)                      # u8 [rows, row_nbytes(Q.Q4_K, n)]
"""
from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as Q

from . import quants_iq, quants_k, quants_legacy

SUPPORTED = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS)

# qtype -> (values per block, bytes per block, dequantize(blocks, out), quantize(x) -> blocks)
_CODECS = {
    Q.F32: (1, 4, quants_legacy.dequantize_f32, quants_legacy.quantize_f32),
    Q.F16: (1, 2, quants_legacy.dequantize_f16, quants_legacy.quantize_f16),
    Q.BF16: (1, 2, quants_legacy.dequantize_bf16, quants_legacy.quantize_bf16),
    Q.Q8_0: (32, 34, quants_legacy.dequantize_q8_0, quants_legacy.quantize_q8_0),
    Q.Q5_0: (32, 22, quants_legacy.dequantize_q5_0, quants_legacy.quantize_q5_0),
    Q.Q4_K: (256, 144, quants_k.dequantize_q4_k, quants_k.quantize_q4_k),
    Q.Q5_K: (256, 176, quants_k.dequantize_q5_k, quants_k.quantize_q5_k),
    Q.Q6_K: (256, 210, quants_k.dequantize_q6_k, quants_k.quantize_q6_k),
    Q.IQ4_XS: (256, 136, quants_iq.dequantize_iq4_xs, quants_iq.quantize_iq4_xs),
}

# Values per chunk: bounds the temporaries (a few times this many bytes) and keeps them in
# cache. Quantizers keep [values x candidates] arrays, hence the smaller chunk.
DEQUANTIZE_CHUNK_VALUES = 1 << 18
QUANTIZE_CHUNK_VALUES = 1 << 14


class QuantError(ValueError):
    """Unsupported quant type, or a length that is not a whole number of blocks."""


def _codec(qtype):
    try:
        qt = Q(int(qtype))
    except (TypeError, ValueError):
        qt = None
    if qt not in _CODECS:
        name = qt.name if qt is not None else repr(qtype)
        raise QuantError(
            f"quant type {name} is not supported by luce.gguf.quants; supported: "
            f"{', '.join(t.name for t in SUPPORTED)}. Re-quantize the model to one of these "
            f"(e.g. llama-quantize ... Q4_K_M)")
    return qt, _CODECS[qt]


def qtype_name(qtype: int) -> str:
    """A ggml type's name for messages (its number where gguf does not know it)."""
    try:
        return Q(int(qtype)).name
    except ValueError:
        return f"ggml type {qtype}"


def block_info(qtype) -> tuple[int, int]:
    """(values per block, bytes per block) of `qtype`."""
    _, (values, nbytes, _, _) = _codec(qtype)
    return values, nbytes


def row_nbytes(qtype, n_values: int) -> int:
    """Bytes of one row of n_values; raises QuantError (a ValueError) if not whole blocks."""
    qt, (values, nbytes, _, _) = _codec(qtype)
    if n_values < 0 or n_values % values:
        raise QuantError(
            f"{qt.name} stores rows of whole {values}-value blocks; a row of {n_values} values "
            f"is not a multiple of {values}: pad the row or pick a type with a smaller block")
    return n_values // values * nbytes


def dequantize(raw: np.ndarray, qtype, shape: tuple[int, ...]) -> np.ndarray:
    """Decode `raw` (u8 bytes, any shape, e.g. a memmap slice) to f32 [shape].

    The bytes hold prod(shape) values row-major, rows along the last axis.
    """
    qt, (values, nbytes, decode, _) = _codec(qtype)
    shape = tuple(int(s) for s in shape)
    n_rows = math.prod(shape[:-1])
    expected = n_rows * row_nbytes(qt, shape[-1] if shape else 1)
    raw = np.asarray(raw)
    if raw.nbytes != expected:
        raise QuantError(
            f"{qt.name} tensor of shape {shape} needs {expected} bytes, got {raw.nbytes}: "
            f"check the tensor's offset, size and shape in the file")
    out = np.empty(shape, np.float32)
    if expected == 0:
        return out
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, nbytes)
    flat = out.reshape(-1, values)
    step = max(1, DEQUANTIZE_CHUNK_VALUES // values)
    with np.errstate(invalid="ignore", over="ignore"):   # inf/NaN scales decode as ggml does
        for start in range(0, blocks.shape[0], step):
            decode(blocks[start:start + step], flat[start:start + step])
    return out


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """Encode f32 [..., n] (n a multiple of the block size) to u8 [..., row_nbytes(qtype, n)]."""
    qt, (values, nbytes, _, encode) = _codec(qtype)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise QuantError("quantize needs an array [..., n], got a scalar: reshape it to [1]")
    out = np.empty(x.shape[:-1] + (row_nbytes(qt, x.shape[-1]),), np.uint8)
    if out.size == 0:
        return out
    blocks = np.ascontiguousarray(x).reshape(-1, values)
    flat = out.reshape(-1, nbytes)
    step = max(1, QUANTIZE_CHUNK_VALUES // values)
    for start in range(0, blocks.shape[0], step):
        flat[start:start + step] = encode(blocks[start:start + step])
    return flat.reshape(out.shape)
