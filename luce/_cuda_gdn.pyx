# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the Gated DeltaNet kernels (cuda/gdn_recurrent.cu, cuda/gdn_chunked.cu, the
fused decode chain cuda/gdn_decode.cu; ABI in cuda/luce_ops.h).

Wrappers take raw device addresses (uintptr_t) and sizes, fill the params struct, call the
entry point with the GIL released and raise luce._cuda.KernelError on a non-zero status.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_gdn_recurrent_params:
        const float *q
        const float *k
        const float *v
        const float *g
        const float *beta
        float *state
        float *out
        const int32_t *qo_indptr
        const int32_t *seq_slots
        int64_t n_slots
        int32_t n_segments
        int32_t n_heads
        int32_t dk
        int32_t dv
    enum: LUCE_GDN_CHUNK
    ctypedef struct luce_gdn_chunked_params:
        const float *q
        const float *k
        const float *v
        const float *g
        const float *beta
        float *state
        float *out
        const int32_t *qo_indptr
        const int32_t *seq_slots
        const int32_t *start_pos
        int64_t n_slots
        int32_t n_segments
        int32_t n_heads
        int32_t dk
        int32_t dv
    ctypedef struct luce_gdn_decode_params:
        const float *qkv
        const float *conv_weight
        float *conv_state
        const float *b
        const float *a
        const float *dt_bias
        const float *ssm_a
        const float *z
        const float *norm_weight
        float *state
        float *q
        float *k
        float *v
        float *g
        float *beta
        float *out
        float *normed
        int32_t *arrivals
        const int32_t *qo_indptr
        const int32_t *seq_slots
        int64_t n_slots
        int32_t n_segments
        int32_t n_k_heads
        int32_t n_v_heads
        int32_t dk
        int32_t dv
        int32_t kernel_size
        float q_scale
        float l2_eps
        float rms_eps
        int64_t qkv_stride
        int64_t z_stride
        int64_t b_stride
        int64_t a_stride
        float *conv_stage
        int64_t stage_row0
        void *workspace
        int64_t workspace_bytes
        int64_t rows


ctypedef int (*gdn_recurrent_fn)(const luce_gdn_recurrent_params *, void *) noexcept nogil
ctypedef int (*gdn_chunked_fn)(const luce_gdn_chunked_params *, void *) noexcept nogil
ctypedef int (*gdn_decode_fn)(const luce_gdn_decode_params *, void *) noexcept nogil
ctypedef int (*gdn_tree_prepare_fn)(const luce_gdn_decode_params *, const int32_t *, int32_t, void *) noexcept nogil

CHUNK = LUCE_GDN_CHUNK  # chunked prefill cuts segments at multiples of this absolute position

cdef gdn_recurrent_fn _gdn_recurrent = NULL
cdef gdn_chunked_fn _gdn_chunked = NULL
cdef gdn_decode_fn _gdn_decode = NULL
cdef gdn_tree_prepare_fn _gdn_tree_prepare = NULL


def load(str path):
    """Resolve the GDN entry points in the kernel library at `path`."""
    global _gdn_recurrent, _gdn_chunked, _gdn_decode, _gdn_tree_prepare
    cdef void *lib = _open_library(path)
    _gdn_recurrent = <gdn_recurrent_fn>_symbol(lib, path, "luce_gdn_recurrent")
    _gdn_chunked = <gdn_chunked_fn>_symbol(lib, path, "luce_gdn_chunked")
    _gdn_decode = <gdn_decode_fn>_symbol(lib, path, "luce_gdn_decode")
    _gdn_tree_prepare = <gdn_tree_prepare_fn>_symbol(lib, path, "luce_gdn_tree_prepare")


def gdn_recurrent(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t g, uintptr_t beta,
                  uintptr_t state, uintptr_t out, uintptr_t qo_indptr, uintptr_t seq_slots,
                  int64_t n_slots, int32_t n_segments, int32_t n_heads, int32_t dk, int32_t dv,
                  uintptr_t stream=0):
    """q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv], out [T, Hv, Dv] f32; state
    [n_slots, Hv, Dk, Dv] f32 updated in place; qo_indptr [S+1], seq_slots [S] int32
    (device addresses). Segment s runs its rows' tokens in order on slot seq_slots[s]."""
    _require_loaded(<void *>_gdn_recurrent)
    cdef luce_gdn_recurrent_params p
    p.q = <const float *>q
    p.k = <const float *>k
    p.v = <const float *>v
    p.g = <const float *>g
    p.beta = <const float *>beta
    p.state = <float *>state
    p.out = <float *>out
    p.qo_indptr = <const int32_t *>qo_indptr
    p.seq_slots = <const int32_t *>seq_slots
    p.n_slots = n_slots
    p.n_segments = n_segments
    p.n_heads = n_heads
    p.dk = dk
    p.dv = dv
    cdef int status
    with nogil:
        status = _gdn_recurrent(&p, <void *>stream)
    raise_for_status(status, "luce_gdn_recurrent")


def gdn_chunked(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t g, uintptr_t beta,
                uintptr_t state, uintptr_t out, uintptr_t qo_indptr, uintptr_t seq_slots,
                uintptr_t start_pos, int64_t n_slots, int32_t n_segments, int32_t n_heads,
                int32_t dk, int32_t dv, uintptr_t stream=0):
    """As gdn_recurrent, plus start_pos [S] int32 (absolute position of each segment's
    first row): chunks are cut at multiples of CHUNK; one-token chunks take the recurrent
    step."""
    _require_loaded(<void *>_gdn_chunked)
    cdef luce_gdn_chunked_params p
    p.q = <const float *>q
    p.k = <const float *>k
    p.v = <const float *>v
    p.g = <const float *>g
    p.beta = <const float *>beta
    p.state = <float *>state
    p.out = <float *>out
    p.qo_indptr = <const int32_t *>qo_indptr
    p.seq_slots = <const int32_t *>seq_slots
    p.start_pos = <const int32_t *>start_pos
    p.n_slots = n_slots
    p.n_segments = n_segments
    p.n_heads = n_heads
    p.dk = dk
    p.dv = dv
    cdef int status
    with nogil:
        status = _gdn_chunked(&p, <void *>stream)
    raise_for_status(status, "luce_gdn_chunked")


cdef luce_gdn_decode_params _decode_params(
        uintptr_t qkv, uintptr_t conv_weight, uintptr_t conv_state, uintptr_t b, uintptr_t a, uintptr_t dt_bias,
        uintptr_t ssm_a, uintptr_t z, uintptr_t norm_weight, uintptr_t state, uintptr_t q, uintptr_t k,
        uintptr_t v, uintptr_t g, uintptr_t beta, uintptr_t out, uintptr_t normed, uintptr_t arrivals,
        uintptr_t qo_indptr, uintptr_t seq_slots, int64_t n_slots, int32_t n_segments, int32_t n_k_heads,
        int32_t n_v_heads, int32_t dk, int32_t dv, int32_t kernel_size, float q_scale, float l2_eps,
        float rms_eps, int64_t qkv_stride, int64_t z_stride, int64_t b_stride, int64_t a_stride):
    cdef luce_gdn_decode_params p
    p.qkv = <const float *>qkv
    p.conv_weight = <const float *>conv_weight
    p.conv_state = <float *>conv_state
    p.b = <const float *>b
    p.a = <const float *>a
    p.dt_bias = <const float *>dt_bias
    p.ssm_a = <const float *>ssm_a
    p.z = <const float *>z
    p.norm_weight = <const float *>norm_weight
    p.state = <float *>state
    p.q = <float *>q
    p.k = <float *>k
    p.v = <float *>v
    p.g = <float *>g
    p.beta = <float *>beta
    p.out = <float *>out
    p.normed = <float *>normed
    p.arrivals = <int32_t *>arrivals
    p.qo_indptr = <const int32_t *>qo_indptr
    p.seq_slots = <const int32_t *>seq_slots
    p.n_slots = n_slots
    p.n_segments = n_segments
    p.n_k_heads = n_k_heads
    p.n_v_heads = n_v_heads
    p.dk = dk
    p.dv = dv
    p.kernel_size = kernel_size
    p.q_scale = q_scale
    p.l2_eps = l2_eps
    p.rms_eps = rms_eps
    p.qkv_stride = qkv_stride
    p.z_stride = z_stride
    p.b_stride = b_stride
    p.a_stride = a_stride
    p.conv_stage = NULL
    p.stage_row0 = 0
    p.workspace = NULL
    p.workspace_bytes = 0
    p.rows = 0
    return p


def gdn_decode(uintptr_t qkv, uintptr_t conv_weight, uintptr_t conv_state, uintptr_t b, uintptr_t a,
               uintptr_t dt_bias, uintptr_t ssm_a, uintptr_t z, uintptr_t norm_weight, uintptr_t state,
               uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t g, uintptr_t beta, uintptr_t out,
               uintptr_t normed, uintptr_t arrivals, uintptr_t qo_indptr, uintptr_t seq_slots, int64_t n_slots,
               int32_t n_segments, int32_t n_k_heads, int32_t n_v_heads, int32_t dk, int32_t dv,
               int32_t kernel_size, float q_scale, float l2_eps, float rms_eps, int64_t qkv_stride,
               int64_t z_stride, int64_t b_stride, int64_t a_stride, uintptr_t stream=0, uintptr_t workspace=0,
               int64_t workspace_bytes=0, int64_t rows=0):
    """The GDN decode chain of AR segments in two launches (luce_gdn_decode_params): qkv [T, C],
    conv_weight [C, K], conv_state [n_slots, K-1, C], b, a [T, Hv], dt_bias, ssm_a [Hv], z
    [T, Hv, Dv], norm_weight [Dv], state [n_slots, Hv, Dk, Dv] (both states in place); the
    caller's buffers q, k [T, Hv, Dk], v, out [T, Hv, Dv], g, beta [T, Hv], arrivals int32
    [n_segments, Hv]; result normed [T, Hv, Dv]. qkv, z, b, a rows lie *_stride elements
    apart (column blocks of a merged projection read in place). workspace (0: none) of
    workspace_bytes: normed [rows = T, Hv*Dv] also quantized there for matmul(..., flags=REUSE_X);
    arrivals then [n_segments * (Hv + ceil(Hv*Dv / 256))]."""
    _require_loaded(<void *>_gdn_decode)
    cdef luce_gdn_decode_params p = _decode_params(
        qkv, conv_weight, conv_state, b, a, dt_bias, ssm_a, z, norm_weight, state, q, k, v, g, beta, out, normed,
        arrivals, qo_indptr, seq_slots, n_slots, n_segments, n_k_heads, n_v_heads, dk, dv, kernel_size, q_scale,
        l2_eps, rms_eps, qkv_stride, z_stride, b_stride, a_stride)
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    p.rows = rows
    cdef int status
    with nogil:
        status = _gdn_decode(&p, <void *>stream)
    raise_for_status(status, "luce_gdn_decode")


def gdn_tree_prepare(uintptr_t qkv, uintptr_t conv_weight, uintptr_t conv_state, uintptr_t b, uintptr_t a,
                     uintptr_t dt_bias, uintptr_t ssm_a, uintptr_t z, uintptr_t q, uintptr_t k, uintptr_t v,
                     uintptr_t g, uintptr_t beta, uintptr_t qo_indptr, uintptr_t seq_slots, uintptr_t tree_parents,
                     int64_t n_slots, int32_t n_segments, int32_t n_k_heads, int32_t n_v_heads, int32_t dk,
                     int32_t dv, int32_t kernel_size, float q_scale, float l2_eps, int64_t qkv_stride,
                     int64_t z_stride, int64_t b_stride, int64_t a_stride, int32_t max_tree_rows,
                     uintptr_t stream=0, uintptr_t arrivals=0, uintptr_t normed=0, uintptr_t conv_stage=0,
                     int64_t stage_row0=0):
    """gdn_decode's first launch for the rows of draft trees (luce_gdn_tree_prepare): q, k
    [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv] of every tree segment's rows (seq_slots -1
    elsewhere), each row's conv window along tree_parents [T] int32 (global rows) then
    conv_state (read only); at most max_tree_rows rows a segment. arrivals (0: none) int32
    [n_segments, Hv] zeroed for gdn_tree_verify's norm epilogue; normed (0: none) [T, Hv*Dv]:
    the padding segments' rows zeroed; conv_stage (0: none) [.., C]: tree row r's qkv row at
    r - stage_row0."""
    _require_loaded(<void *>_gdn_tree_prepare)
    cdef luce_gdn_decode_params p = _decode_params(
        qkv, conv_weight, conv_state, b, a, dt_bias, ssm_a, z, 0, 0, q, k, v, g, beta, 0, normed, arrivals,
        qo_indptr, seq_slots, n_slots, n_segments, n_k_heads, n_v_heads, dk, dv, kernel_size, q_scale, l2_eps, 0.0,
        qkv_stride, z_stride, b_stride, a_stride)
    p.conv_stage = <float *>conv_stage
    p.stage_row0 = stage_row0
    cdef int status
    with nogil:
        status = _gdn_tree_prepare(&p, <const int32_t *>tree_parents, max_tree_rows, <void *>stream)
    raise_for_status(status, "luce_gdn_tree_prepare")

