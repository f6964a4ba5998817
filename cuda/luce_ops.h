/* The one C ABI of the luce kernel library (CUDA: libluce_cuda.so, HIP: libluce_hip.so).
 *
 * Plain C: luce/_cuda.pyx includes it to marshal parameters. Every entry point takes a
 * pointer to a POD params struct and a stream, launches without synchronizing or allocating
 * (so it can be captured in a graph) and returns 0 or the runtime's error code, which
 * luce_error_string() names. Device pointers are raw addresses; shapes are in the comments.
 * Families are sections between `---- <family> ----` markers; the sequence kernels live in
 * luce_ops_sequence.h and the weight kernels in luce_ops_weights.h, included at the end.
 */
#ifndef LUCE_OPS_H
#define LUCE_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUCE_ABI_VERSION 22

int luce_abi_version(void);
const char *luce_error_string(int status);
int luce_device_synchronize(void);
/* Which decode-chain launches may overlap the kernel ahead (programmatic dependent launch, where
 * the device has it; never a change of results) while LUCE_PDL is unset: every_kind 0, the
 * matmuls and the decode attention at head dims <= 128; 1, also the norms, SwiGLU, x
 * quantization, rope and GDN launches (for small models, whose steps are launch-bound).
 * Launches after the call read it; graphs captured before keep theirs. ABI 9. */
int luce_set_decode_overlap(int every_kind);

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

/* ---- norm_quant ---- */
/* Fused producers of a quantized matmul's input (cuda/norm_quant.cu; reference:
 * luce/ref/norm_quant.py). With a workspace (luce_matmul_workspace_bytes(rows, cols) bytes,
 * 16-byte aligned; cols a multiple of 32, out 16-byte aligned) `out` is also quantized there
 * bitwise as luce_matmul quantizes its x: luce_matmul(x = out, flags LUCE_MATMUL_REUSE_X)
 * then equals luce_matmul(x = out) bitwise, one launch fewer.
 * luce_add_rmsnorm: x, residual (or NULL), sum, out [rows, cols] f32, weight [cols]:
 *   sum = x + residual (when given); out = rmsnorm(sum or x) * weight, the f32 bits of
 *   luce_pointwise add then luce_rmsnorm. Workspace optional (NULL: no quantization).
 * luce_swiglu_quant: gate, up [rows, cols] with row strides (gate|up fused: gate = base,
 *   up = base + F, strides 2F), out [rows, cols] contiguous = silu(gate) * up, the bits of
 *   luce_swiglu. Workspace required.
 * luce_gate_quant (ABI 17): o [rows, heads * head_dim] contiguous, qg [rows, heads, 2 * head_dim]
 *   (each head's query, then its gate) with rows qg_stride elements apart: out [rows, heads *
 *   head_dim] contiguous = o * sigmoid(gate), the bits of luce_binary's MUL_SIGMOID (the gated
 *   attention's output gate). Workspace required; head_dim a multiple of 4. */
typedef struct {
    const float *x;
    const float *residual;
    const float *weight;
    float *sum;
    float *out;
    void *workspace;
    int64_t workspace_bytes;
    int64_t rows;
    int64_t cols;
    float eps;
} luce_add_rmsnorm_params;
int luce_add_rmsnorm(const luce_add_rmsnorm_params *p, void *stream);

typedef struct {
    const float *gate;
    const float *up;
    float *out;
    void *workspace;
    int64_t workspace_bytes;
    int64_t rows;
    int64_t cols;
    int64_t gate_stride;
    int64_t up_stride;
} luce_swiglu_quant_params;
int luce_swiglu_quant(const luce_swiglu_quant_params *p, void *stream);

typedef struct {
    const float *o;
    const float *qg;
    float *out;
    void *workspace;
    int64_t workspace_bytes;
    int64_t rows;
    int64_t heads;
    int64_t head_dim;
    int64_t qg_stride;
} luce_gate_quant_params;
int luce_gate_quant(const luce_gate_quant_params *p, void *stream);
/* ---- norm_quant end ---- */

/* ---- rope_kv ---- */
/* Per-head RMSNorm (q_norm / k_norm [head_dim], or NULL) then rotary (as luce_rotary: NEOX,
 * plain or IMROPE sections, positions int32 [rows] or [rows, 4]) of q and k, and the paged
 * KV write of k and v (reference: luce/ref/rope_kv.py rope_kv_write), the bits of luce_rmsnorm,
 * luce_rotary and the KV gathers in one launch. q, k, v [rows, H*, head_dim] f32 at row
 * strides (elements; views into a merged projection); q's heads q_head_stride elements apart
 * (0: head_dim; 2 head_dim: the queries of a gated attention's [query | gate] heads, read in
 * place; ABI 22; luce_rope_kv_attention takes 0 or head_dim only); q_out [rows, heads_q, head_dim];
 * k_pages, v_pages [flat KV rows, heads_kv, head_dim]; kv_dst [rows] int64, the flat KV row
 * of each row (< 0: padding, nothing written). head_dim <= 1024. */
typedef struct {
    const float *q;
    const float *k;
    const float *v;
    const float *q_norm;
    const float *k_norm;
    float *q_out;
    float *k_pages;
    float *v_pages;
    const int64_t *kv_dst;
    const int32_t *positions;
    int64_t rows;
    int64_t q_stride;
    int64_t k_stride;
    int64_t v_stride;
    int64_t q_head_stride;
    int32_t heads_q;
    int32_t heads_kv;
    int32_t head_dim;
    int32_t rope_dim;
    int32_t n_pos;
    int32_t sections[4];
    float theta;
    float eps;
} luce_rope_kv_params;
int luce_rope_kv(const luce_rope_kv_params *p, void *stream);
/* ---- rope_kv end ---- */

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
 * logprobs = log-softmax over the whole row (sum of exponentials in double); its workspace
 * (ABI 10) holds each 8,192-logit slice's list and sum. */
#define LUCE_TOPK_MAX 64
typedef struct {
    const float *logits;
    int64_t *ids_out;
    float *logprobs_out;
    int64_t rows;
    int64_t vocab;
    int64_t logits_stride;
    int32_t k;
    void *workspace;          /* top-k: luce_top_k_logprobs_workspace_bytes(rows, vocab, k) bytes */
    int64_t workspace_bytes;
} luce_sampling_params;
int luce_argmax(const luce_sampling_params *p, void *stream);
int64_t luce_top_k_logprobs_workspace_bytes(int64_t rows, int64_t vocab, int32_t k);
int luce_top_k_logprobs(const luce_sampling_params *p, void *stream);
/* ---- sampling end ---- */

/* ---- step_ids ---- */
/* Token ids carried between forward calls on the device, so the next call can be launched
 * before the ids reach the host (reference: luce/ref/step_ids.py; the engine's steps ahead,
 * luce/engine/ahead.py, and a draft model's chain, luce/spec/drafters/draft_model.py). Per
 * segment s of a step: qo_indptr [S+1] (its rows), slots [S] (a slot, or -1). keep: for each
 * segment with a slot (the AR segments' ar_slots, or every live segment's seq_slots), the greedy
 * id ids [L] int64 of its last row, when that row has logits (logits_indices [L] int64), goes
 * to last_ids[slot] (int32). feed (slots: ar_slots): each AR segment's row of token_ids [T]
 * int32 takes last_ids[slot] (0 when outside [0, vocab): a diverged row's -1). One block;
 * S <= 65535. */
typedef struct {
    const int64_t *ids;
    const int64_t *logits_indices;
    const int32_t *qo_indptr;
    const int32_t *slots;
    int32_t *last_ids;
    int32_t *token_ids;
    int32_t n_logits;
    int32_t n_segments;
    int32_t vocab;
} luce_step_ids_params;
int luce_keep_ids(const luce_step_ids_params *p, void *stream);
int luce_feed_ids(const luce_step_ids_params *p, void *stream);
/* ---- step_ids end ---- */

/* ---- sample_rng ---- */
/* Seeded sampling of logits rows [rows, vocab] f32, row stride logits_stride (reference:
 * luce/ref/sample_rng.py = the engine's host sampler without penalties): per row the top_k
 * candidates (logit descending, id ascending), temperature, top-p, min-p and the draw
 * uniform(seed, position) of luce/engine/rng.py, in float64 with the host's operations and
 * order, so ids_out [rows] int64 equals the host sampler's token bit for bit. temperature 0 is
 * greedy (top_k ignored); otherwise the caller guarantees 1 <= top_k <= LUCE_SAMPLE_TOPK_MAX,
 * 0 < top_p <= 1, 0 <= min_p <= 1. A row holding a NaN gets -1. rows <= 65535; workspace:
 * luce_sample_rng_workspace_bytes(rows, vocab) bytes. */
#define LUCE_SAMPLE_TOPK_MAX 64
typedef struct {
    const float *logits;
    const double *temperature;
    const int32_t *top_k;
    const double *top_p;
    const double *min_p;
    const uint64_t *seed;
    const int64_t *position;
    int64_t *ids_out;
    void *workspace;
    int64_t workspace_bytes;
    int64_t rows;
    int64_t vocab;
    int64_t logits_stride;
} luce_sample_rng_params;
int64_t luce_sample_rng_workspace_bytes(int64_t rows, int64_t vocab);
int luce_sample_rng(const luce_sample_rng_params *p, void *stream);
/* ---- sample_rng end ---- */

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

/* ---- pointwise ---- */
/* Pointwise maths (reference: luce/ref/pointwise.py). binary: out = a op b in f32 with
 * numpy broadcasting: out [shape[0..3]] dense, a / b element strides per dim (0 where the
 * operand broadcasts, or any stride: a view); b == NULL uses b_scalar. MUL_SIGMOID: a *
 * sigmoid(b), the sigmoid the unary's (double, rounded once): the bits of mul(a, sigmoid(b)). unary: out[i] = op(x[i]) computed in double,
 * rounded once (x, out [n] f32; out may equal x). l2norm: x, out [rows, cols] f32,
 * out = x / sqrt(sum(x^2) + eps) per row in double (one warp per row: batch-invariant). */
#define LUCE_POINTWISE_MAX_DIMS 4
#define LUCE_PW_ADD 0
#define LUCE_PW_MUL 1
#define LUCE_PW_MUL_SIGMOID 2
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

#ifdef __cplusplus
}
#endif

#include "luce_ops_sequence.h"
#include "luce_ops_weights.h"

#endif /* LUCE_OPS_H */
