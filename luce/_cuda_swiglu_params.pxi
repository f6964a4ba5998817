# Shared by luce/_cuda_fused.pyx (luce_swiglu_quant) and luce/_cuda_matmul.pyx (luce_matmul_swiglu,
# the same SwiGLU in the gate | up matmul's tail): the params struct of cuda/luce_ops.h section
# norm_quant. An include, not an extension.
from libc.stdint cimport int64_t


cdef extern from "luce_ops.h":
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
