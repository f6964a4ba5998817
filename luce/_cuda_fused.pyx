# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the fused kernels: the producers of a quantized matmul's input
(cuda/norm_quant.cu) and the attention input of a step (cuda/rope_kv.cu); ABI in
cuda/luce_ops.h, sections norm_quant and rope_kv; references in luce/ref/norm_quant.py and rope_kv.py.

Wrappers take raw device addresses (uintptr_t) and sizes, fill the params struct, call the
entry point with the GIL released and raise luce._cuda.KernelError on a non-zero status.
A workspace of luce._cuda_matmul.workspace_bytes(rows, cols) bytes receives `out` quantized
for luce._cuda_matmul.matmul(..., flags=REUSE_X).
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"
include "_cuda_rope_kv.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_add_rmsnorm_params:
        const float *x
        const float *residual
        const float *weight
        float *sum
        float *out
        void *workspace
        int64_t workspace_bytes
        int64_t rows
        int64_t cols
        float eps

    ctypedef struct luce_swiglu_quant_params:
        const float *gate
        const float *up
        float *out
        void *workspace
        int64_t workspace_bytes
        int64_t rows
        int64_t cols
        int64_t gate_stride
        int64_t up_stride

    ctypedef struct luce_gate_quant_params:
        const float *o
        const float *qg
        float *out
        void *workspace
        int64_t workspace_bytes
        int64_t rows
        int64_t heads
        int64_t head_dim
        int64_t qg_stride


ctypedef int (*add_rmsnorm_fn)(const luce_add_rmsnorm_params *, void *) noexcept nogil
ctypedef int (*swiglu_quant_fn)(const luce_swiglu_quant_params *, void *) noexcept nogil
ctypedef int (*gate_quant_fn)(const luce_gate_quant_params *, void *) noexcept nogil

cdef add_rmsnorm_fn _add_rmsnorm = NULL
cdef swiglu_quant_fn _swiglu_quant = NULL
cdef gate_quant_fn _gate_quant = NULL
ctypedef int (*rope_kv_fn)(const luce_rope_kv_params *, void *) noexcept nogil
cdef rope_kv_fn _rope_kv = NULL


def load(str path):
    """Resolve this module's entry points in the kernel library at `path`."""
    global _add_rmsnorm, _swiglu_quant, _gate_quant, _rope_kv
    cdef void *lib = _open_library(path)
    _rope_kv = <rope_kv_fn>_symbol(lib, path, "luce_rope_kv")
    _swiglu_quant = <swiglu_quant_fn>_symbol(lib, path, "luce_swiglu_quant")
    _gate_quant = <gate_quant_fn>_symbol(lib, path, "luce_gate_quant")
    _add_rmsnorm = <add_rmsnorm_fn>_symbol(lib, path, "luce_add_rmsnorm")


def add_rmsnorm(uintptr_t x, uintptr_t residual, uintptr_t weight, uintptr_t sum, uintptr_t out,
                uintptr_t workspace, int64_t workspace_bytes, int64_t rows, int64_t cols, float eps,
                uintptr_t stream=0):
    """x, residual (0: none), sum (0 without residual), out [rows, cols] f32, weight [cols]:
    sum = x + residual; out = rmsnorm(sum or x) * weight; quantized into workspace (0: not)."""
    _require_loaded(<void *>_add_rmsnorm)
    cdef luce_add_rmsnorm_params p
    p.x = <const float *>x
    p.residual = <const float *>residual
    p.weight = <const float *>weight
    p.sum = <float *>sum
    p.out = <float *>out
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    p.rows = rows
    p.cols = cols
    p.eps = eps
    cdef int status
    with nogil:
        status = _add_rmsnorm(&p, <void *>stream)
    raise_for_status(status, "luce_add_rmsnorm")


def swiglu_quant(uintptr_t gate, uintptr_t up, uintptr_t out, uintptr_t workspace, int64_t workspace_bytes,
                 int64_t rows, int64_t cols, gate_stride=None, up_stride=None, uintptr_t stream=0):
    """gate, up [rows, cols] f32 (row strides in elements, default cols), out [rows, cols]
    = silu(gate) * up, quantized into workspace."""
    _require_loaded(<void *>_add_rmsnorm)
    cdef luce_swiglu_quant_params p
    p.gate = <const float *>gate
    p.up = <const float *>up
    p.out = <float *>out
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    p.rows = rows
    p.cols = cols
    p.gate_stride = cols if gate_stride is None else gate_stride
    p.up_stride = cols if up_stride is None else up_stride
    cdef int status
    with nogil:
        status = _swiglu_quant(&p, <void *>stream)
    raise_for_status(status, "luce_swiglu_quant")


def gate_quant(uintptr_t o, uintptr_t qg, uintptr_t out, uintptr_t workspace, int64_t workspace_bytes,
               int64_t rows, int64_t heads, int64_t head_dim, int64_t qg_stride, uintptr_t stream=0):
    """o [rows, heads * head_dim] f32, qg [rows, heads, 2 * head_dim] (rows qg_stride elements
    apart): out [rows, heads * head_dim] = o * sigmoid(each head's gate), quantized into workspace."""
    _require_loaded(<void *>_gate_quant)
    cdef luce_gate_quant_params p
    p.o = <const float *>o
    p.qg = <const float *>qg
    p.out = <float *>out
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    p.rows = rows
    p.heads = heads
    p.head_dim = head_dim
    p.qg_stride = qg_stride
    cdef int status
    with nogil:
        status = _gate_quant(&p, <void *>stream)
    raise_for_status(status, "luce_gate_quant")


def rope_kv(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t q_norm, uintptr_t k_norm, uintptr_t q_out,
            uintptr_t k_pages, uintptr_t v_pages, uintptr_t kv_dst, uintptr_t positions, int64_t rows,
            int64_t q_stride, int64_t k_stride, int64_t v_stride, int heads_q, int heads_kv, int head_dim,
            int rope_dim, float theta, sections=(), int n_pos=1, float eps=0.0, uintptr_t stream=0,
            int64_t q_head_stride=0):
    """q, k, v [rows, H*, head_dim] at row strides, q's heads q_head_stride apart (0: head_dim; a
    gated attention's [query | gate] heads: 2 head_dim); q_norm, k_norm [head_dim] or 0; q_out
    [rows, heads_q, head_dim]; k_pages, v_pages [KV rows, heads_kv, head_dim]; kv_dst int64
    [rows] (< 0: padding); positions int32 [rows] or [rows, 4] (n_pos 4 with sections)."""
    _require_loaded(<void *>_add_rmsnorm)
    cdef luce_rope_kv_params p
    _fill_rope_kv(&p, q, k, v, q_norm, k_norm, q_out, k_pages, v_pages, kv_dst, positions, rows, q_stride, k_stride,
                  v_stride, heads_q, heads_kv, head_dim, rope_dim, theta, sections, n_pos, eps, q_head_stride)
    cdef int status
    with nogil:
        status = _rope_kv(&p, <void *>stream)
    raise_for_status(status, "luce_rope_kv")
