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

/* RMSNorm over the last axis (reference: luce/ref/rmsnorm.py).
 * x [rows, cols] f32, weight [cols] f32, out [rows, cols] f32 (may alias x).
 * out = x / sqrt(mean(x^2) + eps) * weight. One block per row: batch-invariant. */
typedef struct {
    const float *x;
    const float *weight;
    float *out;
    int64_t rows;
    int64_t cols;
    float eps;
} luce_rmsnorm_params;
int luce_rmsnorm(const luce_rmsnorm_params *p, void *stream);

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
 * D in {64, 128, 256}; Hq / Hkv <= 16; page_size a power of two dividing the partition. */
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

#ifdef __cplusplus
}
#endif

#endif /* LUCE_OPS_H */
