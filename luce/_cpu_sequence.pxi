# Launch layer of the cpu sequence kernels (luce/cpu/cpu_sequence_ops.h): attention and the
# KV write, norms, rotary, pointwise, Gated DeltaNet. Included by luce/_cpu.pyx.
#
# Wrappers take numpy arrays the backend (luce/ops/cpu_sequence_ops.py) has already shaped
# and checked; here each array's dtype, contiguity and element count are checked again (the
# C code trusts them), then the kernel runs with the GIL released. Outputs are written in
# place. A kernel's negative status becomes a ValueError (MemoryError for ENOMEM).

cdef extern from "cpu_sequence_ops.h":
    int LUCE_UNARY_SILU, LUCE_UNARY_SIGMOID, LUCE_UNARY_SOFTPLUS, LUCE_UNARY_EXP
    ctypedef struct luce_cpu_batch:
        const int32_t *qo_indptr
        const int32_t *kv_indptr
        const int32_t *kv_indices
        const int32_t *kv_last_page_len
        const int32_t *seq_slots
        const int32_t *tree_parents
        int64_t n_indices
        int64_t n_rows
        int64_t n_segments
        int64_t n_pages
        int64_t page_size
    ctypedef struct luce_cpu_gdn_rows:
        const float *q
        const float *k
        const float *v
        const float *g
        const float *beta
        int64_t T, H, Dk, Dv
    int luce_cpu_attention(const float *q, const float *k_pages, const float *v_pages, float *out,
                           const luce_cpu_batch *batch, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                           int causal) nogil
    int luce_cpu_kv_write(float *k_pages, float *v_pages, const float *k, const float *v,
                          const luce_cpu_batch *batch, int64_t Hkv, int64_t D) nogil
    int luce_cpu_rmsnorm(const float *x, const float *weight, float *y, int64_t rows, int64_t D, double eps) nogil
    int luce_cpu_l2norm(const float *x, float *y, int64_t rows, int64_t D, double eps) nogil
    int luce_cpu_gated_rmsnorm(const float *x, const float *z, const float *weight, float *y, int64_t rows,
                               int64_t D, double eps) nogil
    int luce_cpu_rope(const float *x, float *y, const int64_t *positions, int64_t pos_cols, int64_t T,
                      int64_t H, int64_t D, int64_t rope_dim, double theta, const int64_t *sections) nogil
    int luce_cpu_unary(const float *x, float *y, int64_t n, int op) nogil
    int luce_cpu_swiglu(const float *gate, const float *up, float *y, int64_t n) nogil
    int luce_cpu_gdn_recurrent(const luce_cpu_gdn_rows *r, const float *state_in, float *state_out, float *o) nogil
    int luce_cpu_gdn_segments(const luce_cpu_gdn_rows *r, float *pool, int64_t n_slots,
                              const luce_cpu_batch *batch, float *o) nogil
    int luce_cpu_gdn_tree_verify(const luce_cpu_gdn_rows *r, const int32_t *parents, const float *state,
                                 float *o, float *u, float *node_states) nogil
    int luce_cpu_gdn_tree_commit(const float *k, const float *g, const float *u, const int32_t *parents,
                                 int64_t n, const int32_t *path, int64_t n_path, float *state, int64_t H,
                                 int64_t Dk, int64_t Dv) nogil

cdef extern from "cpu_sequence_ops.h":
    int luce_cpu_argmax(const float *logits, int64_t L, int64_t V, int64_t *ids) nogil
    int luce_cpu_top_k_logprobs(const float *logits, int64_t L, int64_t V, int64_t k, int64_t *ids,
                                float *logprobs) nogil

UNARY_OPS = {"silu": LUCE_UNARY_SILU, "sigmoid": LUCE_UNARY_SIGMOID, "softplus": LUCE_UNARY_SOFTPLUS,
             "exp": LUCE_UNARY_EXP}

_SEQ_ERRORS = {
    -1: "sizes the kernel does not take",
    -3: ("the batch is inconsistent: qo_indptr must rise from 0 to T, kv_indptr from 0 within kv_indices, "
         "each live segment's pages lie in the pool with a last page length in 1..page_size, and no "
         "segment has more rows than KV rows"),
    -4: ("tree parents are not a tree: the root (first row) has parent -1 and every other row's parent "
         "is an earlier row of its segment; a commit path starts at node 0 and follows parent links"),
    -5: "a live segment's slot lies outside the state pool, or two live segments share one slot",
}


cdef int _seq_check(int rc, str what) except -1:
    if rc == 0:
        return 0
    if rc == -2:
        raise MemoryError(f"{what}: out of memory")
    raise ValueError(f"{what}: {_SEQ_ERRORS.get(rc, f'the kernel refused its arguments (status {rc})')}")


cdef inline void *_data(object a, int typenum, int64_t count, str what) except NULL:
    """The buffer of a C-contiguous array of numpy type `typenum` holding exactly `count` elements."""
    if type(a) is not np.ndarray or cnp.PyArray_TYPE(<cnp.ndarray>a) != typenum \
            or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a):
        raise TypeError(f"{what} must be a C-contiguous {cnp.PyArray_DescrFromType(typenum)} array")
    if cnp.PyArray_SIZE(<cnp.ndarray>a) != count:
        raise ValueError(f"{what} holds {cnp.PyArray_SIZE(<cnp.ndarray>a)} values, expected {count}")
    cdef void *p = cnp.PyArray_DATA(<cnp.ndarray>a)
    return p if p != NULL else <void *>1   # empty arrays: any non-NULL address (never read)


cdef inline object _i32(object a):
    if type(a) is np.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_INT32 \
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a):
        return a
    return np.ascontiguousarray(a, dtype=np.int32)


cdef int _fill_batch(luce_cpu_batch *b, object batch, list keep, int64_t n_pages, int64_t page_size,
                     bint with_tree) except -1:
    """b <- the ForwardBatch `batch`'s CSR (int32 copies kept alive in `keep`)."""
    qo, kvp, idx = _i32(batch.qo_indptr), _i32(batch.kv_indptr), _i32(batch.kv_indices)
    last, slots = _i32(batch.kv_last_page_len), _i32(batch.seq_slots)
    keep.extend((qo, kvp, idx, last, slots))
    cdef int64_t S = len(slots), T = int(batch.n_rows)
    b.qo_indptr = <const int32_t *>_data(qo, cnp.NPY_INT32, S + 1, "qo_indptr")
    b.kv_indptr = <const int32_t *>_data(kvp, cnp.NPY_INT32, S + 1, "kv_indptr")
    b.kv_indices = <const int32_t *>_data(idx, cnp.NPY_INT32, len(idx), "kv_indices")
    b.kv_last_page_len = <const int32_t *>_data(last, cnp.NPY_INT32, S, "kv_last_page_len")
    b.seq_slots = <const int32_t *>_data(slots, cnp.NPY_INT32, S, "seq_slots")
    b.n_indices, b.n_rows, b.n_segments, b.n_pages, b.page_size = len(idx), T, S, n_pages, page_size
    b.tree_parents = NULL
    tp = getattr(batch, "tree_parents", None) if with_tree else None
    if tp is not None:
        tp = _i32(tp)
        keep.append(tp)
        b.tree_parents = <const int32_t *>_data(tp, cnp.NPY_INT32, T, "tree_parents")
    return 0


def attention(q, k_pages, v_pages, out, batch, float scale, bint causal):
    """q, out [T, Hq, D]; k_pages, v_pages [n_pages, page_size, Hkv, D] f32; batch: a ForwardBatch."""
    cdef list keep = []
    cdef luce_cpu_batch b
    cdef int64_t T = q.shape[0], Hq = q.shape[1], D = q.shape[2]
    cdef int64_t P = k_pages.shape[0], PS = k_pages.shape[1], Hkv = k_pages.shape[2]
    _fill_batch(&b, batch, keep, P, PS, True)
    if b.n_rows != T:
        raise ValueError(f"attention: q has {T} rows, the batch {b.n_rows}")
    cdef const float *qp = <const float *>_data(q, cnp.NPY_FLOAT32, T * Hq * D, "q")
    cdef const float *kp = <const float *>_data(k_pages, cnp.NPY_FLOAT32, P * PS * Hkv * D, "k pages")
    cdef const float *vp = <const float *>_data(v_pages, cnp.NPY_FLOAT32, P * PS * Hkv * D, "v pages")
    cdef float *op = <float *>_data(out, cnp.NPY_FLOAT32, T * Hq * D, "attention output")
    cdef int rc, c = causal
    with nogil:
        rc = luce_cpu_attention(qp, kp, vp, op, &b, Hq, Hkv, D, scale, c)
    return _seq_check(rc, "attention")


def kv_write(k_pages, v_pages, k, v, batch):
    """k, v [T, Hkv, D] into k_pages, v_pages [n_pages, page_size, Hkv, D] at the rows' KV slots."""
    cdef list keep = []
    cdef luce_cpu_batch b
    cdef int64_t P = k_pages.shape[0], PS = k_pages.shape[1], Hkv = k_pages.shape[2], D = k_pages.shape[3]
    _fill_batch(&b, batch, keep, P, PS, False)
    cdef float *kp = <float *>_data(k_pages, cnp.NPY_FLOAT32, P * PS * Hkv * D, "k pages")
    cdef float *vp = <float *>_data(v_pages, cnp.NPY_FLOAT32, P * PS * Hkv * D, "v pages")
    cdef const float *ks = <const float *>_data(k, cnp.NPY_FLOAT32, b.n_rows * Hkv * D, "k")
    cdef const float *vs = <const float *>_data(v, cnp.NPY_FLOAT32, b.n_rows * Hkv * D, "v")
    cdef int rc
    with nogil:
        rc = luce_cpu_kv_write(kp, vp, ks, vs, &b, Hkv, D)
    return _seq_check(rc, "kv_write")


def rmsnorm(x, weight, y, int64_t rows, int64_t D, double eps):
    cdef const float *xp = <const float *>_data(x, cnp.NPY_FLOAT32, rows * D, "x")
    cdef const float *wp = <const float *>_data(weight, cnp.NPY_FLOAT32, D, "weight")
    cdef float *yp = <float *>_data(y, cnp.NPY_FLOAT32, rows * D, "output")
    cdef int rc
    with nogil:
        rc = luce_cpu_rmsnorm(xp, wp, yp, rows, D, eps)
    return _seq_check(rc, "rmsnorm")


def l2norm(x, y, int64_t rows, int64_t D, double eps):
    cdef const float *xp = <const float *>_data(x, cnp.NPY_FLOAT32, rows * D, "x")
    cdef float *yp = <float *>_data(y, cnp.NPY_FLOAT32, rows * D, "output")
    cdef int rc
    with nogil:
        rc = luce_cpu_l2norm(xp, yp, rows, D, eps)
    return _seq_check(rc, "l2norm")


def gated_rmsnorm(x, z, weight, y, int64_t rows, int64_t D, double eps):
    cdef const float *xp = <const float *>_data(x, cnp.NPY_FLOAT32, rows * D, "x")
    cdef const float *zp = <const float *>_data(z, cnp.NPY_FLOAT32, rows * D, "z")
    cdef const float *wp = <const float *>_data(weight, cnp.NPY_FLOAT32, D, "weight")
    cdef float *yp = <float *>_data(y, cnp.NPY_FLOAT32, rows * D, "output")
    cdef int rc
    with nogil:
        rc = luce_cpu_gated_rmsnorm(xp, zp, wp, yp, rows, D, eps)
    return _seq_check(rc, "gated_rmsnorm")


def rope(x, y, positions, int64_t rope_dim, double theta, sections):
    """x, y [T, H, D] f32; positions [T] or [T, 4] int64; sections None or int64 [4]."""
    cdef int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2]
    cdef int64_t cols = 1 if positions.ndim == 1 else positions.shape[1]
    cdef const float *xp = <const float *>_data(x, cnp.NPY_FLOAT32, T * H * D, "x")
    cdef float *yp = <float *>_data(y, cnp.NPY_FLOAT32, T * H * D, "output")
    cdef const int64_t *pp = <const int64_t *>_data(positions, cnp.NPY_INT64, T * cols, "positions")
    cdef const int64_t *sp = NULL
    if sections is not None:
        sp = <const int64_t *>_data(sections, cnp.NPY_INT64, 4, "sections")
    cdef int rc
    with nogil:
        rc = luce_cpu_rope(xp, yp, pp, cols, T, H, D, rope_dim, theta, sp)
    return _seq_check(rc, "rope")


def unary(x, y, int op):
    cdef int64_t n = x.size
    cdef const float *xp = <const float *>_data(x, cnp.NPY_FLOAT32, n, "x")
    cdef float *yp = <float *>_data(y, cnp.NPY_FLOAT32, n, "output")
    cdef int rc
    with nogil:
        rc = luce_cpu_unary(xp, yp, n, op)
    return _seq_check(rc, "pointwise")


def swiglu(gate, up, y):
    cdef int64_t n = gate.size
    cdef const float *gp = <const float *>_data(gate, cnp.NPY_FLOAT32, n, "gate")
    cdef const float *upp = <const float *>_data(up, cnp.NPY_FLOAT32, n, "up")
    cdef float *yp = <float *>_data(y, cnp.NPY_FLOAT32, n, "output")
    cdef int rc
    with nogil:
        rc = luce_cpu_swiglu(gp, upp, yp, n)
    return _seq_check(rc, "swiglu")


cdef int _gdn_rows(luce_cpu_gdn_rows *r, q, k, v, g, beta) except -1:
    """r <- q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H] f32."""
    r.T, r.H, r.Dk, r.Dv = q.shape[0], q.shape[1], q.shape[2], v.shape[2]
    r.q = <const float *>_data(q, cnp.NPY_FLOAT32, r.T * r.H * r.Dk, "q")
    r.k = <const float *>_data(k, cnp.NPY_FLOAT32, r.T * r.H * r.Dk, "k")
    r.v = <const float *>_data(v, cnp.NPY_FLOAT32, r.T * r.H * r.Dv, "v")
    r.g = <const float *>_data(g, cnp.NPY_FLOAT32, r.T * r.H, "g")
    r.beta = <const float *>_data(beta, cnp.NPY_FLOAT32, r.T * r.H, "beta")
    return 0


def gdn_recurrent(q, k, v, g, beta, state_in, state_out, o):
    """All tokens from state_in [H, Dk, Dv] into state_out (may be state_in) -> o [T, H, Dv]."""
    cdef luce_cpu_gdn_rows r
    _gdn_rows(&r, q, k, v, g, beta)
    cdef const float *si = <const float *>_data(state_in, cnp.NPY_FLOAT32, r.H * r.Dk * r.Dv, "state")
    cdef float *so = <float *>_data(state_out, cnp.NPY_FLOAT32, r.H * r.Dk * r.Dv, "new state")
    cdef float *op = <float *>_data(o, cnp.NPY_FLOAT32, r.T * r.H * r.Dv, "output")
    cdef int rc
    with nogil:
        rc = luce_cpu_gdn_recurrent(&r, si, so, op)
    return _seq_check(rc, "gdn_recurrent")


def gdn_segments(q, k, v, g, beta, pool, batch, o):
    """Every live segment from pool[seq_slots[s]] ([slots, H, Dk, Dv], in place) -> o [T, H, Dv]."""
    cdef luce_cpu_gdn_rows r
    cdef list keep = []
    cdef luce_cpu_batch b
    _gdn_rows(&r, q, k, v, g, beta)
    _fill_batch(&b, batch, keep, 0, 1, False)
    cdef int64_t n_slots = pool.shape[0]
    cdef float *pp = <float *>_data(pool, cnp.NPY_FLOAT32, n_slots * r.H * r.Dk * r.Dv, "state pool")
    cdef float *op = <float *>_data(o, cnp.NPY_FLOAT32, r.T * r.H * r.Dv, "output")
    cdef int rc
    with nogil:
        rc = luce_cpu_gdn_segments(&r, pp, n_slots, &b, op)
    return _seq_check(rc, "gdn_recurrent_segments")


def gdn_tree_verify(q, k, v, g, beta, parents, state, o, u, node_states):
    """Tree of T nodes (parents int32 [T]) from state [H, Dk, Dv] -> o [T, H, Dv] and either
    u [T, H, Dv] (factor mode; node_states None) or node_states [T, H, Dk, Dv] (u None)."""
    cdef luce_cpu_gdn_rows r
    _gdn_rows(&r, q, k, v, g, beta)
    cdef const int32_t *tp = <const int32_t *>_data(parents, cnp.NPY_INT32, r.T, "tree parents")
    cdef const float *sp = <const float *>_data(state, cnp.NPY_FLOAT32, r.H * r.Dk * r.Dv, "state")
    cdef float *op = <float *>_data(o, cnp.NPY_FLOAT32, r.T * r.H * r.Dv, "output")
    cdef float *up = NULL
    cdef float *ns = NULL
    if u is not None:
        up = <float *>_data(u, cnp.NPY_FLOAT32, r.T * r.H * r.Dv, "u")
    if node_states is not None:
        ns = <float *>_data(node_states, cnp.NPY_FLOAT32, r.T * r.H * r.Dk * r.Dv, "node states")
    cdef int rc
    with nogil:
        rc = luce_cpu_gdn_tree_verify(&r, tp, sp, op, up, ns)
    return _seq_check(rc, "gdn_tree_verify")


def gdn_tree_commit(k, g, u, parents, path, state):
    """Replay path (int32, root first) of factors k [n, H, Dk], g [n, H], u [n, H, Dv] on
    state [H, Dk, Dv] in place."""
    cdef int64_t n = k.shape[0], H = k.shape[1], Dk = k.shape[2], Dv = u.shape[2], n_path = path.size
    cdef const float *kp = <const float *>_data(k, cnp.NPY_FLOAT32, n * H * Dk, "factor k")
    cdef const float *gp = <const float *>_data(g, cnp.NPY_FLOAT32, n * H, "factor g")
    cdef const float *up = <const float *>_data(u, cnp.NPY_FLOAT32, n * H * Dv, "factor u")
    cdef const int32_t *tp = <const int32_t *>_data(parents, cnp.NPY_INT32, n, "tree parents")
    cdef const int32_t *pp = <const int32_t *>_data(path, cnp.NPY_INT32, n_path, "path")
    cdef float *sp = <float *>_data(state, cnp.NPY_FLOAT32, H * Dk * Dv, "state")
    cdef int rc
    with nogil:
        rc = luce_cpu_gdn_tree_commit(kp, gp, up, tp, n, pp, n_path, sp, H, Dk, Dv)
    return _seq_check(rc, "gdn_tree_commit")


def argmax(logits, ids):
    """logits [L, V] f32 -> ids [L] int64 in place (-1 marks a row holding NaN)."""
    cdef int64_t L = logits.shape[0], V = logits.shape[1]
    cdef const float *lp = <const float *>_data(logits, cnp.NPY_FLOAT32, L * V, "logits")
    cdef int64_t *ip = <int64_t *>_data(ids, cnp.NPY_INT64, L, "ids")
    cdef int rc
    with nogil:
        rc = luce_cpu_argmax(lp, L, V, ip)
    return _seq_check(rc, "argmax")


def top_k_logprobs(logits, int64_t k, ids, logprobs):
    """logits [L, V] f32 -> ids [L, k] int64, logprobs [L, k] f32 in place."""
    cdef int64_t L = logits.shape[0], V = logits.shape[1]
    cdef const float *lp = <const float *>_data(logits, cnp.NPY_FLOAT32, L * V, "logits")
    cdef int64_t *ip = <int64_t *>_data(ids, cnp.NPY_INT64, L * k, "ids")
    cdef float *op = <float *>_data(logprobs, cnp.NPY_FLOAT32, L * k, "logprobs")
    cdef int rc
    with nogil:
        rc = luce_cpu_top_k_logprobs(lp, L, V, k, ip, op)
    return _seq_check(rc, "top_k_logprobs")
