# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the row gather/scatter copy (cuda/gather.cu, cuda/luce_ops.h) used by
KV, recurrent-state and feature commit and slot snapshots. Raw device addresses in."""
from libc.stdint cimport int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_gather_params:
        const void *src
        void *dst
        const int64_t *src_rows
        const int64_t *dst_rows
        int64_t n
        int64_t row_bytes
        int64_t src_stride
        int64_t dst_stride


ctypedef int (*gather_fn)(const luce_gather_params *, void *) noexcept nogil

cdef gather_fn _gather = NULL


def load(str path):
    """Resolve luce_gather in the kernel library at `path`."""
    global _gather
    _gather = <gather_fn>_symbol(_open_library(path), path, "luce_gather")


def gather(uintptr_t src, uintptr_t dst, uintptr_t src_rows, uintptr_t dst_rows, int64_t n,
           int64_t row_bytes, int64_t src_stride, int64_t dst_stride, uintptr_t stream=0):
    """Copy i (of n) moves row_bytes from src + src_rows[i] * src_stride to
    dst + dst_rows[i] * dst_stride. src_rows / dst_rows: int64 device arrays, or 0 for row i;
    a negative index skips the copy."""
    _require_loaded(<void *>_gather)
    cdef luce_gather_params p
    p.src = <const void *>src
    p.dst = <void *>dst
    p.src_rows = <const int64_t *>src_rows
    p.dst_rows = <const int64_t *>dst_rows
    p.n = n
    p.row_bytes = row_bytes
    p.src_stride = src_stride
    p.dst_stride = dst_stride
    cdef int status
    with nogil:
        status = _gather(&p, <void *>stream)
    raise_for_status(status, "luce_gather")
