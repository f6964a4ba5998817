/* AVX-512 one-row (decode) kernels for Q4_K and Q6_K, the bulk of a Q4_K_M model's bytes:
 * 16 columns at a time, the row's activation block held in registers across them, weights
 * decoded straight from the block bytes. Integer block sums and the float combine are those
 * of blocks.h, so results are bitwise the portable kernel's (tests/kernels/test_cpu_matmul.py). */
#include "matmul.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "decode.h"
#include "gemv.h"
#include "unpack_simd.h"

#define COLS 16

static inline __m512i reduce16(const __m512i v[COLS]) {
    __m256i h[COLS];
    for (int i = 0; i < COLS; i++)
        h[i] = _mm256_add_epi32(_mm512_castsi512_si256(v[i]), _mm512_extracti64x4_epi64(v[i], 1));
    return _mm512_inserti64x4(_mm512_castsi256_si512(reduce8(h)), reduce8(h + 8), 1);
}

/* lane i = the sum of the 4 lanes of v[i] */
static inline __m512i reduce16_128(const __m128i v[COLS]) {
    __m256i h[COLS / 2];
    for (int i = 0; i < COLS / 2; i++) h[i] = _mm256_set_m128i(v[2 * i + 1], v[2 * i]);
    /* h[i] holds v[2i] | v[2i+1]; hadd tree as reduce8 on 8 vectors gives sums of 8 lanes:
     * instead sum each 128-bit half separately */
    __m256i a = _mm256_hadd_epi32(h[0], h[1]), b = _mm256_hadd_epi32(h[2], h[3]);
    __m256i c = _mm256_hadd_epi32(h[4], h[5]), d = _mm256_hadd_epi32(h[6], h[7]);
    a = _mm256_hadd_epi32(a, b);   /* [v0 v2 v4 v6 | v1 v3 v5 v7] */
    c = _mm256_hadd_epi32(c, d);   /* [v8 v10 v12 v14 | v9 v11 v13 v15] */
    __m512i lo_hi = _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
    const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    return _mm512_permutexvar_epi32(order, lo_hi);
}

/* the 4 bytes at `offset` of block b in each of nc <= 16 rows (row_bytes apart) */
static inline __m512i gather_rows(const uint8_t *w, int64_t row_bytes, int64_t offset, int nc) {
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)row_bytes));
    const __mmask16 live = (__mmask16)((1u << nc) - 1u);
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, rows, (const void *)(w + offset), 1);
}

/* -t, exactly (the sign bit flipped, as the scalar -(t)) */
static inline __m512 negate(__m512 t) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(t), _mm512_set1_epi32((int)0x80000000u)));
}

static inline __m512i pair256(const int8_t *a, const int8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* int16 vector: lanes 0-15 = s[i], lanes 16-31 = s[k] */
static inline __m512i two_scales(__m512i s, int i, int k) {
    const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)i)), _mm256_set1_epi16((short)k), 1);
    return _mm512_permutexvar_epi16(idx, s);
}

/* a Q4_K block's 12 packed scale bytes -> 16 int16 [sc0..sc7, m0..m7] (k4_scales_mins in SIMD) */
static inline __m256i k4_scales_mins16(const uint8_t *scales) {
    const __m128i v = _mm_loadu_si128((const __m128i *)scales);   /* 12 bytes used; qs follow in the block */
    const __m128i P = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i Q = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i E = _mm_and_si128(P, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i F = _mm_and_si128(_mm_srli_epi16(P, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i G = _mm_and_si128(_mm_srli_epi16(Q, 2), _mm_set1_epi8(0x30));
    return _mm256_cvtepu8_epi16(_mm_or_si128(_mm_or_si128(E, F), G));
}

#define MAX_ROWS 4   /* rows dotted with each decoded block (x of 4 rows: 16 registers) */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Q4_K, R rows t0..t0+R-1: each column's block decoded once into registers (nibbles and
 * scale vectors), then dotted with every row. */
ALWAYS_INLINE void gemv_q4_k_rows_impl(const mm_job *j, int64_t n0, int64_t n1, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, rb = j->row_bytes, K = j->K;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
        const int nc = (int)(n1 - c0 < COLS ? n1 - c0 : COLS);
        const uint8_t *w0 = j->w + c0 * rb;
        __m512 acc[MAX_ROWS];
        __m512i raw[MAX_ROWS][COLS];
        __m128i mins[MAX_ROWS][COLS];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm512_setzero_ps();
            for (int c = nc; c < COLS; c++) raw[r][c] = _mm512_setzero_si512(), mins[r][c] = _mm_setzero_si128();
        }
        for (int64_t b = 0; b < nb; b++) {
            /* x in Q4_K nibble order: low nibbles of qs[64L..64L+63] are values 128L + [0,32) and [64,96) */
            __m512i xa0[MAX_ROWS], xb0[MAX_ROWS], xa1[MAX_ROWS], xb1[MAX_ROWS];
            __m128i bs32[MAX_ROWS];
            for (int r = 0; r < R; r++) {
                const int8_t *x = j->qs + (t0 + r) * K + b * QK_K;
                const int16_t *bs = j->bsums + (t0 + r) * (K / 16) + b * 16;
                xa0[r] = pair256(x, x + 64), xb0[r] = pair256(x + 32, x + 96);
                xa1[r] = pair256(x + 128, x + 192), xb1[r] = pair256(x + 160, x + 224);
                bs32[r] = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs), _mm_loadu_si128((const __m128i *)(bs + 8)));
            }
            for (int c = 0; c < nc; c++) {
                const uint8_t *blk = w0 + c * rb + b * BYTES_Q4_K;
                prefetch_next_tile(blk, COLS * rb, BYTES_Q4_K);
                const __m256i sm16 = k4_scales_mins16(blk + 4);
                const __m512i s = _mm512_castsi256_si512(sm16);
                const __m512i q0 = _mm512_loadu_si512((const void *)(blk + 16));
                const __m512i q1 = _mm512_loadu_si512((const void *)(blk + 80));
                const __m512i v0 = _mm512_and_si512(q0, m4), v1 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
                const __m512i v2 = _mm512_and_si512(q1, m4), v3 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
                const __m512i s0 = two_scales(s, 0, 2), s1 = two_scales(s, 1, 3);
                const __m512i s2 = two_scales(s, 4, 6), s3 = two_scales(s, 5, 7);
                const __m128i m8 = _mm256_extracti128_si256(sm16, 1);
                for (int r = 0; r < R; r++) {
                    __m512i a = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(v0, xa0[r]), s0);
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(v1, xb0[r]), s1);
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(v2, xa1[r]), s2);
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(v3, xb1[r]), s3);
                    raw[r][c] = a;
                    mins[r][c] = _mm_madd_epi16(m8, bs32[r]);
                }
            }
            const __m512i pair = gather_rows(w0, rb, b * BYTES_Q4_K, nc);   /* f16 d | f16 dmin */
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pair));
            const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pair, 16)));
            for (int r = 0; r < R; r++) {
                const __m512 dx = _mm512_set1_ps(j->dx[(t0 + r) * nb + b]);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(reduce16(raw[r])), acc[r]);
                acc[r] = _mm512_fmadd_ps(negate(_mm512_mul_ps(dx, dmin)), _mm512_cvtepi32_ps(reduce16_128(mins[r])), acc[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            float out[COLS];
            _mm512_storeu_ps(out, acc[r]);
            for (int c = 0; c < nc; c++) store_out(j, t0 + r, c0 + c, out[c]);
        }
    }
}

/* Q6_K, R rows: values (low nibbles | two high bits) in natural order, +32 offset taken back
 * with the group sums */
ALWAYS_INLINE void gemv_q6_k_rows_impl(const mm_job *j, int64_t n0, int64_t n1, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, rb = j->row_bytes, K = j->K;
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m512i g = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                                         16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
    for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
        const int nc = (int)(n1 - c0 < COLS ? n1 - c0 : COLS);
        const uint8_t *w0 = j->w + c0 * rb;
        __m512 acc[MAX_ROWS];
        __m512i raw[MAX_ROWS][COLS];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm512_setzero_ps();
            for (int c = nc; c < COLS; c++) raw[r][c] = _mm512_setzero_si512();
        }
        for (int64_t b = 0; b < nb; b++) {
            __m512i x0[MAX_ROWS], x1[MAX_ROWS], x2[MAX_ROWS], x3[MAX_ROWS];
            __m256i bsv[MAX_ROWS];
            for (int r = 0; r < R; r++) {
                const int8_t *x = j->qs + (t0 + r) * K + b * QK_K;
                x0[r] = _mm512_loadu_si512((const void *)x), x1[r] = _mm512_loadu_si512((const void *)(x + 64));
                x2[r] = _mm512_loadu_si512((const void *)(x + 128)), x3[r] = _mm512_loadu_si512((const void *)(x + 192));
                bsv[r] = _mm256_loadu_si256((const __m256i *)(j->bsums + (t0 + r) * (K / 16) + b * 16));
            }
            for (int c = 0; c < nc; c++) {
                const uint8_t *blk = w0 + c * rb + b * BYTES_Q6_K;
                prefetch_next_tile(blk, COLS * rb, BYTES_Q6_K);
                const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
                const __m512i s = _mm512_castsi256_si512(sc16);
                const __m512i l0 = _mm512_loadu_si512((const void *)blk), l1 = _mm512_loadu_si512((const void *)(blk + 64));
                const __m256i h0 = _mm256_loadu_si256((const __m256i *)(blk + 128));
                const __m256i h1 = _mm256_loadu_si256((const __m256i *)(blk + 160));
                /* values 0..63 of a half: low nibbles | bits (hb << 4), (hb << 2); 64..127: high | hb, hb >> 2 */
                const __m512i hA0 = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(h0, 4)),
                                                                         _mm256_slli_epi16(h0, 2), 1), m30);
                const __m512i hB0 = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(h0), _mm256_srli_epi16(h0, 2), 1), m30);
                const __m512i hA1 = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(h1, 4)),
                                                                         _mm256_slli_epi16(h1, 2), 1), m30);
                const __m512i hB1 = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(h1), _mm256_srli_epi16(h1, 2), 1), m30);
                const __m512i v0 = _mm512_or_si512(_mm512_and_si512(l0, m4), hA0);
                const __m512i v1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), hB0);
                const __m512i v2 = _mm512_or_si512(_mm512_and_si512(l1, m4), hA1);
                const __m512i v3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), hB1);
                const __m512i s0 = _mm512_permutexvar_epi16(g, s);
                const __m512i s1 = _mm512_permutexvar_epi16(_mm512_add_epi16(g, _mm512_set1_epi16(4)), s);
                const __m512i s2 = _mm512_permutexvar_epi16(_mm512_add_epi16(g, _mm512_set1_epi16(8)), s);
                const __m512i s3 = _mm512_permutexvar_epi16(_mm512_add_epi16(g, _mm512_set1_epi16(12)), s);
                const __m256i sc32 = _mm256_slli_epi16(sc16, 5);
                for (int r = 0; r < R; r++) {
                    __m512i a = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(v0, x0[r]), s0);
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(v1, x1[r]), s1);
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(v2, x2[r]), s2);
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(v3, x3[r]), s3);
                    /* take back the +32 offset: 32 * sum_g sc[g] bs[g] */
                    raw[r][c] = _mm512_sub_epi32(a, _mm512_zextsi256_si512(_mm256_madd_epi16(sc32, bsv[r])));
                }
            }
            const __m512i dbits = gather_rows(w0, rb, b * BYTES_Q6_K + 206, nc);   /* bytes 206..209: f16 d high */
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dbits, 16)));
            for (int r = 0; r < R; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(j->dx[(t0 + r) * nb + b]), d),
                                         _mm512_cvtepi32_ps(reduce16(raw[r])), acc[r]);
        }
        for (int r = 0; r < R; r++) {
            float out[COLS];
            _mm512_storeu_ps(out, acc[r]);
            for (int c = 0; c < nc; c++) store_out(j, t0 + r, c0 + c, out[c]);
        }
    }
}

GEMV_ROWS_DISPATCH(gemv_q4_k, avx512)
GEMV_ROWS_DISPATCH(gemv_q6_k, avx512)

/* Q8_0 / Q5_0 (32-value blocks), R rows: 16 columns' block b decoded once, dotted with every
 * row, reduced across columns */
ALWAYS_INLINE void gemv_k32_rows_impl(const mm_job *j, int64_t n0, int64_t n1, int64_t t0, const int R, const int q5) {
    const int64_t nb = j->K / QK_32, rb = j->row_bytes, K = j->K;
    const int bb = q5 ? BYTES_Q5_0 : BYTES_Q8_0;
    const __m128i m4 = _mm_set1_epi8(0xF);
    for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
        const int nc = (int)(n1 - c0 < COLS ? n1 - c0 : COLS);
        const uint8_t *w0 = j->w + c0 * rb;
        __m512 acc[MAX_ROWS];
        __m256i raw[MAX_ROWS][COLS];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm512_setzero_ps();
            for (int c = nc; c < COLS; c++) raw[r][c] = _mm256_setzero_si256();
        }
        for (int64_t b = 0; b < nb; b++) {
            __m256i x[MAX_ROWS];
            for (int r = 0; r < R; r++) x[r] = _mm256_loadu_si256((const __m256i *)(j->qs + (t0 + r) * K + b * QK_32));
            for (int c = 0; c < nc; c++) {
                const uint8_t *blk = w0 + c * rb + b * bb;
                prefetch_next_tile(blk, COLS * rb, bb);
                if (q5) {   /* u = q + 16: nibbles, bit 4 from qh (a mask register) */
                    const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 6));
                    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
                    const __m256i v = _mm256_mask_blend_epi8((__mmask32)load_u32(blk + 2), nib,
                                                             _mm256_or_si256(nib, _mm256_set1_epi8(0x10)));
                    for (int r = 0; r < R; r++) raw[r][c] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), v, x[r]);
                } else {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
                    const __m256i aw = _mm256_abs_epi8(w);
                    for (int r = 0; r < R; r++)
                        raw[r][c] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x[r], w));
                }
            }
            const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gather_rows(w0, rb, b * bb, nc)));
            for (int r = 0; r < R; r++) {
                __m512i isum = _mm512_inserti64x4(_mm512_castsi256_si512(reduce8(raw[r])), reduce8(raw[r] + 8), 1);
                if (q5) {
                    const int16_t *bs = j->bsums + (t0 + r) * (K / 16) + 2 * b;
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(16 * (bs[0] + bs[1])));
                }
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(j->dx[(t0 + r) * nb + b]), d),
                                         _mm512_cvtepi32_ps(isum), acc[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            float out[COLS];
            _mm512_storeu_ps(out, acc[r]);
            for (int c = 0; c < nc; c++) store_out(j, t0 + r, c0 + c, out[c]);
        }
    }
}

void gemv_k32_avx512(const mm_job *j, int64_t n0, int64_t n1, int q5) {
    for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
        const int64_t c1 = n1 - c0 < COLS ? n1 : c0 + COLS;
        for (int64_t t0 = 0; t0 < j->T; t0 += MAX_ROWS) {
            const int R = j->T - t0 >= MAX_ROWS ? MAX_ROWS : (int)(j->T - t0);
            if (q5) {
                switch (R) {
                case 1: gemv_k32_rows_impl(j, c0, c1, t0, 1, 1); break;
                case 2: gemv_k32_rows_impl(j, c0, c1, t0, 2, 1); break;
                case 3: gemv_k32_rows_impl(j, c0, c1, t0, 3, 1); break;
                default: gemv_k32_rows_impl(j, c0, c1, t0, 4, 1); break;
                }
            } else {
                switch (R) {
                case 1: gemv_k32_rows_impl(j, c0, c1, t0, 1, 0); break;
                case 2: gemv_k32_rows_impl(j, c0, c1, t0, 2, 0); break;
                case 3: gemv_k32_rows_impl(j, c0, c1, t0, 3, 0); break;
                default: gemv_k32_rows_impl(j, c0, c1, t0, 4, 0); break;
                }
            }
        }
    }
}

#else
typedef int luce_gemv_avx512_empty;   /* built without AVX-512: no kernels here */
#endif
