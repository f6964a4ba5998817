/* The one C ABI of the luce kernel library (CUDA: libluce_cuda.so, HIP: libluce_hip.so).
 *
 * Plain C: luce/_cuda.pyx includes it to marshal parameters. Every entry point takes a
 * pointer to a POD params struct and a stream, launches without synchronizing or allocating
 * (so it can be captured in a graph) and returns 0 or the runtime's error code, which
 * luce_error_string() names. Device pointers are raw addresses; shapes are in the comments.
 */
#ifndef LUCE_OPS_H
#define LUCE_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUCE_ABI_VERSION 1

int luce_abi_version(void);
const char *luce_error_string(int status);
int luce_device_synchronize(void);

/* ---- rmsnorm ---- */
/* RMSNorm over the last axis (reference: luce/ref/rmsnorm.py).
 * x [rows, cols] f32, weight [cols] f32, out [rows, cols] f32 (may alias x).
 * out = x / sqrt(mean(x^2) + eps) * weight. One warp (cols <= 1024) or one block per row,
 * chosen by cols alone: batch-invariant. */
typedef struct {
    const float *x;
    const float *weight;
    float *out;
    int64_t rows;
    int64_t cols;
    float eps;
} luce_rmsnorm_params;
int luce_rmsnorm(const luce_rmsnorm_params *p, void *stream);

/* Residual add fused with RMSNorm (reference: luce/ref/rmsnorm.py rmsnorm_residual).
 * x, residual [rows, cols] f32 -> sum_out = x + residual (f32) and
 * out = sum_out / sqrt(mean(sum_out^2) + eps) * weight, both [rows, cols] f32.
 * sum_out and out may each alias x or residual (element-wise in place), not each other. */
typedef struct {
    const float *x;
    const float *residual;
    const float *weight;
    float *sum_out;
    float *out;
    int64_t rows;
    int64_t cols;
    float eps;
} luce_rmsnorm_residual_params;
int luce_rmsnorm_residual(const luce_rmsnorm_residual_params *p, void *stream);
/* ---- rmsnorm end ---- */

/* ---- gated_rmsnorm ---- */
/* Gated RMSNorm, the GDN output norm (reference: luce/ref/gated_rmsnorm.py).
 * x, z [rows, cols] f32, weight [cols] f32 -> out [rows, cols] f32 (may alias x or z):
 * out = x / sqrt(mean(x^2) + eps) * weight * silu(z). One warp per row: batch-invariant. */
typedef struct {
    const float *x;
    const float *z;
    const float *weight;
    float *out;
    int64_t rows;
    int64_t cols;
    float eps;
} luce_gated_rmsnorm_params;
int luce_gated_rmsnorm(const luce_gated_rmsnorm_params *p, void *stream);
/* ---- gated_rmsnorm end ---- */

/* ---- rotary ---- */
/* NEOX rotary on dims [0, rope_dim) of each head, plain or M-RoPE (IMROPE) sections
 * (reference: luce/ref/rotary.py rope). Head h of row t lives at
 * x + t * x_row_stride + h * x_head_stride (elements), head_dim contiguous f32; out likewise
 * with its own strides (out may equal x: in place). Dims rope_dim..head_dim are copied.
 * positions: int32 [rows] (n_pos = 1) or [rows, 4] (n_pos = 4: t, h, w, e).
 * sections all zero: plain rotary (n_pos must be 1); else the 4 IMROPE section sizes.
 * Angles and their cos/sin are computed in double, the rotation in f32. */
typedef struct {
    const float *x;
    float *out;
    const int32_t *positions;
    int64_t rows;
    int64_t x_row_stride;
    int64_t x_head_stride;
    int64_t out_row_stride;
    int64_t out_head_stride;
    int32_t heads;
    int32_t head_dim;
    int32_t rope_dim;
    int32_t n_pos;
    int32_t sections[4];
    float theta;
} luce_rotary_params;
int luce_rotary(const luce_rotary_params *p, void *stream);
/* ---- rotary end ---- */

/* ---- swiglu ---- */
/* SwiGLU (reference: luce/ref/swiglu.py): out = silu(gate) * up, element-wise f32.
 * gate, up, out [rows, cols] with row strides in elements (a fused gate|up projection
 * [rows, 2F] is gate = base, up = base + F, strides 2F). out may alias gate or up. */
typedef struct {
    const float *gate;
    const float *up;
    float *out;
    int64_t rows;
    int64_t cols;
    int64_t gate_stride;
    int64_t up_stride;
    int64_t out_stride;
} luce_swiglu_params;
int luce_swiglu(const luce_swiglu_params *p, void *stream);
/* ---- swiglu end ---- */

/* ---- conv1d ---- */
/* Causal depthwise conv1d with carried state, then SiLU (reference: luce/ref/conv1d.py).
 * Segment s owns rows qo_indptr[s]:qo_indptr[s+1] of x [T, C] (row stride x_stride) and y
 * [T, C] (row stride y_stride; must not overlap x). Its window is state_in[in_slots[s]]
 * [K-1, C] (oldest first) followed by its rows; y[t, c] = sum_j weight[c, j] *
 * window[t + j, c] (then SiLU when silu != 0); the last K-1 window rows are written to
 * state_out[out_slots[s]]. state_out may be state_in (in place) as long as no segment's
 * out slot is another segment's in slot. Segments with in_slots[s] < 0 are padding
 * (nothing written). weight [C, K] f32, 2 <= K <= 8. max_segment_rows bounds every
 * segment's row count (sizes the grid; rows past it are not computed). */
typedef struct {
    const float *x;
    const float *weight;
    float *y;
    const float *state_in;
    float *state_out;
    const int32_t *qo_indptr;
    const int32_t *in_slots;
    const int32_t *out_slots;
    int64_t n_segments;
    int64_t channels;
    int64_t x_stride;
    int64_t y_stride;
    int32_t kernel_size;
    int32_t max_segment_rows;
    int32_t silu;
} luce_conv1d_params;
int luce_conv1d(const luce_conv1d_params *p, void *stream);
/* ---- conv1d end ---- */

/* ---- sampling ---- */
/* Greedy and top-k log-probs over logits [rows, vocab] f32, row stride logits_stride
 * (reference: luce/ref/sampling.py). Ties go to the lowest token id. A row holding a NaN
 * gets id -1 everywhere (logprobs NaN) so the caller can name the diverged rows.
 * rows <= 65535. argmax uses ids_out as scratch (it is zeroed, then written).
 * top-k: 1 <= k <= LUCE_TOPK_MAX, ids_out / logprobs_out [rows, k], best first;
 * logprobs = log-softmax over the whole row (sum of exponentials in double). */
#define LUCE_TOPK_MAX 64
typedef struct {
    const float *logits;
    int64_t *ids_out;
    float *logprobs_out;
    int64_t rows;
    int64_t vocab;
    int64_t logits_stride;
    int32_t k;
} luce_sampling_params;
int luce_argmax(const luce_sampling_params *p, void *stream);
int luce_top_k_logprobs(const luce_sampling_params *p, void *stream);
/* ---- sampling end ---- */

/* ---- gather ---- */
/* Row gather/scatter copy for KV, recurrent-state and feature commit and snapshots
 * (reference: luce/ref/gather.py). For i in [0, n): copies row_bytes bytes from
 * src + src_rows[i] * src_stride to dst + dst_rows[i] * dst_stride (byte strides; a NULL
 * index array means row i). A negative index on either side skips copy i (padding).
 * Destination rows must not overlap each other or any source row read by another copy. */
typedef struct {
    const void *src;
    void *dst;
    const int64_t *src_rows;
    const int64_t *dst_rows;
    int64_t n;
    int64_t row_bytes;
    int64_t src_stride;
    int64_t dst_stride;
} luce_gather_params;
int luce_gather(const luce_gather_params *p, void *stream);
/* ---- gather end ---- */

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
 * luce_attention_workspace_bytes(n_rows, Hq, D, max_kv_len) bytes.
 * D in {64, 128, 256}; Hq / Hkv <= 16; page_size a power of two dividing the partition.
 * Tree rows (reference: luce/ref/tree_attention.py): tree_parents [n_rows] int32 is each
 * row's global parent row (-1 for roots and ordinary rows; NULL: no trees). A row with a
 * parent belongs to a tree segment of n rows whose scratch K/V sit at KV index P + j
 * (P = kv_len - n, j the row's index in the segment); it attends KV 0..P-1 and then
 * P + a for each node a on its root path, root first. Partitions are cut on that logical
 * key index, so the row is bitwise the AR row at position P + depth once its path is
 * committed. Tree roots and rows without a parent follow the ordinary rule (trees need
 * causal = 1). */
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
} luce_attention_params;
int64_t luce_attention_workspace_bytes(int32_t n_rows, int32_t n_heads_q, int32_t head_dim,
                                       int32_t max_kv_len);
int luce_attention(const luce_attention_params *p, void *stream);
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

/* ---- matmul ---- */
/* Matmul fused with GGUF dequant (reference: luce/ref/matmul.py on the weights decoded by
 * luce.gguf.quants.dequantize): y [rows, n] f32 = x [rows, k] f32 @ W^T (+ bias [n] f32).
 * W [n, k]: row r is luce_matmul_row_bytes(qtype, k) bytes of GGUF blocks at
 * w + r * row_bytes; qtype is the ggml type id (LUCE_QT_*). Q4_K, Q5_K, Q6_K and IQ4_XS need
 * k % 256 == 0, Q8_0 and Q5_0 k % 32 == 0; float types any k.
 * Block types first quantize x to 16-bit integers (one f32 scale per row and 256 values, plus
 * f32 sums of every 16 values) into `workspace`; weight x activation dot products of each
 * 32-value group are exact integers (tensor cores), then combined in f32 in a fixed order.
 * With LUCE_MATMUL_REUSE_X in flags the workspace already holds this x (a previous call with
 * the same x, rows and k) and the quantization step is skipped. Float types (F32, F16, BF16)
 * multiply x as is (SIMT) and need no workspace.
 * Batch invariance: each output is reduced over k in an order fixed by k alone, so a row's
 * result is bitwise the same whatever rows share the call, whatever `path` or `tune`.
 * `path` (LUCE_MATMUL_DECODE / _PREFILL) and `tune` (0 or 1: automatic; 2: two row tiles of 16
 * per block) only pick the launch shape. x and workspace 16-byte aligned; y must not overlap
 * x, w or workspace. */
#define LUCE_QT_F32 0
#define LUCE_QT_F16 1
#define LUCE_QT_Q5_0 6
#define LUCE_QT_Q8_0 8
#define LUCE_QT_Q4_K 12
#define LUCE_QT_Q5_K 13
#define LUCE_QT_Q6_K 14
#define LUCE_QT_IQ4_XS 23
#define LUCE_QT_BF16 30
#define LUCE_MATMUL_DECODE 0
#define LUCE_MATMUL_PREFILL 1
#define LUCE_MATMUL_REUSE_X 1
typedef struct {
    const float *x;
    const void *w;
    const float *bias;
    float *y;
    void *workspace;
    int64_t workspace_bytes;
    int64_t rows;
    int64_t n;
    int64_t k;
    int32_t qtype;
    int32_t path;
    int32_t flags;
    int32_t tune;
} luce_matmul_params;
/* Bytes of workspace a call with these rows and k needs (0 is enough for float types). */
int64_t luce_matmul_workspace_bytes(int64_t rows, int64_t k);
/* Bytes of one weight row of k values of qtype; -1 if unsupported or k is not whole blocks. */
int64_t luce_matmul_row_bytes(int32_t qtype, int64_t k);
int luce_matmul(const luce_matmul_params *p, void *stream);
/* ---- matmul end ---- */

/* ---- embedding ---- */
/* Rows of a quantized table (reference: luce/ref/embedding.py): out[t, :] = the decoded row
 * token_ids[t] of table [n_rows, cols] (GGUF blocks of ggml type qtype, LUCE_QT_*, row r at
 * table + r * row_bytes), bitwise luce.gguf.quants.dequantize. out [n_tokens, cols] f32 with
 * row stride out_stride (elements). An id outside [0, n_rows) gives a NaN row.
 * n_tokens <= 65535; row_bytes must equal luce_embedding_row_bytes(qtype, cols). */
typedef struct {
    const void *table;
    const int32_t *token_ids;
    float *out;
    int64_t n_rows;
    int64_t cols;
    int64_t row_bytes;
    int64_t n_tokens;
    int64_t out_stride;
    int32_t qtype;
} luce_embedding_params;
/* Bytes of one table row of cols values of qtype; -1 if unsupported or not whole blocks. */
int64_t luce_embedding_row_bytes(int32_t qtype, int64_t cols);
int luce_embedding(const luce_embedding_params *p, void *stream);
/* ---- embedding end ---- */

/* ---- pointwise ---- */
/* Pointwise maths (reference: luce/ref/pointwise.py). binary: out = a op b in f32 with
 * numpy broadcasting: out [shape[0..3]] dense, a / b element strides per dim (0 where the
 * operand broadcasts); b == NULL uses b_scalar. unary: out[i] = op(x[i]) computed in double,
 * rounded once (x, out [n] f32; out may equal x). l2norm: x, out [rows, cols] f32,
 * out = x / sqrt(sum(x^2) + eps) per row in double (one warp per row: batch-invariant). */
#define LUCE_POINTWISE_MAX_DIMS 4
#define LUCE_PW_ADD 0
#define LUCE_PW_MUL 1
#define LUCE_PW_SILU 0
#define LUCE_PW_SIGMOID 1
#define LUCE_PW_SOFTPLUS 2
#define LUCE_PW_EXP 3
typedef struct {
    const float *a;
    const float *b;
    float *out;
    int64_t shape[LUCE_POINTWISE_MAX_DIMS];
    int64_t a_strides[LUCE_POINTWISE_MAX_DIMS];
    int64_t b_strides[LUCE_POINTWISE_MAX_DIMS];
    float b_scalar;
    int32_t op;
} luce_binary_params;
int luce_binary(const luce_binary_params *p, void *stream);

typedef struct {
    const float *x;
    float *out;
    int64_t n;
    int32_t op;
} luce_unary_params;
int luce_unary(const luce_unary_params *p, void *stream);

typedef struct {
    const float *x;
    float *out;
    int64_t rows;
    int64_t cols;
    float eps;
} luce_l2norm_params;
int luce_l2norm(const luce_l2norm_params *p, void *stream);
/* ---- pointwise end ---- */

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
} luce_gdn_tree_verify_params;
/* Bytes of workspace luce_gdn_tree_verify needs (0 when saved states fit on chip); -1 for
 * bad sizes. */
int64_t luce_gdn_tree_verify_workspace_bytes(int32_t n_segments, int32_t n_heads, int32_t dk,
                                             int32_t dv, int32_t max_tree_rows);
int luce_gdn_tree_verify(const luce_gdn_tree_verify_params *p, void *stream);

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

#endif /* LUCE_OPS_H */
