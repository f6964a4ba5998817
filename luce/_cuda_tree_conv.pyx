# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the conv1d tree kernels (cuda/tree_conv.cu; ABI in cuda/luce_ops.h): each
tree node convolved over its root path, and the conv state gathered along a committed path.
Raw device addresses in, KernelError out."""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_conv_tree_params:
        const float *x
        const float *weight
        float *y
        const float *state
        const int32_t *qo_indptr
        const int32_t *seq_slots
        const int32_t *tree_parents
        int64_t n_segments
        int64_t channels
        int64_t x_stride
        int64_t y_stride
        int32_t kernel_size
        int32_t max_segment_rows
        int32_t silu
    ctypedef struct luce_conv_tree_commit_params:
        const float *x
        const float *state_in
        float *state_out
        const int32_t *path_indptr
        const int32_t *path_rows
        const int32_t *in_slots
        const int32_t *out_slots
        int64_t n_segments
        int64_t channels
        int64_t x_stride
        int32_t kernel_size


ctypedef int (*conv_tree_fn)(const luce_conv_tree_params *, void *) noexcept nogil
ctypedef int (*commit_fn)(const luce_conv_tree_commit_params *, void *) noexcept nogil

cdef conv_tree_fn _conv_tree = NULL
cdef commit_fn _commit = NULL


def load(str path):
    """Resolve the conv tree entry points in the kernel library at `path`."""
    global _conv_tree, _commit
    cdef void *lib = _open_library(path)
    _commit = <commit_fn>_symbol(lib, path, "luce_conv_tree_commit")
    _conv_tree = <conv_tree_fn>_symbol(lib, path, "luce_conv_tree")


def conv_tree(uintptr_t x, uintptr_t weight, uintptr_t y, uintptr_t state, uintptr_t qo_indptr,
              uintptr_t seq_slots, uintptr_t tree_parents, int64_t n_segments, int64_t channels,
              int kernel_size, int max_segment_rows, bint silu=True, x_stride=None, y_stride=None,
              uintptr_t stream=0):
    """x, y [T, C] f32 (row strides default C); weight [C, K] f32; state pool [n_slots, K-1, C]
    f32 (read only); qo_indptr [S+1], seq_slots [S] (-1: padding), tree_parents [T] int32
    (global parent rows, -1: root). max_segment_rows >= every segment's row count."""
    _require_loaded(<void *>_conv_tree)
    cdef luce_conv_tree_params p
    p.x = <const float *>x
    p.weight = <const float *>weight
    p.y = <float *>y
    p.state = <const float *>state
    p.qo_indptr = <const int32_t *>qo_indptr
    p.seq_slots = <const int32_t *>seq_slots
    p.tree_parents = <const int32_t *>tree_parents
    p.n_segments = n_segments
    p.channels = channels
    p.x_stride = channels if x_stride is None else x_stride
    p.y_stride = channels if y_stride is None else y_stride
    p.kernel_size = kernel_size
    p.max_segment_rows = max_segment_rows
    p.silu = 1 if silu else 0
    cdef int status
    with nogil:
        status = _conv_tree(&p, <void *>stream)
    raise_for_status(status, "luce_conv_tree")


def conv_tree_commit(uintptr_t x, uintptr_t state_in, uintptr_t state_out, uintptr_t path_indptr,
                     uintptr_t path_rows, uintptr_t in_slots, uintptr_t out_slots, int64_t n_segments,
                     int64_t channels, int kernel_size, x_stride=None, uintptr_t stream=0):
    """state_out[out_slots[s]] = last K-1 rows of concat(state_in[in_slots[s]], x[path rows])
    with path rows path_rows[path_indptr[s]:path_indptr[s+1]] (int32 global rows of x [T, C],
    root first). state_out may be state_in."""
    _require_loaded(<void *>_conv_tree)
    cdef luce_conv_tree_commit_params p
    p.x = <const float *>x
    p.state_in = <const float *>state_in
    p.state_out = <float *>state_out
    p.path_indptr = <const int32_t *>path_indptr
    p.path_rows = <const int32_t *>path_rows
    p.in_slots = <const int32_t *>in_slots
    p.out_slots = <const int32_t *>out_slots
    p.n_segments = n_segments
    p.channels = channels
    p.x_stride = channels if x_stride is None else x_stride
    p.kernel_size = kernel_size
    cdef int status
    with nogil:
        status = _commit(&p, <void *>stream)
    raise_for_status(status, "luce_conv_tree_commit")
