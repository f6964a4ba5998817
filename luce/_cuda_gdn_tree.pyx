# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the Gated DeltaNet tree kernels (cuda/gdn_tree.cu; ABI in cuda/luce_ops.h):
exact tree verify with factor capture, commit by factor replay, and per-node stored states.

Wrappers take raw device addresses (uintptr_t) and sizes, fill the params struct, call the
entry point with the GIL released and raise luce._cuda.KernelError on a non-zero status.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    enum: LUCE_GDN_TREE_MAX_ROWS
    ctypedef struct luce_gdn_tree_verify_params:
        const float *q
        const float *k
        const float *v
        const float *g
        const float *beta
        const float *state
        float *out
        float *u_out
        float *k_out
        float *g_out
        float *beta_out
        float *workspace
        const int32_t *qo_indptr
        const int32_t *seq_slots
        const int32_t *tree_parents
        int64_t n_slots
        int64_t workspace_bytes
        int32_t n_segments
        int32_t n_heads
        int32_t dk
        int32_t dv
        int32_t max_tree_rows
        const float *z
        const float *norm_weight
        float *normed
        int32_t *arrivals
        int64_t z_stride
        float rms_eps
    ctypedef struct luce_gdn_tree_states_params:
        const float *q
        const float *k
        const float *v
        const float *g
        const float *beta
        const float *state
        float *out
        float *node_states
        const int32_t *qo_indptr
        const int32_t *seq_slots
        const int32_t *tree_parents
        int64_t n_slots
        int32_t n_segments
        int32_t n_heads
        int32_t dk
        int32_t dv
    ctypedef struct luce_gdn_tree_commit_params:
        const float *k
        const float *g
        const float *u
        float *state
        const int32_t *path_indptr
        const int32_t *path_rows
        const int32_t *seq_slots
        int64_t n_slots
        int32_t n_segments
        int32_t n_heads
        int32_t dk
        int32_t dv


ctypedef int (*verify_fn)(const luce_gdn_tree_verify_params *, void *) noexcept nogil
ctypedef int (*states_fn)(const luce_gdn_tree_states_params *, void *) noexcept nogil
ctypedef int (*commit_fn)(const luce_gdn_tree_commit_params *, void *) noexcept nogil
ctypedef int64_t (*workspace_fn)(int32_t, int32_t, int32_t, int32_t, int32_t) noexcept nogil

MAX_TREE_ROWS = LUCE_GDN_TREE_MAX_ROWS  # rows of one tree segment at most

cdef verify_fn _verify = NULL
cdef states_fn _states = NULL
cdef commit_fn _commit = NULL
cdef workspace_fn _workspace_bytes = NULL


def load(str path):
    """Resolve the GDN tree entry points in the kernel library at `path`."""
    global _verify, _states, _commit, _workspace_bytes
    cdef void *lib = _open_library(path)
    _commit = <commit_fn>_symbol(lib, path, "luce_gdn_tree_commit")
    _states = <states_fn>_symbol(lib, path, "luce_gdn_tree_verify_states")
    _workspace_bytes = <workspace_fn>_symbol(lib, path, "luce_gdn_tree_verify_workspace_bytes")
    _verify = <verify_fn>_symbol(lib, path, "luce_gdn_tree_verify")


def verify_workspace_bytes(int32_t n_segments, int32_t n_heads, int32_t dk, int32_t dv,
                           int32_t max_tree_rows):
    """Bytes of workspace gdn_tree_verify needs (0 when the saved states fit on chip)."""
    _require_loaded(<void *>_verify)
    cdef int64_t n = _workspace_bytes(n_segments, n_heads, dk, dv, max_tree_rows)
    if n < 0:
        raise ValueError(f"gdn_tree_verify workspace: unsupported sizes (segments {n_segments}, "
                         f"heads {n_heads}, dk {dk}, dv {dv}, max_tree_rows {max_tree_rows}; "
                         f"dk in 64/128/256, dv a multiple of 32, 1 <= max_tree_rows <= {MAX_TREE_ROWS})")
    return n


def gdn_tree_verify(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t g, uintptr_t beta,
                    uintptr_t state, uintptr_t out, uintptr_t u_out,
                    uintptr_t qo_indptr, uintptr_t seq_slots, uintptr_t tree_parents,
                    int64_t n_slots, int32_t n_segments, int32_t n_heads, int32_t dk, int32_t dv,
                    int32_t max_tree_rows, uintptr_t workspace=0, int64_t workspace_bytes=0,
                    uintptr_t k_out=0, uintptr_t g_out=0, uintptr_t beta_out=0, uintptr_t stream=0,
                    uintptr_t z=0, int64_t z_stride=0, uintptr_t norm_weight=0, uintptr_t normed=0,
                    uintptr_t arrivals=0, float rms_eps=0.0):
    """q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv] f32; state [n_slots, Hv, Dk, Dv] f32
    (read only); out, u_out [T, Hv, Dv] f32; qo_indptr [S+1], seq_slots [S], tree_parents [T]
    int32 (global parent rows, -1 for each segment's root). k_out, g_out, beta_out (0: not
    written) receive copies of k, g, beta. normed (0: none) [T, Hv, Dv] receives the gated
    RMSNorm of out with z (rows z_stride apart) and norm_weight [Dv]; arrivals int32 [S, Hv]
    zero before the call. Device addresses."""
    _require_loaded(<void *>_verify)
    cdef luce_gdn_tree_verify_params p
    p.q = <const float *>q
    p.k = <const float *>k
    p.v = <const float *>v
    p.g = <const float *>g
    p.beta = <const float *>beta
    p.state = <const float *>state
    p.out = <float *>out
    p.u_out = <float *>u_out
    p.k_out = <float *>k_out
    p.g_out = <float *>g_out
    p.beta_out = <float *>beta_out
    p.workspace = <float *>workspace
    p.qo_indptr = <const int32_t *>qo_indptr
    p.seq_slots = <const int32_t *>seq_slots
    p.tree_parents = <const int32_t *>tree_parents
    p.n_slots = n_slots
    p.workspace_bytes = workspace_bytes
    p.n_segments = n_segments
    p.n_heads = n_heads
    p.dk = dk
    p.dv = dv
    p.max_tree_rows = max_tree_rows
    p.z = <const float *>z
    p.norm_weight = <const float *>norm_weight
    p.normed = <float *>normed
    p.arrivals = <int32_t *>arrivals
    p.z_stride = z_stride
    p.rms_eps = rms_eps
    cdef int status
    with nogil:
        status = _verify(&p, <void *>stream)
    raise_for_status(status, "luce_gdn_tree_verify")


def gdn_tree_verify_states(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t g, uintptr_t beta,
                           uintptr_t state, uintptr_t out, uintptr_t node_states, uintptr_t qo_indptr,
                           uintptr_t seq_slots, uintptr_t tree_parents, int64_t n_slots, int32_t n_segments,
                           int32_t n_heads, int32_t dk, int32_t dv, uintptr_t stream=0):
    """Per-node stored states: as gdn_tree_verify's inputs (state read only); out [T, Hv, Dv]
    and node_states [T, Hv, Dk, Dv] f32, every node's state after its step."""
    _require_loaded(<void *>_states)
    cdef luce_gdn_tree_states_params p
    p.q = <const float *>q
    p.k = <const float *>k
    p.v = <const float *>v
    p.g = <const float *>g
    p.beta = <const float *>beta
    p.state = <const float *>state
    p.out = <float *>out
    p.node_states = <float *>node_states
    p.qo_indptr = <const int32_t *>qo_indptr
    p.seq_slots = <const int32_t *>seq_slots
    p.tree_parents = <const int32_t *>tree_parents
    p.n_slots = n_slots
    p.n_segments = n_segments
    p.n_heads = n_heads
    p.dk = dk
    p.dv = dv
    cdef int status
    with nogil:
        status = _states(&p, <void *>stream)
    raise_for_status(status, "luce_gdn_tree_verify_states")


def gdn_tree_commit(uintptr_t k, uintptr_t g, uintptr_t u, uintptr_t state,
                    uintptr_t path_indptr, uintptr_t path_rows, uintptr_t seq_slots,
                    int64_t n_slots, int32_t n_segments, int32_t n_heads, int32_t dk, int32_t dv,
                    uintptr_t stream=0):
    """Replay factor rows path_rows[path_indptr[s]:path_indptr[s+1]] (int32, root first) of
    k [*, Hv, Dk], g [*, Hv], u [*, Hv, Dv] f32 on state[seq_slots[s]] in place."""
    _require_loaded(<void *>_verify)
    cdef luce_gdn_tree_commit_params p
    p.k = <const float *>k
    p.g = <const float *>g
    p.u = <const float *>u
    p.state = <float *>state
    p.path_indptr = <const int32_t *>path_indptr
    p.path_rows = <const int32_t *>path_rows
    p.seq_slots = <const int32_t *>seq_slots
    p.n_slots = n_slots
    p.n_segments = n_segments
    p.n_heads = n_heads
    p.dk = dk
    p.dv = dv
    cdef int status
    with nogil:
        status = _commit(&p, <void *>stream)
    raise_for_status(status, "luce_gdn_tree_commit")
