# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the small row-wise kernel families (cuda/luce_ops.h): gated RMSNorm,
rotary, SwiGLU (plain rmsnorm is in luce._cuda).

Each wrapper takes raw device addresses (uintptr_t) and sizes, fills the family's params
struct, calls the entry point with the GIL released and raises luce._cuda.KernelError on a
non-zero status. `load(path)` resolves the entry points (luce.ops.native.load_kernels()).
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_gated_rmsnorm_params:
        const float *x
        const float *z
        const float *weight
        float *out
        int64_t rows
        int64_t cols
        float eps

    ctypedef struct luce_rotary_params:
        const float *x
        float *out
        const int32_t *positions
        int64_t rows
        int64_t x_row_stride
        int64_t x_head_stride
        int64_t out_row_stride
        int64_t out_head_stride
        int32_t heads
        int32_t head_dim
        int32_t rope_dim
        int32_t n_pos
        int32_t sections[4]
        float theta

    ctypedef struct luce_swiglu_params:
        const float *gate
        const float *up
        float *out
        int64_t rows
        int64_t cols
        int64_t gate_stride
        int64_t up_stride
        int64_t out_stride


ctypedef int (*gated_rmsnorm_fn)(const luce_gated_rmsnorm_params *, void *) noexcept nogil
ctypedef int (*rotary_fn)(const luce_rotary_params *, void *) noexcept nogil
ctypedef int (*swiglu_fn)(const luce_swiglu_params *, void *) noexcept nogil

cdef gated_rmsnorm_fn _gated_rmsnorm = NULL
cdef rotary_fn _rotary = NULL
cdef swiglu_fn _swiglu = NULL


def load(str path):
    """Resolve this module's entry points in the kernel library at `path`."""
    global _gated_rmsnorm, _rotary, _swiglu
    cdef void *lib = _open_library(path)
    _gated_rmsnorm = <gated_rmsnorm_fn>_symbol(lib, path, "luce_gated_rmsnorm")
    _rotary = <rotary_fn>_symbol(lib, path, "luce_rotary")
    _swiglu = <swiglu_fn>_symbol(lib, path, "luce_swiglu")


def gated_rmsnorm(uintptr_t x, uintptr_t z, uintptr_t weight, uintptr_t out, int64_t rows,
                  int64_t cols, float eps, uintptr_t stream=0):
    """x, z, out [rows, cols] f32; weight [cols] f32. out = rmsnorm(x) * weight * silu(z)."""
    _require_loaded(<void *>_gated_rmsnorm)
    cdef luce_gated_rmsnorm_params p
    p.x = <const float *>x
    p.z = <const float *>z
    p.weight = <const float *>weight
    p.out = <float *>out
    p.rows = rows
    p.cols = cols
    p.eps = eps
    cdef int status
    with nogil:
        status = _gated_rmsnorm(&p, <void *>stream)
    raise_for_status(status, "luce_gated_rmsnorm")


def rotary(uintptr_t x, uintptr_t out, uintptr_t positions, int64_t rows, int heads,
           int head_dim, int rope_dim, float theta, sections=(), int n_pos=1,
           x_row_stride=None, x_head_stride=None, out_row_stride=None, out_head_stride=None,
           uintptr_t stream=0):
    """x, out [rows, heads, head_dim] f32 (element strides default to contiguous);
    positions int32 [rows] (n_pos=1) or [rows, 4] (n_pos=4); sections: () or 4 sizes."""
    _require_loaded(<void *>_rotary)
    secs = tuple(int(s) for s in sections) or (0, 0, 0, 0)
    if len(secs) != 4:
        raise ValueError(f"rotary: sections must be () or 4 sizes, got {sections}")
    cdef luce_rotary_params p
    p.x = <const float *>x
    p.out = <float *>out
    p.positions = <const int32_t *>positions
    p.rows = rows
    p.heads = heads
    p.head_dim = head_dim
    p.rope_dim = rope_dim
    p.n_pos = n_pos
    p.theta = theta
    p.x_head_stride = head_dim if x_head_stride is None else x_head_stride
    p.x_row_stride = heads * p.x_head_stride if x_row_stride is None else x_row_stride
    p.out_head_stride = head_dim if out_head_stride is None else out_head_stride
    p.out_row_stride = heads * p.out_head_stride if out_row_stride is None else out_row_stride
    for i in range(4):
        p.sections[i] = secs[i]
    cdef int status
    with nogil:
        status = _rotary(&p, <void *>stream)
    raise_for_status(status, "luce_rotary")


def swiglu(uintptr_t gate, uintptr_t up, uintptr_t out, int64_t rows, int64_t cols,
           gate_stride=None, up_stride=None, out_stride=None, uintptr_t stream=0):
    """gate, up, out [rows, cols] f32 (row strides in elements, default cols).
    out = silu(gate) * up."""
    _require_loaded(<void *>_swiglu)
    cdef luce_swiglu_params p
    p.gate = <const float *>gate
    p.up = <const float *>up
    p.out = <float *>out
    p.rows = rows
    p.cols = cols
    p.gate_stride = cols if gate_stride is None else gate_stride
    p.up_stride = cols if up_stride is None else up_stride
    p.out_stride = cols if out_stride is None else out_stride
    cdef int status
    with nogil:
        status = _swiglu(&p, <void *>stream)
    raise_for_status(status, "luce_swiglu")
