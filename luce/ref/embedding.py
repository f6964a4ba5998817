"""Embedding rows of a quantized table (kernel: cuda/embedding.cu): the host decode of
luce.gguf.quants applied to the looked-up rows only."""
from __future__ import annotations

import numpy as np

from luce.gguf import quants


def embedding_rows(table_bytes: np.ndarray, qtype, cols: int, token_ids: np.ndarray) -> np.ndarray:
    """table_bytes [n_rows, row_bytes] u8 (GGUF blocks of qtype, rows of cols values),
    token_ids [T] int -> [T, cols] f32, bitwise luce.gguf.quants.dequantize of those rows."""
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= table_bytes.shape[0]):
        raise IndexError(f"token id out of range [0, {table_bytes.shape[0]}): {ids.min()}..{ids.max()}")
    rows = np.ascontiguousarray(table_bytes[ids])
    return quants.dequantize(rows, qtype, (len(ids), int(cols)))
