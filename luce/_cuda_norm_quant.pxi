# Shared by luce/_cuda_fused.pyx (luce_add_rmsnorm, luce_swiglu_quant) and luce/_cuda_matmul.pyx
# (luce_matmul_add_rmsnorm, luce_matmul_swiglu_quant: the same producers as a matmul's tail): the
# params structs of cuda/luce_ops.h section norm_quant and their fills from the wrappers'
# arguments. An include, not an extension.
from libc.stdint cimport int64_t, uintptr_t


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


cdef luce_add_rmsnorm_params _norm_params(uintptr_t x, uintptr_t residual, uintptr_t weight, uintptr_t sum,
                                          uintptr_t out, uintptr_t workspace, int64_t workspace_bytes, int64_t rows,
                                          int64_t cols, float eps) noexcept:
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
    return p


cdef luce_swiglu_quant_params _swiglu_params(uintptr_t gate, uintptr_t up, uintptr_t out, uintptr_t workspace,
                                             int64_t workspace_bytes, int64_t rows, int64_t cols, int64_t gate_stride,
                                             int64_t up_stride) noexcept:
    cdef luce_swiglu_quant_params p
    p.gate = <const float *>gate
    p.up = <const float *>up
    p.out = <float *>out
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    p.rows = rows
    p.cols = cols
    p.gate_stride = gate_stride
    p.up_stride = up_stride
    return p
