"""Row and column copies of the CUDA backend (mixed into CudaBackend): split along the last
axis, concat_rows, take_rows / put_rows (a range of rows is one copy, other rows one gather
of cuda/gather.cu)."""
from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np

from luce.ops.cuda_array import CudaArray


class RowOps:
    """Mixin of CudaBackend (uses its empty / asarray / _dev / _f32 / memcpy / upload / mirrors /
    stream and the graph state _recording / _capturing)."""

    def _init_row_ops(self) -> None:
        self._row_indices: dict[int, tuple] = {}   # id(read-only rows) -> _row_index's (ref, max, first, n, ids)

    def split(self, x, sizes: Sequence[int]) -> list[CudaArray]:
        x = self._f32(x)
        if sum(sizes) != x.shape[-1]:
            raise ValueError(f"split sizes {list(sizes)} do not add up to the last axis {x.shape[-1]}")
        starts = np.cumsum([0, *sizes])
        return [self._columns(x, int(c), int(s)) for c, s in zip(starts, sizes)]

    def _columns(self, x: CudaArray, col: int, width: int) -> CudaArray:
        """x[..., col:col + width] as a new contiguous array (one gather launch)."""
        from luce import _cuda_gather as kg

        last = x.shape[-1]
        rows = x.size // max(last, 1)
        part = self.empty(x.shape[:-1] + (width,))
        if rows and width:
            kg.gather(x.ptr + 4 * col, part.ptr, 0, 0, rows, 4 * width, 4 * last, 4 * width, self.stream)
        return part

    def concat_rows(self, parts: Sequence) -> CudaArray:
        if not parts:
            raise ValueError("concat_rows needs at least one array")
        parts = [p if isinstance(p, CudaArray) else self.asarray(p) for p in parts]
        tail, dtype = parts[0].shape[1:], parts[0].dtype
        if any(p.shape[1:] != tail or p.dtype != dtype for p in parts):
            raise ValueError(f"concat_rows: parts {[(p.shape, str(p.dtype)) for p in parts]} differ past axis 0")
        out = self.empty((sum(p.shape[0] for p in parts),) + tail, dtype)
        offset = 0
        for p in parts:
            self.memcpy(out.ptr + offset, p.ptr, p.nbytes)
            offset += p.nbytes
        return out

    def take_rows(self, x, rows: np.ndarray, out: CudaArray | None = None) -> CudaArray:
        x = x if isinstance(x, CudaArray) else self.asarray(x)
        first, n, idx = self._row_index(rows, x.shape[0], "take_rows")
        shape = (n,) + x.shape[1:]
        if out is None:
            out = self.empty(shape, x.dtype)
        elif out.shape != shape or out.dtype != x.dtype:
            raise ValueError(f"take_rows: out {out.shape} {out.dtype} is not {shape} {x.dtype}")
        row_bytes = x.nbytes // max(x.shape[0], 1)
        if n == 0 or row_bytes == 0:
            return out
        if first is not None:   # a range: one copy
            self.memcpy(out.ptr, x.ptr + first * row_bytes, n * row_bytes)
            return out
        from luce import _cuda_gather as kg

        idx = idx if idx is not None else self._dev(rows, np.int64)
        kg.gather(x.ptr, out.ptr, idx.ptr, 0, n, row_bytes, row_bytes, row_bytes, self.stream)
        return out

    def put_rows(self, dst, rows: np.ndarray, src) -> None:
        src = src if isinstance(src, CudaArray) else self.asarray(src)
        first, n, idx = self._row_index(rows, dst.shape[0], "put_rows")
        if src.shape != (n,) + tuple(dst.shape[1:]) or src.dtype != dst.dtype:
            raise ValueError(f"put_rows: src {src.shape} {src.dtype} is not {n} rows of dst {dst.shape} {dst.dtype}")
        row_bytes = dst.nbytes // max(dst.shape[0], 1)
        if n == 0 or row_bytes == 0:
            return
        if first is not None:
            self.memcpy(dst.ptr + first * row_bytes, src.ptr, n * row_bytes)
            return
        from luce import _cuda_gather as kg

        idx = idx if idx is not None else self._dev(rows, np.int64)
        kg.gather(src.ptr, dst.ptr, 0, idx.ptr, n, row_bytes, row_bytes, row_bytes, self.stream)

    def _row_index(self, rows, limit: int, op: str) -> tuple[int | None, int, CudaArray | None]:
        """(first, n, device ids) of host row ids `rows` in [0, limit): `first` when they are
        one ascending range not mirrored in a step arena (a copy does), else None, with their
        device copy when one is kept (else the caller's _dev finds or uploads it). A read-only
        `rows` (ids a caller keeps: RecurrentState's checkpoint rows) keeps its index here,
        so calls after the first check and upload nothing, outside recording and capture
        (whose uploads must go through the graph's constants)."""
        fixed = isinstance(rows, np.ndarray) and not rows.flags.writeable and self._recording is None \
            and self._capturing is None
        if fixed:
            entry = self._row_indices.get(id(rows))
            if entry is not None and entry[0]() is rows:
                _, hi, first, n, idx = entry
                if hi >= limit:
                    raise IndexError(f"{op}: row ids up to {hi} outside [0, {limit})")
                return first, n, idx
        mirrored = self.mirrors.find(rows)
        ids = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = int(ids.size)
        lo, hi = (int(ids.min()), int(ids.max())) if n else (0, -1)
        if lo < 0 or hi >= limit:
            raise IndexError(f"{op}: row ids {lo}..{hi} outside [0, {limit})")
        if mirrored is not None:   # step rows (logits): the arena's copy, the same launch every step
            return None, n, mirrored if mirrored.dtype == np.int64 else None
        first = lo if n and hi - lo + 1 == n and bool((np.diff(ids) == 1).all()) else None
        idx = None
        if fixed:
            idx = self.upload(ids) if first is None and n else None
            if len(self._row_indices) >= 64:
                self._row_indices = {k: v for k, v in self._row_indices.items() if v[0]() is not None}
            self._row_indices[id(rows)] = (weakref.ref(rows), hi, first, n, idx)
        return first, n, idx
