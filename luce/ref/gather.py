"""Row gather/scatter copy reference (kernel: cuda/gather.cu): what KV, recurrent-state and
feature commit and slot snapshots do with device rows."""
from __future__ import annotations

import numpy as np


def gather_rows(src: np.ndarray, dst: np.ndarray, src_rows: np.ndarray | None,
                dst_rows: np.ndarray | None, n: int | None = None) -> np.ndarray:
    """src [Ns, ...], dst [Nd, ...] with one row shape and dtype -> a copy of dst where, for
    each copy i in [0, n), dst[dst_rows[i]] = src[src_rows[i]]. A None index array means
    row i; a negative index on either side skips copy i (padding). n defaults to the index
    arrays' length."""
    if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
        raise ValueError(f"gather_rows: src {src.shape} {src.dtype} and dst {dst.shape} "
                         f"{dst.dtype} need one row shape and dtype")
    if n is None:
        given = [a for a in (src_rows, dst_rows) if a is not None]
        if not given:
            raise ValueError("gather_rows: give n when both index arrays are None")
        n = len(given[0])
    s = np.arange(n) if src_rows is None else np.asarray(src_rows, dtype=np.int64)[:n]
    d = np.arange(n) if dst_rows is None else np.asarray(dst_rows, dtype=np.int64)[:n]
    keep = (s >= 0) & (d >= 0)
    if np.any(s[keep] >= len(src)) or np.any(d[keep] >= len(dst)):
        raise IndexError(f"gather_rows: an index is out of range (src {len(src)}, dst {len(dst)} rows)")
    out = dst.copy()
    out[d[keep]] = src[s[keep]]
    return out
