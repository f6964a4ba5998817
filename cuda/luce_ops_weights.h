/* Kernels over quantized GGUF weights: matmul fused with dequant, embedding rows.
 * Part of the one C ABI: included by cuda/luce_ops.h (read its header comment). */
#ifndef LUCE_OPS_WEIGHTS_H
#define LUCE_OPS_WEIGHTS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
 * the same x, rows and k) and the quantization step is skipped. With LUCE_MATMUL_X_ONCE (and
 * not REUSE_X) the caller promises that no later call reuses this call's quantized x: a call
 * that takes the one-row kernel (one decode row; cuda/matmul_gemv_launch.cuh) then quantizes x
 * in its own lanes (cuda/matmul_gemv_x.cuh; the same bits, one launch fewer) and leaves the
 * workspace unwritten (it is still required: other calls quantize into it as without the flag).
 * Set it only where no REUSE_X call follows on this workspace (luce/ops/cuda_backend.py: a
 * matmuls call with one block-type weight). Float types (F32, F16, BF16)
 * multiply x as is (SIMT) and need no workspace.
 * Batch invariance: each output is reduced over k in an order fixed by k alone, so a row's
 * result is bitwise the same whatever rows share the call, whatever `path` or `tune`.
 * `path` (LUCE_MATMUL_DECODE / _PREFILL) and `tune` (0: automatic, by measured speed; 1: the
 * one-wave ring grid at every row count; 2: two row tiles of 16 per block; 3: one block per
 * row tile everywhere, the launch before the ring, kept for comparison; 4: as 0 without the
 * one-row dp4a kernel and the few-row kernel; 5: the one-row kernel for every block type at one row; 6: as 5
 * with twice the rows in flight a lane (IQ4_XS: twice the rows a staged batch); 7: as 5 with
 * IQ4_XS in the one-row kernel's register form (before its staged form); 8: as 5 with IQ4_XS's
 * staged form on the three-prmt table lookup and Q4_K, Q5_K, Q6_K in their staged form where it
 * runs (tune 0 takes it for Q4_K / Q5_K / Q6_K calls the register form does not take); 9: IQ4_XS, Q5_K, Q4_K and Q6_K decode calls of 2..8
 * rows in the few-row kernel (cuda/matmul_gemv_rows.cuh) where it runs, else as 0; 10: as 0 with those calls in the tile
 * kernel (as at 4); 12: decode calls of 9+ rows in the wide-token tile kernel (cuda/matmul_rows.cuh)
 * where it fits, else as 0; 13 / 14: as 12 with the k parts shared by a cluster of 2 / 4 blocks
 * (sm_90 and up; elsewhere as 12); 15: as 12 with the cluster size counted from the launch's
 * blocks, the device's resident blocks and k; a tune-0 call takes LUCE_MATMUL_TUNE where the
 * environment sets it, for benchmarks) only pick
 * the kernel and its launch shape. The block-type kernel may start before the kernel ahead of it in the stream ends
 * (cuda/pdl.cuh): until that kernel has finished it reads only the weights. x and workspace
 * 16-byte aligned; y must not overlap x, w or workspace. */
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
#define LUCE_MATMUL_X_ONCE 2
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
/* luce_matmul(a) then luce_matmul(b) (b's flags hold LUCE_MATMUL_REUSE_X: the same x, rows and
 * k, a's workspace), the same bits; one decode row of a (Q4_K or Q5_K) and b (Q6_K) that both
 * take the one-row kernel at tune 0 run as one launch (cuda/matmul_gemv_pair.cuh; ABI 11). */
int luce_matmul_pair(const luce_matmul_params *a, const luce_matmul_params *b, void *stream);
/* Prompt rows (DESIGN 5 rule 1; cuda/matmul_prefill.cu, reference luce/ref/matmul_prefill.py):
 * the same product for block types with x quantized to 8 bits per 32 values (ggml's q8_1),
 * int8 tensor cores over 64-token tiles; |error| against f32 within
 * sum_k |W[r, k]| * max|x[t, block of k]| / 254 (+ f32 rounding). Same params; `path` is
 * ignored, `tune` 0 picks the block shape, 2, 4 or 8 sets its warps (the same bits); REUSE_X as
 * above (its own workspace), X_ONCE ignored. Batch-invariant: one fixed f32
 * chain over k per output element. Float types are refused (use luce_matmul). The f16 GEMM
 * (cuda/matmul_prefill_f16.cu, taken unless LUCE_PREFILL_GEMM=int8) takes tunes 2..80 as launch
 * shapes (the same bits) and 81: k split over a cluster of blocks, Z by the matrix (its own bits,
 * still per row; the DFlash draft's own weights); the int8 GEMM takes 81 as 0. */
int64_t luce_matmul_prefill_workspace_bytes(int64_t rows, int64_t k);
int luce_matmul_prefill(const luce_matmul_params *p, void *stream);
/* The k parts tune 81 runs for an [n, k] matrix of block type qtype on this device (ABI 21): 1 where
 * it does not split (the int8 GEMM, no sm_90a code for the device, no such clusters), 0 for a float
 * type or k not whole blocks. */
int luce_matmul_prefill_split_k(int32_t qtype, int64_t n, int64_t k);
#define LUCE_PREFILL_TUNE_SPLIT_K 81  /* the tune of the split above (luce/models/dflash_routing.py: SPLIT_K_TUNE) */
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

#ifdef __cplusplus
}
#endif

#endif /* LUCE_OPS_WEIGHTS_H */
