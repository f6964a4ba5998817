/* Quantized matmul of the cpu backend: shared job description and the per-path kernel table.
 *
 * y [T, N] = x [T, K] @ W^T (+ bias) for W [N, K] in GGUF blocks. Block-type weights read x
 * quantized per block to int8 (luce/cpu/quantize_act.c): K-quants and IQ4_XS per 256 values
 * (scale dx, int8 qs, int16 sums of 16), Q8_0 and Q5_0 per 32. Float weights read x as f32.
 * A tile kernel computes every row t < T for output columns [n0, n1): each output is
 * computed by one thread, its reduction over K in the canonical order of blocks.h.
 */
#ifndef LUCE_CPU_MATMUL_H
#define LUCE_CPU_MATMUL_H

#include <stdint.h>

#include "blocks.h"

typedef struct {
    const float *x;          /* [T, K] f32 (float weights) */
    const int8_t *qs;        /* [T, K] int8 quantized activations */
    const float *dx;         /* [T, K / block] activation scales */
    const int16_t *bsums;    /* [T, K / 16] sums of 16 consecutive qs */
    int64_t T, K;
    const uint8_t *w;        /* [N, row_bytes] weight blocks */
    int64_t row_bytes;
    const float *bias;       /* [N] or NULL */
    float *y;                /* [T, ldy] */
    int64_t ldy;
} mm_job;

typedef void (*mm_tile_fn)(const mm_job *job, int64_t n0, int64_t n1);

/* kernel index of a ggml type, -1 if the cpu backend lacks it */
enum { MM_F32, MM_F16, MM_BF16, MM_Q8_0, MM_Q5_0, MM_Q4_K, MM_Q5_K, MM_Q6_K, MM_IQ4_XS, MM_KINDS };

static inline int mm_kind(int qtype) {
    switch (qtype) {
    case QT_F32: return MM_F32;
    case QT_F16: return MM_F16;
    case QT_BF16: return MM_BF16;
    case QT_Q8_0: return MM_Q8_0;
    case QT_Q5_0: return MM_Q5_0;
    case QT_Q4_K: return MM_Q4_K;
    case QT_Q5_K: return MM_Q5_K;
    case QT_Q6_K: return MM_Q6_K;
    case QT_IQ4_XS: return MM_IQ4_XS;
    default: return -1;
    }
}

/* activation format a kind reads: 0 f32, 1 per-256 int8 (Q8_K), 2 per-32 int8 (Q8_0) */
enum { ACT_F32, ACT_Q8_K, ACT_Q8_32 };

static inline int mm_act_format(int kind) {
    if (kind <= MM_BF16) return ACT_F32;
    return (kind == MM_Q8_0 || kind == MM_Q5_0) ? ACT_Q8_32 : ACT_Q8_K;
}

/* values per block and bytes per block of a kind */
static inline int mm_block_values(int kind) {
    return kind <= MM_BF16 ? 1 : (kind == MM_Q8_0 || kind == MM_Q5_0) ? 32 : 256;
}

static inline int mm_block_bytes(int kind) {
    static const int bytes[MM_KINDS] = {4, 2, 2, BYTES_Q8_0, BYTES_Q5_0, BYTES_Q4_K,
                                        BYTES_Q5_K, BYTES_Q6_K, BYTES_IQ4_XS};
    return bytes[kind];
}

/* one table per instruction-set path; a NULL entry falls back to the portable kernel */
extern const mm_tile_fn mm_tiles_portable[MM_KINDS];
extern const mm_tile_fn mm_tiles_avx2[MM_KINDS];
extern const mm_tile_fn mm_tiles_avx512[MM_KINDS];

/* activation quantization (quantize_act.c): row-major x [T, K] in blocks of `block` values, each
 * by block_fn: the portable C or the AVX2 / AVX-512 one, which compute the same bits
 * (quantize_act_avx2.c / _avx512.c; quantize_*_built say whether each was compiled in) */
typedef void (*quantize_block_fn)(const float *x, int n, int8_t *q, float *d, int16_t *sums);
void quantize_block_portable(const float *x, int n, int8_t *q, float *d, int16_t *sums);
void quantize_block_avx2(const float *x, int n, int8_t *q, float *d, int16_t *sums);
void quantize_block_avx512(const float *x, int n, int8_t *q, float *d, int16_t *sums);
void quantize_rows(quantize_block_fn block_fn, const float *x, int64_t T, int64_t K, int block, int8_t *qs,
                   float *dx, int16_t *bsums);
extern const int quantize_avx512_built, quantize_avx2_built;

#endif
