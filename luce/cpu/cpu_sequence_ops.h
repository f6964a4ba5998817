/* The C ABI of the cpu backend's sequence kernels: attention and the paged KV write,
 * RMSNorm / L2 norm / gated RMSNorm, rotary, pointwise maths, and the Gated DeltaNet step
 * (AR rows, segments over slot pools, tree verify, tree commit). luce/_cpu_sequence.pxi
 * launches them; luce/ops/cpu_sequence_ops.py is the backend side. References: luce/ref/.
 *
 * Every entry returns 0, or a negative status: LUCE_CPU_EARG (a size the kernel does not
 * take), LUCE_CPU_ENOMEM, or one of the LUCE_CPU_E* codes below naming what is inconsistent.
 *
 * Batch invariance by construction (DESIGN 5): each output's reductions follow an order fixed
 * by its own sizes (D, its own KV length, its own tokens); threads split independent outputs
 * (rows, (row, kv head) pairs, (segment, head) pairs, heads), never a reduction; the
 * instruction-set clones of a function (LUCE_CLONES, seq_common.h) give the same bits.
 * All arrays are C-contiguous f32 / int32 as named; sizes are element counts.
 */
#ifndef LUCE_CPU_SEQUENCE_OPS_H
#define LUCE_CPU_SEQUENCE_OPS_H

#include <stdint.h>

#include "cpu_ops.h"   /* LUCE_CPU_OK, LUCE_CPU_EARG, LUCE_CPU_ENOMEM */

#define LUCE_CPU_EBATCH -3   /* the batch CSR (qo_indptr, kv_indptr, pages, last page lengths) */
#define LUCE_CPU_ETREE -4    /* tree parents (or a commit path) that are not a tree */
#define LUCE_CPU_ESLOT -5    /* a slot outside the pool, or two live segments on one slot */

/* A step's row / paged-KV layout (luce.models.batch.ForwardBatch). Segment s owns rows
 * qo_indptr[s]..qo_indptr[s+1]; its KV rows are kv_len(s) = (P - 1) * page_size +
 * kv_last_page_len[s] for its P pages kv_indices[kv_indptr[s]..kv_indptr[s+1]]; row j of n
 * sits at KV index kv_len - n + j. seq_slots[s] == -1: padding. tree_parents (or NULL):
 * global parent row of tree rows, -1 otherwise (luce/models/tree_rows.py). */
typedef struct {
    const int32_t *qo_indptr;        /* [S+1] */
    const int32_t *kv_indptr;        /* [S+1] */
    const int32_t *kv_indices;       /* [kv_indptr[S]] page ids in [0, n_pages) */
    const int32_t *kv_last_page_len; /* [S] */
    const int32_t *seq_slots;        /* [S] */
    const int32_t *tree_parents;     /* [T] or NULL */
    int64_t n_indices;               /* entries of kv_indices */
    int64_t n_rows;                  /* T */
    int64_t n_segments;              /* S */
    int64_t n_pages;                 /* pages of the KV pool */
    int64_t page_size;
} luce_cpu_batch;

/* ---- attention (attention.c; luce/ref/attention.py, luce/ref/tree_attention.py) ---------- */

/* q [T, Hq, D], k_pages / v_pages [n_pages, page_size, Hkv, D] -> out [T, Hq, D] (zeros on
 * padding rows). causal: row j of n sees KV indices 0..kv_len - n + j, else all kv_len. Tree
 * segments: node i sees 0..P-1 then P + a for a on its root path (P = kv_len - n). */
int luce_cpu_attention(const float *q, const float *k_pages, const float *v_pages, float *out,
                       const luce_cpu_batch *batch, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                       int causal);

/* k, v [T, Hkv, D] -> each live row's KV slot in k_pages / v_pages (padding rows skipped). */
int luce_cpu_kv_write(float *k_pages, float *v_pages, const float *k, const float *v,
                      const luce_cpu_batch *batch, int64_t Hkv, int64_t D);

/* ---- norms (norms.c; luce/ref/rmsnorm.py, pointwise.py l2norm, gated_rmsnorm.py) ------- */

/* x [rows, D] -> y [rows, D]: x / sqrt(mean(x^2) + eps) * weight[D] */
int luce_cpu_rmsnorm(const float *x, const float *weight, float *y, int64_t rows, int64_t D, double eps);
/* x [rows, D] -> y: x / sqrt(sum(x^2) + eps) */
int luce_cpu_l2norm(const float *x, float *y, int64_t rows, int64_t D, double eps);
/* x, z [rows, D] -> y: rmsnorm(x) * weight * silu(z) */
int luce_cpu_gated_rmsnorm(const float *x, const float *z, const float *weight, float *y, int64_t rows,
                           int64_t D, double eps);

/* ---- rotary (rotary.c; luce/ref/rotary.py) ---------------------------------------------- */

/* x [T, H, D] -> y [T, H, D], NEOX rotary on dims [0, rope_dim). positions [T, pos_cols]
 * (pos_cols 1: plain; 4: M-RoPE (t, h, w, e) with sections[4]; sections NULL: plain).
 * x == y is allowed. */
int luce_cpu_rope(const float *x, float *y, const int64_t *positions, int64_t pos_cols, int64_t T,
                  int64_t H, int64_t D, int64_t rope_dim, double theta, const int64_t *sections);

/* ---- pointwise (pointwise.c; luce/ref/pointwise.py, swiglu.py) -------------------------- */

enum { LUCE_UNARY_SILU = 0, LUCE_UNARY_SIGMOID = 1, LUCE_UNARY_SOFTPLUS = 2, LUCE_UNARY_EXP = 3 };

/* y[i] = op(x[i]) for n elements (x == y allowed) */
int luce_cpu_unary(const float *x, float *y, int64_t n, int op);
/* y[i] = silu(gate[i]) * up[i] */
int luce_cpu_swiglu(const float *gate, const float *up, float *y, int64_t n);

/* ---- Gated DeltaNet (gdn.c, gdn_tree.c; luce/ref/gdn_recurrent.py, gdn_tree.py) --------- */

/* One call's tokens: q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H]. */
typedef struct {
    const float *q, *k, *v, *g, *beta;
    int64_t T, H, Dk, Dv;
} luce_cpu_gdn_rows;

/* All T tokens in order from state_in [H, Dk, Dv] -> o [T, H, Dv], state_out (may equal
 * state_in: in place). */
int luce_cpu_gdn_recurrent(const luce_cpu_gdn_rows *r, const float *state_in, float *state_out, float *o);

/* Every live segment of `batch` (rows qo_indptr[s]..) from pool[seq_slots[s]] (pool
 * [n_slots, H, Dk, Dv], updated in place) -> o [T, H, Dv] (zeros on padding rows). Tree
 * parents are not read: the model sends tree segments to the tree verify. */
int luce_cpu_gdn_segments(const luce_cpu_gdn_rows *r, float *pool, int64_t n_slots, const luce_cpu_batch *batch,
                          float *o);

/* Tree verify of n = r->T nodes (parents [n]: -1 for node 0, parents[i] < i) from state
 * [H, Dk, Dv], left unchanged -> o [n, H, Dv] and
 *   u [n, H, Dv] (factor mode: node_states NULL): the deltas beta (v - (exp(g) h_parent)^T k);
 *   node_states [n, H, Dk, Dv] (baseline mode: u NULL): every node's state.
 * Both run the AR step on each node from its parent's state. */
int luce_cpu_gdn_tree_verify(const luce_cpu_gdn_rows *r, const int32_t *parents, const float *state,
                             float *o, float *u, float *node_states);

/* Replay a committed root path (path [n_path] node ids, root first, each a child of the one
 * before) of factors k [n, H, Dk], g [n, H], u [n, H, Dv] on state [H, Dk, Dv] in place with
 * the AR step's own update. */
int luce_cpu_gdn_tree_commit(const float *k, const float *g, const float *u, const int32_t *parents,
                             int64_t n, const int32_t *path, int64_t n_path, float *state, int64_t H,
                             int64_t Dk, int64_t Dv);

/* logits [L, V] -> ids [L] (argmax, lowest id on ties; -1 for a row holding NaN) */
int luce_cpu_argmax(const float *logits, int64_t L, int64_t V, int64_t *ids);
/* logits [L, V] -> ids [L, k] int64 and logprobs [L, k] f32: the k best, best first, ties to the
 * lowest id, log-softmax over the whole row (k <= 64; ids -1 for a row holding NaN) */
int luce_cpu_top_k_logprobs(const float *logits, int64_t L, int64_t V, int64_t k, int64_t *ids, float *logprobs);

#endif
