/* AVX-512 (F, BW, VL, VNNI) matmul tiles: bitwise the portable kernels (dot_portable.c).
 *
 * As dot_avx2.c with 16 (row, column) pairs per tile and 64-value steps: maddubs of the
 * unpacked block against x, then dpwssd with the group scales accumulates 16 int32 lanes per
 * pair; the 16 pairs' lanes reduce to one vector of 16 exact block sums, and the float combine
 * of blocks.h runs on 16 pairs at once. */
#include <stdlib.h>

#include "matmul.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "decode.h"
#include "gemv.h"
#include "unpack_simd.h"

const int mm_avx512_built = 1;

#define PAIRS 16
#ifndef GEMV_MAX_ROWS
#define GEMV_MAX_ROWS 64   /* rows up to which the decode kernels (gemv_avx512.c) beat the tiles */
#endif

/* lane i = the sum of the 16 lanes of v[i] (exact int32) */
static inline __m512i reduce16(const __m512i v[PAIRS]) {
    __m256i h[PAIRS];
    for (int i = 0; i < PAIRS; i++)
        h[i] = _mm256_add_epi32(_mm512_castsi512_si256(v[i]), _mm512_extracti64x4_epi64(v[i], 1));
    return _mm512_inserti64x4(_mm512_castsi256_si512(reduce8(h)), reduce8(h + 8), 1);
}

static inline __m512i reduce16_256(const __m256i v[PAIRS]) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(reduce8(v)), reduce8(v + 8), 1);
}

/* scale vectors of the four 64-value steps: int16 lanes 8k..8k+7 = sc[4h + k] */
static inline void step_scales(const int16_t *sc, __m512i scv[4]) {
    __m512i s = _mm512_zextsi256_si512(_mm256_load_si256((const __m256i *)sc));
    const __m512i lane_group = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                         15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);   /* l / 8 */
    for (int h = 0; h < 4; h++)
        scv[h] = _mm512_permutexvar_epi16(_mm512_add_epi16(lane_group, _mm512_set1_epi16((short)(4 * h))), s);
}

static inline __m512i dot_unsigned_512(const unpacked_block *u, const __m512i scv[4], const int8_t *qx) {
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 4; h++) {
        __m512i w = _mm512_load_si512((const void *)(u->w + 64 * h));
        __m512i x = _mm512_loadu_si512((const void *)(qx + 64 * h));
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(w, x), scv[h]);
    }
    return acc;
}

static inline __m512i dot_signed_512(const unpacked_block *u, const __m512i scv[4], const int8_t *qx) {
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 4; h++) {
        __m512i w = _mm512_load_si512((const void *)(u->w + 64 * h));
        __m512i x = _mm512_loadu_si512((const void *)(qx + 64 * h));
        __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_abs_epi8(w), xs), scv[h]);
    }
    return acc;
}

/* rows per tile for T rows (columns per tile = PAIRS / rows) */
static inline int tile_rows(int64_t T) { return T >= 4 ? 4 : (int)T; }

static void tile_k256(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    if (j->T <= GEMV_MAX_ROWS && (kind == MM_Q4_K || kind == MM_Q6_K)) {
        (kind == MM_Q4_K ? gemv_q4_k_avx512 : gemv_q6_k_avx512)(j, n0, n1);
        return;
    }
    const int64_t T = j->T, K = j->K, nb = K / QK_K;
    const int bb = mm_block_bytes(kind), R = tile_rows(T), C = PAIRS / R;
    const int has_min = kind == MM_Q4_K || kind == MM_Q5_K, signed_w = kind == MM_IQ4_XS;
    const int minus_s1 = kind == MM_Q6_K;
    const int64_t acc_len = ((T + R - 1) / R) * R * C;
    unpacked_block *ub = aligned_alloc(64, sizeof(unpacked_block) * (size_t)C);
    float *acc = aligned_alloc(64, sizeof(float) * (size_t)(acc_len + PAIRS));
    /* lanes of pairs outside the tile hold whatever they held: independent, never stored */
    __m512i raw[PAIRS], scv[PAIRS][4];
    __m256i s1[PAIRS];
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
                step_scales(ub[c].sc, scv[c]);
            }
            for (int64_t r0 = 0; r0 < T; r0 += R) {
                const int nr = (int)(T - r0 < R ? T - r0 : R);
                for (int r = 0; r < nr; r++) {
                    const int8_t *qx = j->qs + (r0 + r) * K + b * QK_K;
                    const int16_t *bs = j->bsums + (r0 + r) * (K / 16) + b * 16;
                    const float dx = j->dx[(r0 + r) * nb + b];
                    const __m256i bsv = _mm256_loadu_si256((const __m256i *)bs);
                    for (int c = 0, p = r * C; c < nc; c++, p++) {
                        raw[p] = signed_w ? dot_signed_512(&ub[c], scv[c], qx) : dot_unsigned_512(&ub[c], scv[c], qx);
                        s1[p] = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)ub[c].a), bsv);
                        dxd[p] = dx * ub[c].d;
                        dxm[p] = -(dx * ub[c].dmin);
                    }
                }
                __m512i isum = reduce16(raw);
                if (minus_s1) isum = _mm512_sub_epi32(isum, reduce16_256(s1));
                float *a = acc + r0 * C;
                __m512 av = _mm512_loadu_ps(a);
                av = _mm512_fmadd_ps(_mm512_loadu_ps(dxd), _mm512_cvtepi32_ps(isum), av);
                if (has_min) av = _mm512_fmadd_ps(_mm512_loadu_ps(dxm), _mm512_cvtepi32_ps(reduce16_256(s1)), av);
                _mm512_storeu_ps(a, av);
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

/* ---- 32-value blocks (Q8_0, Q5_0): per pair, 16 consecutive blocks reduce together ---- */

static void tile_k32(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    if (j->T <= GEMV_MAX_ROWS) {
        gemv_k32_avx512(j, n0, n1, kind == MM_Q5_0);
        return;
    }
    const int64_t T = j->T, K = j->K, nb = K / QK_32;
    const int bb = mm_block_bytes(kind), q5 = kind == MM_Q5_0;
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
                    v[i] = q5 ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[i], x)
                              : _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w[i], w[i]),
                                                    _mm256_sign_epi8(x, w[i]));
                }
                int32_t sums[PAIRS];
                _mm512_storeu_si512((void *)sums, reduce16_256(v));
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

/* ---- float weights: the canonical 16 lanes in one register ---- */

static inline __m512 load16_weight(int kind, const uint8_t *row, int64_t k, int64_t K) {
    int64_t left = K - k;
    __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    if (kind == MM_F32) return _mm512_maskz_loadu_ps(m, (const float *)(row + 4 * k));
    __m256i h = _mm256_maskz_loadu_epi16(m, (const void *)(row + 2 * k));
    if (kind == MM_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void tile_float(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = j->w + n * j->row_bytes;
        for (int64_t t = 0; t < j->T; t++) {
            const float *x = j->x + t * j->K;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t k = 0; k < j->K; k += FLOAT_LANES) {
                int64_t left = j->K - k;
                __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + k), load16_weight(kind, row, k, j->K), acc);
            }
            float lanes[FLOAT_LANES];
            _mm512_storeu_ps(lanes, acc);
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

const mm_tile_fn mm_tiles_avx512[MM_KINDS] = {
    tile_f32, tile_f16, tile_bf16, tile_q8_0, tile_q5_0, tile_q4_k, tile_q5_k, tile_q6_k, tile_iq4_xs,
};

#else
const int mm_avx512_built = 0;
const mm_tile_fn mm_tiles_avx512[MM_KINDS] = {0};
#endif
