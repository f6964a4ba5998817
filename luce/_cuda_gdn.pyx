# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the Gated DeltaNet kernels (cuda/gdn_recurrent.cu, cuda/gdn_chunked.cu;
ABI in cuda/luce_ops.h).

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


ctypedef int (*gdn_recurrent_fn)(const luce_gdn_recurrent_params *, void *) noexcept nogil
ctypedef int (*gdn_chunked_fn)(const luce_gdn_chunked_params *, void *) noexcept nogil

CHUNK = LUCE_GDN_CHUNK  # chunked prefill cuts segments at multiples of this absolute position

cdef gdn_recurrent_fn _gdn_recurrent = NULL
cdef gdn_chunked_fn _gdn_chunked = NULL


def load(str path):
    """Resolve the GDN entry points in the kernel library at `path`."""
    global _gdn_recurrent, _gdn_chunked
    cdef void *lib = _open_library(path)
    _gdn_recurrent = <gdn_recurrent_fn>_symbol(lib, path, "luce_gdn_recurrent")
    _gdn_chunked = <gdn_chunked_fn>_symbol(lib, path, "luce_gdn_chunked")


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
