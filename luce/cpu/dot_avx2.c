/* AVX2 matmul tiles: bitwise the portable kernels (dot_portable.c), faster.
 *
 * A tile is up to 8 (row, column) pairs. Per 256-value block, each column's block is unpacked
 * once (unpack.h) and dotted with every row of the tile by maddubs/madd into an 8-lane int32
 * vector per pair; 8 such vectors are summed lane-wise into one vector of 8 exact block sums
 * (reduce8), and the float combine of blocks.h runs on the 8 pairs at once: the same f32
 * operations, in the same order, as the portable kernel per output. */
#include <stdlib.h>

#include "matmul.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "decode.h"
#include "gemv.h"
#include "unpack_simd.h"

const int mm_avx2_built = 1;

#define PAIRS 8
#define GEMV_MAX_ROWS 64   /* rows up to which the decode kernels (gemv_avx2.c) take Q4_K / Q6_K */

/* raw = sum_g sc[g] sum_{i in g} w_i qx_i over a 256-value block, as 8 int32 lanes */
static inline __m256i dot_unsigned_256(const unpacked_block *u, const __m256i scv[8], const int8_t *qx) {
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        __m256i w = _mm256_load_si256((const __m256i *)(u->w + 32 * c));
        __m256i x = _mm256_loadu_si256((const __m256i *)(qx + 32 * c));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scv[c]));
    }
    return acc;
}

static inline __m256i dot_signed_256(const unpacked_block *u, const __m256i scv[8], const int8_t *qx) {
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        __m256i w = _mm256_load_si256((const __m256i *)(u->w + 32 * c));
        __m256i x = _mm256_loadu_si256((const __m256i *)(qx + 32 * c));
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scv[c]));
    }
    return acc;
}

/* rows per tile for T rows: 1 alone, else up to 4 (columns per tile = PAIRS / rows) */
static inline int tile_rows(int64_t T) { return T == 1 ? 1 : (T >= 4 ? 4 : (int)T); }

static void tile_k256(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    if (j->T <= GEMV_MAX_ROWS && (kind == MM_Q4_K || kind == MM_Q6_K)) {
        (kind == MM_Q4_K ? gemv_q4_k_avx2 : gemv_q6_k_avx2)(j, n0, n1);
        return;
    }
    const int64_t T = j->T, K = j->K, nb = K / QK_K;
    const int bb = mm_block_bytes(kind), R = tile_rows(T), C = PAIRS / R;
    const int has_min = kind == MM_Q4_K || kind == MM_Q5_K, signed_w = kind == MM_IQ4_XS;
    const int minus_s1 = kind == MM_Q6_K;
    const int64_t acc_len = ((T + R - 1) / R) * R * C;
    unpacked_block *ub = aligned_alloc(64, sizeof(unpacked_block) * (size_t)C);
    float *acc = aligned_alloc(32, sizeof(float) * (size_t)(acc_len + PAIRS));
    /* lanes of pairs outside the tile hold whatever they held: independent, never stored */
    __m256i raw[PAIRS], s1[PAIRS], scv[PAIRS][8];
    float dxd[PAIRS], dxm[PAIRS];
    memset(raw, 0, sizeof raw);
    memset(s1, 0, sizeof s1);
    memset(dxd, 0, sizeof dxd);
    memset(dxm, 0, sizeof dxm);
    for (int64_t c0 = n0; c0 < n1; c0 += C) {
        const int nc = (int)(n1 - c0 < C ? n1 - c0 : C);
        memset(acc, 0, sizeof(float) * (size_t)acc_len);
        for (int64_t b = 0; b < nb; b++) {
            for (int c = 0; c < nc; c++) {
                const uint8_t *blk = j->w + (c0 + c) * j->row_bytes + b * bb;
                prefetch_next_tile(blk, C * j->row_bytes, bb);
                unpack_kind(kind, blk, &ub[c]);
                for (int g = 0; g < 8; g++) scv[c][g] = group_scales(ub[c].sc, 2 * g, kind != MM_Q6_K);
            }
            for (int64_t r0 = 0; r0 < T; r0 += R) {
                const int nr = (int)(T - r0 < R ? T - r0 : R);
                for (int r = 0; r < nr; r++) {
                    const int8_t *qx = j->qs + (r0 + r) * K + b * QK_K;
                    const float dx = j->dx[(r0 + r) * nb + b];
                    const __m256i bsv = _mm256_loadu_si256((const __m256i *)(j->bsums + (r0 + r) * (K / 16) + b * 16));
                    for (int c = 0, p = r * C; c < nc; c++, p++) {
                        raw[p] = signed_w ? dot_signed_256(&ub[c], scv[c], qx) : dot_unsigned_256(&ub[c], scv[c], qx);
                        s1[p] = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)ub[c].a), bsv);
                        dxd[p] = dx * ub[c].d;
                        dxm[p] = -(dx * ub[c].dmin);
                    }
                }
                __m256i isum = reduce8(raw);
                if (minus_s1) isum = _mm256_sub_epi32(isum, reduce8(s1));
                float *a = acc + r0 * C;
                __m256 av = _mm256_loadu_ps(a);
                av = _mm256_fmadd_ps(_mm256_loadu_ps(dxd), _mm256_cvtepi32_ps(isum), av);
                if (has_min) av = _mm256_fmadd_ps(_mm256_loadu_ps(dxm), _mm256_cvtepi32_ps(reduce8(s1)), av);
                _mm256_storeu_ps(a, av);
            }
        }
        for (int64_t r0 = 0; r0 < T; r0 += R) {
            const int nr = (int)(T - r0 < R ? T - r0 : R);
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++) store_out(j, r0 + r, c0 + c, acc[r0 * C + r * C + c]);
        }
    }
    free(ub);
    free(acc);
}

/* ---- 32-value blocks (Q8_0, Q5_0): eight consecutive blocks of one pair reduce together ---- */

static void tile_k32(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    if (j->T == 1) {
        gemv_k32_avx2(j, n0, n1, kind == MM_Q5_0);
        return;
    }
    const int64_t T = j->T, K = j->K, nb = K / QK_32;
    const int bb = mm_block_bytes(kind), q5 = kind == MM_Q5_0;
    const __m256i ones = _mm256_set1_epi16(1);
    float *acc = malloc(sizeof(float) * (size_t)T);
    __m256i w[PAIRS], v[PAIRS];
    float d[PAIRS];
    memset(v, 0, sizeof v);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = j->w + n * j->row_bytes;
        for (int64_t t = 0; t < T; t++) acc[t] = 0.0f;
        for (int64_t b0 = 0; b0 < nb; b0 += PAIRS) {
            const int m = (int)(nb - b0 < PAIRS ? nb - b0 : PAIRS);
            for (int i = 0; i < m; i++) {   /* unsigned values (Q5_0: q + 16) or signed (Q8_0) */
                const uint8_t *blk = row + (b0 + i) * bb;
                w[i] = q5 ? q5_0_values(blk) : _mm256_loadu_si256((const __m256i *)(blk + 2));
                d[i] = _cvtsh_ss(load_u16(blk));
            }
            for (int64_t t = 0; t < T; t++) {
                const int8_t *qx = j->qs + t * K + b0 * QK_32;
                for (int i = 0; i < m; i++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(qx + i * QK_32));
                    __m256i p = q5 ? _mm256_maddubs_epi16(w[i], x)
                                   : _mm256_maddubs_epi16(_mm256_sign_epi8(w[i], w[i]), _mm256_sign_epi8(x, w[i]));
                    v[i] = _mm256_madd_epi16(p, ones);
                }
                int32_t sums[PAIRS];
                _mm256_storeu_si256((__m256i *)sums, reduce8(v));
                const int16_t *bs = j->bsums + t * (K / 16) + 2 * b0;
                const float *dx = j->dx + t * nb + b0;
                float a = acc[t];
                for (int i = 0; i < m; i++) {
                    int32_t isum = q5 ? sums[i] - 16 * (bs[2 * i] + bs[2 * i + 1]) : sums[i];
                    a = combine_block(a, dx[i], d[i], isum);
                }
                acc[t] = a;
            }
        }
        for (int64_t t = 0; t < T; t++) store_out(j, t, n, acc[t]);
    }
    free(acc);
}

/* ---- float weights: the canonical 16 lanes as two 8-lane halves ---- */

static inline __m256 load8_weight(int kind, const uint8_t *row, int64_t k, int64_t K) {
    if (k + 8 <= K) {
        if (kind == MM_F32) return _mm256_loadu_ps((const float *)(row + 4 * k));
        __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * k));
        if (kind == MM_F16) return _mm256_cvtph_ps(h);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    float tmp[8] = {0};
    for (int i = 0; i < 8 && k + i < K; i++) {
        if (kind == MM_F32) memcpy(&tmp[i], row + 4 * (k + i), 4);
        else if (kind == MM_F16) tmp[i] = f16_to_f32(load_u16(row + 2 * (k + i)));
        else tmp[i] = bf16_to_f32(load_u16(row + 2 * (k + i)));
    }
    return _mm256_loadu_ps(tmp);
}

static inline __m256 load8_x(const float *x, int64_t k, int64_t K) {
    if (k + 8 <= K) return _mm256_loadu_ps(x + k);
    float tmp[8] = {0};
    for (int i = 0; i < 8 && k + i < K; i++) tmp[i] = x[k + i];
    return _mm256_loadu_ps(tmp);
}

static void tile_float(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = j->w + n * j->row_bytes;
        for (int64_t t = 0; t < j->T; t++) {
            const float *x = j->x + t * j->K;
            __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
            for (int64_t k = 0; k < j->K; k += FLOAT_LANES) {
                lo = _mm256_fmadd_ps(load8_x(x, k, j->K), load8_weight(kind, row, k, j->K), lo);
                hi = _mm256_fmadd_ps(load8_x(x, k + 8, j->K), load8_weight(kind, row, k + 8, j->K), hi);
            }
            float lanes[FLOAT_LANES];
            _mm256_storeu_ps(lanes, lo);
            _mm256_storeu_ps(lanes + 8, hi);
            store_out(j, t, n, lanes16_reduce(lanes));
        }
    }
}

#define TILE(name, fn, kind) \
    static void name(const mm_job *j, int64_t n0, int64_t n1) { fn(j, n0, n1, kind); }
TILE(tile_f32, tile_float, MM_F32)
TILE(tile_f16, tile_float, MM_F16)
TILE(tile_bf16, tile_float, MM_BF16)
TILE(tile_q8_0, tile_k32, MM_Q8_0)
TILE(tile_q5_0, tile_k32, MM_Q5_0)
TILE(tile_q4_k, tile_k256, MM_Q4_K)
TILE(tile_q5_k, tile_k256, MM_Q5_K)
TILE(tile_q6_k, tile_k256, MM_Q6_K)
TILE(tile_iq4_xs, tile_k256, MM_IQ4_XS)

const mm_tile_fn mm_tiles_avx2[MM_KINDS] = {
    tile_f32, tile_f16, tile_bf16, tile_q8_0, tile_q5_0, tile_q4_k, tile_q5_k, tile_q6_k, tile_iq4_xs,
};

#else
const int mm_avx2_built = 0;
const mm_tile_fn mm_tiles_avx2[MM_KINDS] = {0};
#endif
