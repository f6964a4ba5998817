# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the pointwise family (cuda/pointwise.cu; ABI in cuda/luce_ops.h):
broadcast add/mul, unary silu/sigmoid/softplus/exp, row l2norm. Raw device addresses in,
luce._cuda.KernelError out."""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    enum: LUCE_POINTWISE_MAX_DIMS
    ctypedef struct luce_binary_params:
        const float *a
        const float *b
        float *out
        int64_t shape[4]
        int64_t a_strides[4]
        int64_t b_strides[4]
        float b_scalar
        int32_t op

    ctypedef struct luce_unary_params:
        const float *x
        float *out
        int64_t n
        int32_t op

    ctypedef struct luce_l2norm_params:
        const float *x
        float *out
        int64_t rows
        int64_t cols
        float eps


ctypedef int (*binary_fn)(const luce_binary_params *, void *) noexcept nogil
ctypedef int (*unary_fn)(const luce_unary_params *, void *) noexcept nogil
ctypedef int (*l2norm_fn)(const luce_l2norm_params *, void *) noexcept nogil

cdef binary_fn _binary = NULL
cdef unary_fn _unary = NULL
cdef l2norm_fn _l2norm = NULL

MAX_DIMS = LUCE_POINTWISE_MAX_DIMS
BINARY_OPS = {"add": 0, "mul": 1, "mul_sigmoid": 2}
UNARY_OPS = {"silu": 0, "sigmoid": 1, "softplus": 2, "exp": 3}


def load(str path):
    """Resolve luce_binary, luce_unary and luce_l2norm in the kernel library at `path`."""
    global _binary, _unary, _l2norm
    cdef void *lib = _open_library(path)
    _unary = <unary_fn>_symbol(lib, path, "luce_unary")
    _l2norm = <l2norm_fn>_symbol(lib, path, "luce_l2norm")
    _binary = <binary_fn>_symbol(lib, path, "luce_binary")


def binary(str op, uintptr_t a, uintptr_t b, uintptr_t out, shape, a_strides, b_strides,
           float b_scalar=0.0, uintptr_t stream=0):
    """out [shape] f32 = a op b ('add' | 'mul' | 'mul_sigmoid': a * sigmoid(b)); shape, a_strides,
    b_strides: MAX_DIMS ints (element strides, 0 on broadcast dims); b == 0 uses b_scalar."""
    _require_loaded(<void *>_binary)
    if len(shape) != MAX_DIMS or len(a_strides) != MAX_DIMS or len(b_strides) != MAX_DIMS:
        raise ValueError(f"binary: shape and strides need {MAX_DIMS} entries")
    cdef luce_binary_params p
    p.a = <const float *>a
    p.b = <const float *>b
    p.out = <float *>out
    for d in range(MAX_DIMS):
        p.shape[d] = shape[d]
        p.a_strides[d] = a_strides[d]
        p.b_strides[d] = b_strides[d]
    p.b_scalar = b_scalar
    p.op = BINARY_OPS[op]
    cdef int status
    with nogil:
        status = _binary(&p, <void *>stream)
    raise_for_status(status, "luce_binary")


def unary(str op, uintptr_t x, uintptr_t out, int64_t n, uintptr_t stream=0):
    """out [n] f32 = op(x) ('silu' | 'sigmoid' | 'softplus' | 'exp'), in double."""
    _require_loaded(<void *>_binary)
    cdef luce_unary_params p
    p.x = <const float *>x
    p.out = <float *>out
    p.n = n
    p.op = UNARY_OPS[op]
    cdef int status
    with nogil:
        status = _unary(&p, <void *>stream)
    raise_for_status(status, "luce_unary")


def l2norm(uintptr_t x, uintptr_t out, int64_t rows, int64_t cols, float eps, uintptr_t stream=0):
    """x, out [rows, cols] f32: out = x / sqrt(sum(x^2) + eps) per row."""
    _require_loaded(<void *>_binary)
    cdef luce_l2norm_params p
    p.x = <const float *>x
    p.out = <float *>out
    p.rows = rows
    p.cols = cols
    p.eps = eps
    cdef int status
    with nogil:
        status = _l2norm(&p, <void *>stream)
    raise_for_status(status, "luce_l2norm")
