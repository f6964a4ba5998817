"""The cpu backend: luce.ops.api.Backend on host numpy arrays with C kernels (luce/cpu/,
launched by luce._cpu) for every op whose result a test compares bitwise.

Weights stay as the GGUF blocks in the memory-mapped file (`CpuWeight`): no f32 copy. The
matmul quantizes activations per block to int8 (as llama.cpp does) and reduces every output
in an order fixed by K alone (luce/cpu/blocks.h), so a row's result is bitwise the same
whatever the row count, the row's position, the thread count and the instruction set (AVX2,
AVX-512 or portable C). Threads split outputs, never a reduction. Ops not overridden here
are the numpy backend's (luce/ref), none of which calls BLAS.
"""
from __future__ import annotations

import mmap
import os
import numpy as np

from luce._cpu import CpuWeight  # noqa: F401  (a matrix in GGUF blocks: raw [n, row_bytes], qtype, n, k)
from luce.gguf.quants import qtype_name
from luce.ops.cpu_sequence_ops import CpuSequenceOps
from luce.ops.numpy_backend import NumpyBackend


def default_threads() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not Linux
        return max(1, os.cpu_count() or 1)


def _maps_a_file(a: np.ndarray) -> bool:
    """True if a is a view of a memory-mapped file (np.memmap / mmap.mmap of a file)."""
    while a is not None:
        if isinstance(a, np.memmap) or isinstance(a, mmap.mmap):
            return True
        a = getattr(a, "base", None)
    return False


class CpuBackend(CpuSequenceOps, NumpyBackend):
    """luce.ops.api.Backend on the CPU; Array = np.ndarray f32, Weight = CpuWeight."""

    name = "cpu"

    def __init__(self, threads: int | None = None, isa: str | None = None):
        """threads: parallel kernel threads (default: the cores this process may use);
        isa: 'avx512', 'avx2' or 'portable' (default: the best this CPU runs)."""
        from luce import _cpu
        from luce.ops.blas_threads import limit_blas_threads

        limit_blas_threads(1)
        self._k = _cpu
        self.threads = default_threads() if threads is None else int(threads)
        if self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        _cpu.set_threads(self.threads)
        self.isa = _cpu.set_isa(isa or os.environ.get("LUCE_CPU_ISA", "avx512"))
        # Q4_K / Q6_K / Q5_0 / Q8_0 weights also held column-interleaved (luce/cpu/packed.h) for the
        # AVX-512 and AVX2 paths: bitwise the same products, no horizontal sums (LUCE_CPU_PACK=0: off)
        self.pack_weights = self.isa in ("avx512", "avx2") and os.environ.get("LUCE_CPU_PACK", "1") != "0"

    def describe(self) -> str:
        return f"cpu ({self.isa}, {self.threads} threads)"

    # ---- weights ------------------------------------------------------------------------
    def load_weight(self, gguf, name: str) -> CpuWeight:
        info = gguf.tensor_info(name)
        shape = tuple(int(s) for s in info.shape)
        if len(shape) != 2:
            raise ValueError(f"{name}: a Weight is a matrix [N, K], the tensor has shape {shape}")
        qtype = int(info.qtype)
        if qtype not in self._k.QTYPES.values():
            raise ValueError(
                f"{name}: weights of type {qtype_name(qtype)} are not supported by the cpu backend; "
                f"supported: {', '.join(sorted(self._k.QTYPES))}. Re-quantize the model to one of these "
                "(e.g. llama-quantize model.gguf out.gguf Q4_K_M), or use --backend numpy")
        w = self._weight(np.asarray(gguf.raw(name)), qtype, shape, name)
        # an untied embedding table is only read by rows (embedding), never multiplied
        rows_only = name == "token_embd.weight" and "output.weight" in getattr(gguf, "tensors", ())
        return self.packed(w, file_backed=True) if self.pack_weights and not rows_only else w

    def packed(self, w: CpuWeight, file_backed: bool = False) -> CpuWeight:
        """w with its packed copy (luce/cpu/packed.h), or w if its type or shape has none.
        file_backed: w.raw maps the GGUF file; its pages are let go once packed."""
        packed = self._k.pack(w)
        if packed is None:
            return w
        if file_backed and _maps_a_file(w.raw):
            self._k.release_file_pages(w.raw)
        return CpuWeight(w.raw, w.qtype, w.n, w.k, w.row_bytes, packed)

    def weight_from_array(self, w: np.ndarray) -> CpuWeight:
        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.ndim != 2:
            raise ValueError(f"a Weight is a matrix [N, K], got shape {w.shape}")
        return self._weight(w.view(np.uint8).reshape(-1), 0, w.shape, "array")

    def weight_rows(self, w: CpuWeight, n: int) -> CpuWeight:
        if not 1 <= n <= w.n:
            raise ValueError(f"weight_rows: need 1 <= n <= {w.n}, got {n}")
        packed = None
        if w.packed is not None and n % 16 == 0:   # whole 16-column groups: a prefix of the packed bytes
            packed = w.packed[:self._k.packed_bytes(w.qtype, n, w.k)]
        return CpuWeight(w.raw[:n], w.qtype, n, w.k, w.row_bytes, packed)

    def _weight(self, raw: np.ndarray, qtype: int, shape, name: str) -> CpuWeight:
        n, k = shape
        try:
            row_bytes = self._k.row_bytes(qtype, k)
        except ValueError:
            raise ValueError(f"{name}: a {qtype_name(qtype)} matrix {tuple(shape)} does not hold whole "
                             "blocks per row; re-quantize the model") from None
        raw = raw.reshape(-1).view(np.uint8)
        if raw.nbytes != n * row_bytes:
            raise ValueError(f"{name}: {raw.nbytes} bytes for a {qtype_name(qtype)} matrix {tuple(shape)} "
                             f"that needs {n * row_bytes}: the file is truncated or corrupt")
        return CpuWeight(raw.reshape(n, row_bytes), qtype, n, k, row_bytes)

    # ---- dense maths --------------------------------------------------------------------
    def as_weight(self, w) -> CpuWeight:
        """w itself, or an f32 matrix [N, K] (the numpy backend's Weight) wrapped without a copy."""
        if isinstance(w, CpuWeight):
            return w
        if isinstance(w, np.ndarray) and w.ndim == 2:
            return self.weight_from_array(w)
        raise TypeError(f"the cpu backend multiplies CpuWeight (load_weight / weight_from_array) or an "
                        f"f32 matrix, got {type(w).__name__}")

    def embedding(self, table, token_ids: np.ndarray) -> np.ndarray:
        """Rows of the table decoded in C (bitwise luce.gguf.quants.dequantize, ggml's decode)."""
        table = self.as_weight(table)
        ids = np.ascontiguousarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= table.n):
            raise IndexError(f"token id out of range [0, {table.n}): {ids.min()}..{ids.max()}")
        out = np.empty((ids.size, table.k), np.float32)
        self._k.dequantize_rows(table, ids, out)
        return out

    def matmul(self, x, w: CpuWeight, bias=None, prefill_spans=()) -> np.ndarray:
        return self.matmuls(x, [w], [bias])[0]

    def matmuls(self, x, weights, biases=None, prefill_spans=()) -> list[np.ndarray]:  # every row alike
        if type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            raise ValueError(f"matmul wants x [T, K], got {x.shape}")
        weights = [w if type(w) is CpuWeight else self.as_weight(w) for w in weights]
        biases = [None] * len(weights) if biases is None else \
            [b if b is None or (type(b) is np.ndarray and b.dtype == np.float32) else np.ascontiguousarray(b, np.float32)
             for b in biases]
        outs = [np.empty((x.shape[0], w.n), np.float32) for w in weights]
        self._k.matmuls(x, weights, biases, outs)
        return outs
