# Shared by luce/_cuda_fused.pyx (luce_rope_kv) and luce/_cuda_attention.pyx (luce_rope_kv_attention,
# the same input fused into a decode attention launch): the params struct of cuda/luce_ops.h
# section rope_kv and its fill from the wrappers' arguments. An include, not an extension.
from libc.stdint cimport int32_t, int64_t, uintptr_t


cdef extern from "luce_ops.h":
    ctypedef struct luce_rope_kv_params:
        const float *q
        const float *k
        const float *v
        const float *q_norm
        const float *k_norm
        float *q_out
        float *k_pages
        float *v_pages
        const int64_t *kv_dst
        const int32_t *positions
        int64_t rows
        int64_t q_stride
        int64_t k_stride
        int64_t v_stride
        int64_t q_head_stride
        int32_t heads_q
        int32_t heads_kv
        int32_t head_dim
        int32_t rope_dim
        int32_t n_pos
        int32_t sections[4]
        float theta
        float eps


cdef int _fill_rope_kv(luce_rope_kv_params *p, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t q_norm,
                       uintptr_t k_norm, uintptr_t q_out, uintptr_t k_pages, uintptr_t v_pages, uintptr_t kv_dst,
                       uintptr_t positions, int64_t rows, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                       int heads_q, int heads_kv, int head_dim, int rope_dim, float theta, sections, int n_pos,
                       float eps, int64_t q_head_stride=0) except -1:
    """p from rope_kv's arguments (luce._cuda_fused.rope_kv); ValueError for bad sections.
    q_head_stride: elements between q's heads in a row (0: head_dim)."""
    secs = tuple(int(s) for s in sections) or (0, 0, 0, 0)
    if len(secs) != 4:
        raise ValueError(f"rope_kv: sections must be () or 4 sizes, got {sections}")
    p.q = <const float *>q
    p.k = <const float *>k
    p.v = <const float *>v
    p.q_norm = <const float *>q_norm
    p.k_norm = <const float *>k_norm
    p.q_out = <float *>q_out
    p.k_pages = <float *>k_pages
    p.v_pages = <float *>v_pages
    p.kv_dst = <const int64_t *>kv_dst
    p.positions = <const int32_t *>positions
    p.rows = rows
    p.q_stride = q_stride
    p.k_stride = k_stride
    p.v_stride = v_stride
    p.q_head_stride = q_head_stride
    p.heads_q = heads_q
    p.heads_kv = heads_kv
    p.head_dim = head_dim
    p.rope_dim = rope_dim
    p.n_pos = n_pos
    p.theta = theta
    p.eps = eps
    for i in range(4):
        p.sections[i] = secs[i]
    return 0
