/* Sequence kernels: paged attention (prefill, AR and tree rows), Gated DeltaNet steps,
 * chunked prefill and tree verify/commit, causal conv over trees.
 * Part of the one C ABI: included by cuda/luce_ops.h (read its header comment). */
#ifndef LUCE_OPS_SEQUENCE_H
#define LUCE_OPS_SEQUENCE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- attention ---- */
/* Paged GQA attention for prefill, AR and tree rows (reference: luce/ref/attention.py).
 * q [n_rows, Hq, D] f32 and out [n_rows, Hq, D] f32 dense; k_pages, v_pages
 * [n_pages, page_size, Hkv, D] f32; query head h reads KV head h / (Hq / Hkv).
 * CSR as luce/models/batch.py: segment s owns rows qo_indptr[s]:qo_indptr[s+1] and pages
 * kv_indices[kv_indptr[s]:kv_indptr[s+1]]; kv_len(s) = (pages - 1) * page_size +
 * kv_last_page_len[s]. Row j of a segment of n rows attends KV indices 0..kv_len - n + j
 * (causal) or all kv_len. Segments with seq_slots[s] < 0 are padding: nothing is written.
 * Keys are cut into partitions of LUCE_ATTN_PARTITION at absolute KV indices and the
 * partitions are combined in index order, so a row's arithmetic depends only on its own
 * key count, never on the other rows (DESIGN 5 rule 2). max_kv_len bounds every row's key
 * count and sizes the grid (a row with more keys gets NaN); workspace holds
 * luce_attention_workspace_bytes(n_rows, prompt_rows, Hq, D, max_kv_len, Hkv, page_size,
 * n_kv_indices) bytes: per row and query head (D + 2) floats for each partial, one a partition
 * (ceil(max_kv_len / partition)) for the per-row kernel's rows, one a 1,024-key split (a
 * quarter as many) for the rows of the prompt-row kernel (its prompt rows, where that kernel
 * fits the current device; else those rows take the per-row kernel and the full size); then,
 * where the f16 prompt kernel's staged form runs (prompt rows and n_kv_indices > 0), the
 * prompt segments' keys as f16: 4 * n_kv_indices * page_size * Hkv * D bytes. -1 for a
 * negative size or prompt_rows outside [0, n_rows].
 * n_kv_indices: entries of kv_indices (every kv_indptr value <= it), or 0: the prompt kernel
 * reads the f32 pages in every tile (slower; the same bits).
 * D in {64, 128, 256}; Hq / Hkv <= 16; page_size a power of two dividing the partition.
 * Tree rows (reference: luce/ref/tree_attention.py): tree_parents [n_rows] int32 is each
 * row's global parent row (-1 for roots and ordinary rows; NULL: no trees). A row with a
 * parent belongs to a tree segment of n rows whose scratch K/V sit at KV index P + j
 * (P = kv_len - n, j the row's index in the segment); it attends KV 0..P-1 and then
 * P + a for each node a on its root path, root first. Partitions are cut on that logical
 * key index, so the row is bitwise the AR row at position P + depth once its path is
 * committed. Tree roots and rows without a parent follow the ordinary rule (trees need
 * causal = 1).
 * prompt_rows: rows 0..prompt_rows-1 (none may be a tree row; the packer puts prefill
 * segments first) take the prompt-row kernel (f16 tensor cores, flash-attention style; its
 * arithmetic: luce/ref/attention_prefill.py), which reads each key once per tile of rows.
 * A prompt row's bits depend only on the row (its keys and position), never on the chunk,
 * its tile or the other rows; they differ from the per-row kernel's (DESIGN 5 rule 1). A
 * tree row below prompt_rows gets NaN. */
#define LUCE_ATTN_PARTITION 256
typedef struct {
    const float *q;
    const float *k_pages;
    const float *v_pages;
    float *out;
    float *workspace;
    const int32_t *qo_indptr;
    const int32_t *kv_indptr;
    const int32_t *kv_indices;
    const int32_t *kv_last_page_len;
    const int32_t *seq_slots;
    const int32_t *tree_parents;
    int64_t workspace_bytes;
    int32_t n_rows;
    int32_t n_segments;
    int32_t n_heads_q;
    int32_t n_heads_kv;
    int32_t head_dim;
    int32_t page_size;
    int32_t max_kv_len;
    int32_t causal;
    float scale;
    int32_t prompt_rows;
    int32_t *counters;      /* [n_counters] int32, zero between launches (0: no fused combine) */
    int64_t n_counters;
    int64_t n_kv_indices;   /* entries of kv_indices (0: no f16 staging of the prompt keys) */
} luce_attention_params;
int64_t luce_attention_workspace_bytes(int32_t n_rows, int32_t prompt_rows, int32_t n_heads_q,
                                       int32_t head_dim, int32_t max_kv_len, int32_t n_heads_kv,
                                       int32_t page_size, int64_t n_kv_indices);
int luce_attention(const luce_attention_params *p, void *stream);
/* The attention input fused into a decode launch (cuda/attention_rope_input.cuh; reference:
 * luce/ref/rope_kv_attention.py): luce_rope_kv(r) then luce_attention(p) with p->q =
 * r->q_out, bitwise (the same q', k', KV bytes and output), in one launch fewer; p->q and
 * r->q_out are not read nor written. Only for launches whose every live segment is one AR
 * row (its new key, at r->kv_dst, the last of its keys; padding segments of any size; else
 * the result is undefined): no prompt rows, no tree_parents, causal, head_dim 64 or 128,
 * n_pos 1 (no M-RoPE), r's rows and heads those of p; other launches are refused
 * (cudaErrorInvalidValue, nothing launched). */
int luce_rope_kv_attention(const luce_rope_kv_params *r, const luce_attention_params *p, void *stream);
/* ---- attention end ---- */

/* ---- gdn ---- */
/* Gated DeltaNet recurrent step over segments (reference: luce/ref/gdn_recurrent.py).
 * q, k [T, Hv, Dk] f32, v [T, Hv, Dv] f32, g, beta [T, Hv] f32 (rows dense), out
 * [T, Hv, Dv] f32; state [n_slots, Hv, Dk, Dv] f32 resident, updated in place. Segment s
 * owns rows qo_indptr[s]:qo_indptr[s+1], consecutive tokens of slot seq_slots[s] (an AR
 * row is a segment of one). Per token and value head, with H the slot's [Dk, Dv] state:
 * H = exp(g) H; u = beta (v - H^T k); H += k u^T; o = H^T q (cuda/gdn_common.cuh), the
 * state f32 between tokens. Padding segments (slot < 0) are skipped (nothing written); a
 * slot >= n_slots gets NaN outputs and its state is not touched. Each column's reductions
 * run in a fixed order: batch-invariant. Dk in {64, 128, 256}; Dv a multiple of 32. */
typedef struct {
    const float *q;
    const float *k;
    const float *v;
    const float *g;
    const float *beta;
    float *state;
    float *out;
    const int32_t *qo_indptr;
    const int32_t *seq_slots;
    int64_t n_slots;
    int32_t n_segments;
    int32_t n_heads;
    int32_t dk;
    int32_t dv;
} luce_gdn_recurrent_params;
int luce_gdn_recurrent(const luce_gdn_recurrent_params *p, void *stream);

/* Gated DeltaNet chunked prefill (reference: luce/ref/gdn_chunked.py). Shapes, state,
 * segments, padding and bad slots as luce_gdn_recurrent_params; start_pos [S] int32 is the
 * absolute position of each segment's first row: chunks are cut at its multiples of
 * LUCE_GDN_CHUNK (DESIGN 5 rule 3), so a prompt cut into segments on chunk multiples
 * reduces exactly like one segment; one-token chunks take the recurrent step. The state
 * is f32 between chunks. Dk in {64, 128, 256}; Dv a multiple of 32. */
#define LUCE_GDN_CHUNK 64
typedef struct {
    const float *q;
    const float *k;
    const float *v;
    const float *g;
    const float *beta;
    float *state;
    float *out;
    const int32_t *qo_indptr;
    const int32_t *seq_slots;
    const int32_t *start_pos;
    int64_t n_slots;
    int32_t n_segments;
    int32_t n_heads;
    int32_t dk;
    int32_t dv;
} luce_gdn_chunked_params;
int luce_gdn_chunked(const luce_gdn_chunked_params *p, void *stream);
/* ---- gdn end ---- */

/* ---- gdn_decode ---- */
/* The Gated DeltaNet decode chain of AR rows from the projections to the output norm, in two
 * launches (cuda/gdn_decode.cu; reference: luce/ref/gdn_decode.py), bitwise the unfused ops:
 * luce_conv1d (SiLU) on qkv [T, C] (C = 2 Hk Dk + Hv Dv, columns q | k | v) with weight
 * conv_weight [C, K] and conv_state [n_slots, K-1, C] (in place); per key head luce_l2norm
 * (l2_eps) of q and k, q then times q_scale (luce_binary mul), written to q, k [T, Hv, Dk]
 * (value head j reads key head j % Hk); v [T, Hv, Dv]; beta = sigmoid(b), g = softplus(a +
 * dt_bias) * ssm_a [T, Hv] (b, a [T, Hv]; dt_bias, ssm_a [Hv]; luce_unary / luce_binary);
 * luce_gdn_recurrent on state [n_slots, Hv, Dk, Dv] (in place) into out [T, Hv, Dv]; then
 * luce_gated_rmsnorm(out, z [T, Hv, Dv], norm_weight [Dv], rms_eps) into normed.
 * qkv, z, b and a rows lie qkv_stride, z_stride, b_stride, a_stride elements apart (each at
 * least the row's width; a smaller one is an invalid value).
 * q, k, v, g, beta, out, normed and arrivals [n_segments, Hv] int32 are the caller's
 * buffers (q, k 16-byte aligned). Segments as luce_gdn_recurrent_params (every live segment
 * an AR segment: its rows advance both states); padding segments (slot < 0) write nothing
 * but their arrivals. Dk in {64, 128, 256}; Dv a multiple of 32; 2 <= K <= 8. */
typedef struct {
    const float *qkv;
    const float *conv_weight;
    float *conv_state;
    const float *b;
    const float *a;
    const float *dt_bias;
    const float *ssm_a;
    const float *z;
    const float *norm_weight;
    float *state;
    float *q;
    float *k;
    float *v;
    float *g;
    float *beta;
    float *out;
    float *normed;
    int32_t *arrivals;
    const int32_t *qo_indptr;
    const int32_t *seq_slots;
    int64_t n_slots;
    int32_t n_segments;
    int32_t n_k_heads;
    int32_t n_v_heads;
    int32_t dk;
    int32_t dv;
    int32_t kernel_size;
    float q_scale;
    float l2_eps;
    float rms_eps;
    int64_t qkv_stride;  /* row strides in elements (>= C, Hv*Dv, Hv, Hv): column blocks of */
    int64_t z_stride;    /* one merged projection [T, W] are read in place */
    int64_t b_stride;
    int64_t a_stride;
    /* ABI 16, luce_gdn_tree_prepare only (NULL / 0 for luce_gdn_decode): conv_stage [.., C] gets
     * row r of a tree segment's qkv block at row r - stage_row0 (the tree commit's conv inputs). */
    float *conv_stage;
    int64_t stage_row0;
    /* ABI 18, luce_gdn_decode only (NULL for luce_gdn_tree_prepare): where workspace is non-NULL,
     * normed is also quantized there for luce_matmul with LUCE_MATMUL_REUSE_X (the out projection:
     * its result on normed, bitwise, without a quantize launch). normed then holds rows rows (T,
     * the workspace's padding rows past it get zeros), workspace_bytes >=
     * luce_matmul_workspace_bytes(rows, Hv * Dv), Dv <= 4096, normed and workspace 16-byte aligned,
     * and arrivals is [n_segments * (Hv + ceil(Hv * Dv / 256))] int32 (the heads', then the 256-value
     * chunks'). */
    void *workspace;
    int64_t workspace_bytes;
    int64_t rows;
} luce_gdn_decode_params;
int luce_gdn_decode(const luce_gdn_decode_params *p, void *stream);
/* Launch 1 of luce_gdn_decode for the rows of draft trees (ABI 14): q, k, v, g, beta of every
 * row of the tree segments (seq_slots: a tree segment's slot, -1 for the others) as luce_conv_tree
 * (SiLU) on qkv along tree_parents [T] (global parent rows, -1 at a root) from conv_state (read
 * only), then the pointwise ops of luce_gdn_decode, and zeroes arrivals [n_segments, Hv] where
 * non-NULL (for luce_gdn_tree_verify's norm epilogue); no state advances; state and out unused
 * (z read for its stride only). Where normed is non-NULL, the rows of padding segments get zeros
 * there (a tree block's padding rows reach the LM head; the verify writes the tree rows); where
 * conv_stage is, the tree rows' qkv rows are copied there. Rows of a tree segment: at most
 * max_tree_rows (<= 65535). luce_gdn_tree_verify and luce_gated_rmsnorm follow it. */
int luce_gdn_tree_prepare(const luce_gdn_decode_params *p, const int32_t *tree_parents, int32_t max_tree_rows,
                          void *stream);
/* ---- gdn_decode end ---- */

/* ---- gdn_tree ---- */
/* Gated DeltaNet over draft trees, exact factor capture (reference: luce/ref/gdn_tree.py,
 * DESIGN 3). Tree segment s owns rows qo_indptr[s]:qo_indptr[s+1] (n <= max_tree_rows <=
 * LUCE_GDN_TREE_MAX_ROWS) hanging off state[seq_slots[s]] (read only); tree_parents [T]
 * int32 is each row's global parent row (-1 for the segment's first row, the root; every
 * other row's parent an earlier row of its segment). Shapes as luce_gdn_recurrent_params.
 * verify: node outputs out [T, Hv, Dv] by the AR step (cuda/gdn_common.cuh) along each
 * node's root path, walking the tree depth-first with the running state on chip (states of
 * branch nodes saved while siblings remain: at most floor(log2 max_tree_rows) at once, in
 * shared memory, or in `workspace` when they do not fit: see
 * luce_gdn_tree_verify_workspace_bytes); writes the factor u [T, Hv, Dv] = beta (v -
 * (exp(g) h_parent)^T k) and, when non-NULL, copies k_out [T, Hv, Dk], g_out and beta_out
 * [T, Hv] (factors that outlive the inputs). Outputs are bitwise those of
 * luce_gdn_recurrent run along each root path. Padding segments (slot < 0) are skipped; a
 * slot >= n_slots, more than max_tree_rows rows or a malformed parent array give NaN
 * outputs and u. Dk in {64, 128, 256}; Dv a multiple of 32. */
#define LUCE_GDN_TREE_MAX_ROWS 512
typedef struct {
    const float *q;
    const float *k;
    const float *v;
    const float *g;
    const float *beta;
    const float *state;
    float *out;
    float *u_out;
    float *k_out;
    float *g_out;
    float *beta_out;
    float *workspace;
    const int32_t *qo_indptr;
    const int32_t *seq_slots;
    const int32_t *tree_parents;
    int64_t n_slots;
    int64_t workspace_bytes;
    int32_t n_segments;
    int32_t n_heads;
    int32_t dk;
    int32_t dv;
    int32_t max_tree_rows;
    /* ABI 15: with normed non-NULL, also normed [T, Hv, Dv] = luce_gated_rmsnorm(out, z, norm_weight,
     * rms_eps) of each tree's rows (z rows z_stride elements apart, >= Hv*Dv; arrivals [n_segments,
     * Hv] int32 zero before the launch, as luce_gdn_tree_prepare leaves them). */
    const float *z;
    const float *norm_weight;
    float *normed;
    int32_t *arrivals;
    int64_t z_stride;
    float rms_eps;
} luce_gdn_tree_verify_params;
/* Bytes of workspace luce_gdn_tree_verify needs (0 when saved states fit on chip); -1 for
 * bad sizes. */
int64_t luce_gdn_tree_verify_workspace_bytes(int32_t n_segments, int32_t n_heads, int32_t dk,
                                             int32_t dv, int32_t max_tree_rows);
int luce_gdn_tree_verify(const luce_gdn_tree_verify_params *p, void *stream);

/* Per-node stored states (the baseline Luce DFlash runs, `--spec ddtree`; reference:
 * luce/ref/gdn_tree.py gdn_tree_verify_baseline): node t starts from its parent's state
 * (state[seq_slots[s]] for the root, read only), takes the AR step (cuda/gdn_common.cuh)
 * and writes out [T, Hv, Dv] and its state node_states [T, Hv, Dk, Dv]: every output and
 * state bitwise luce_gdn_recurrent along the node's root path. Segments, parents, padding
 * and shapes as luce_gdn_tree_verify_params; a slot >= n_slots or a malformed parent array
 * gives NaN outputs (node_states then unspecified). */
typedef struct {
    const float *q;
    const float *k;
    const float *v;
    const float *g;
    const float *beta;
    const float *state;
    float *out;
    float *node_states;
    const int32_t *qo_indptr;
    const int32_t *seq_slots;
    const int32_t *tree_parents;
    int64_t n_slots;
    int32_t n_segments;
    int32_t n_heads;
    int32_t dk;
    int32_t dv;
} luce_gdn_tree_states_params;
int luce_gdn_tree_verify_states(const luce_gdn_tree_states_params *p, void *stream);

/* Commit by factor replay: for segment s, state[seq_slots[s]] [Hv, Dk, Dv] is advanced in
 * place through the factor rows path_rows[path_indptr[s]:path_indptr[s+1]] (root first) with
 * the AR step's own update h = exp(g) h; h += k u^T: bitwise the state luce_gdn_recurrent
 * leaves stepping the path's tokens. k [*, Hv, Dk], g [*, Hv], u [*, Hv, Dv] f32 as verify
 * wrote them. Slots < 0 are skipped, slots >= n_slots left alone. */
typedef struct {
    const float *k;
    const float *g;
    const float *u;
    float *state;
    const int32_t *path_indptr;
    const int32_t *path_rows;
    const int32_t *seq_slots;
    int64_t n_slots;
    int32_t n_segments;
    int32_t n_heads;
    int32_t dk;
    int32_t dv;
} luce_gdn_tree_commit_params;
int luce_gdn_tree_commit(const luce_gdn_tree_commit_params *p, void *stream);
/* ---- gdn_tree end ---- */

/* ---- tree_conv ---- */
/* Causal depthwise conv1d over draft trees (reference: luce/ref/tree_conv.py). Tree
 * segment s owns rows qo_indptr[s]:qo_indptr[s+1] of x [T, C] (row stride x_stride) and y
 * [T, C] (row stride y_stride); tree_parents [T] int32 global parent rows (-1: root). Row
 * t's window is its K-1 nearest ancestors' inputs (oldest first), topped up from the
 * resident state[seq_slots[s]] [K-1, C] (read only); y[t, c] = sum_j weight[c, j] *
 * window[j] with window[K-1] = x[t] (SiLU when silu != 0): bitwise luce_conv1d along the
 * row's root path. A parent outside [first row of the segment, t) gives NaN. Padding
 * segments (slot < 0) are skipped. weight [C, K] f32, 2 <= K <= 8; max_segment_rows bounds
 * every segment's row count. */
typedef struct {
    const float *x;
    const float *weight;
    float *y;
    const float *state;
    const int32_t *qo_indptr;
    const int32_t *seq_slots;
    const int32_t *tree_parents;
    int64_t n_segments;
    int64_t channels;
    int64_t x_stride;
    int64_t y_stride;
    int32_t kernel_size;
    int32_t max_segment_rows;
    int32_t silu;
} luce_conv_tree_params;
int luce_conv_tree(const luce_conv_tree_params *p, void *stream);

/* Conv state after committing a path: for segment s, state_out[out_slots[s]] [K-1, C] =
 * the last K-1 rows of concat(state_in[in_slots[s]], x[path rows]) with the path rows
 * path_rows[path_indptr[s]:path_indptr[s+1]] (global rows of x, root first). state_out may
 * be state_in (each channel reads its old window before writing). in_slots[s] < 0: skipped. */
typedef struct {
    const float *x;
    const float *state_in;
    float *state_out;
    const int32_t *path_indptr;
    const int32_t *path_rows;
    const int32_t *in_slots;
    const int32_t *out_slots;
    int64_t n_segments;
    int64_t channels;
    int64_t x_stride;
    int32_t kernel_size;
} luce_conv_tree_commit_params;
int luce_conv_tree_commit(const luce_conv_tree_commit_params *p, void *stream);
/* ---- tree_conv end ---- */

#ifdef __cplusplus
}
#endif

#endif /* LUCE_OPS_SEQUENCE_H */
