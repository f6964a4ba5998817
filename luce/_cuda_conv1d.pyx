# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the causal conv1d family (cuda/conv1d.cu, cuda/luce_ops.h): the Gated
DeltaNet input mixer with per-slot carried state. Raw device addresses in, KernelError out."""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_conv1d_params:
        const float *x
        const float *weight
        float *y
        const float *state_in
        float *state_out
        const int32_t *qo_indptr
        const int32_t *in_slots
        const int32_t *out_slots
        int64_t n_segments
        int64_t channels
        int64_t x_stride
        int64_t y_stride
        int32_t kernel_size
        int32_t max_segment_rows
        int32_t silu


ctypedef int (*conv1d_fn)(const luce_conv1d_params *, void *) noexcept nogil

cdef conv1d_fn _conv1d = NULL


def load(str path):
    """Resolve luce_conv1d in the kernel library at `path`."""
    global _conv1d
    _conv1d = <conv1d_fn>_symbol(_open_library(path), path, "luce_conv1d")


def conv1d(uintptr_t x, uintptr_t weight, uintptr_t y, uintptr_t state_in, uintptr_t state_out,
           uintptr_t qo_indptr, uintptr_t in_slots, uintptr_t out_slots, int64_t n_segments,
           int64_t channels, int kernel_size, int max_segment_rows, bint silu=True,
           x_stride=None, y_stride=None, uintptr_t stream=0):
    """x, y [T, C] f32 (row strides default C); weight [C, K] f32; state pools
    [n_slots, K-1, C] f32; qo_indptr int32 [S+1]; in_slots, out_slots int32 [S] (-1: padding).
    max_segment_rows >= every segment's row count."""
    _require_loaded(<void *>_conv1d)
    cdef luce_conv1d_params p
    p.x = <const float *>x
    p.weight = <const float *>weight
    p.y = <float *>y
    p.state_in = <const float *>state_in
    p.state_out = <float *>state_out
    p.qo_indptr = <const int32_t *>qo_indptr
    p.in_slots = <const int32_t *>in_slots
    p.out_slots = <const int32_t *>out_slots
    p.n_segments = n_segments
    p.channels = channels
    p.x_stride = channels if x_stride is None else x_stride
    p.y_stride = channels if y_stride is None else y_stride
    p.kernel_size = kernel_size
    p.max_segment_rows = max_segment_rows
    p.silu = 1 if silu else 0
    cdef int status
    with nogil:
        status = _conv1d(&p, <void *>stream)
    raise_for_status(status, "luce_conv1d")
