/* AVX2 one-row (decode) kernels for Q4_K and Q6_K (see gemv_avx512.c): 8 columns at a time,
 * weights decoded straight from the block bytes, bitwise the portable kernel's results. */
#include "matmul.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "decode.h"
#include "gemv.h"
#include "unpack_simd.h"

#define COLS 8

/* lane i = the sum of the 4 lanes of v[i] */
static inline __m256i reduce8_128(const __m128i v[COLS]) {
    __m128i a = _mm_hadd_epi32(v[0], v[1]), b = _mm_hadd_epi32(v[2], v[3]);
    __m128i c = _mm_hadd_epi32(v[4], v[5]), d = _mm_hadd_epi32(v[6], v[7]);
    return _mm256_set_m128i(_mm_hadd_epi32(c, d), _mm_hadd_epi32(a, b));
}

/* 8 f16 values at `offset` of block b in 8 rows (row_bytes apart): the low (hi=0) or high half
 * of the 4 bytes there */
static inline __m256 f16_of_rows(const uint8_t *w, int64_t row_bytes, int64_t offset, int nc, int hi) {
    uint16_t h[COLS] = {0};
    for (int c = 0; c < nc; c++) h[c] = load_u16(w + c * row_bytes + offset + 2 * hi);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

static inline __m256 negate(__m256 t) {
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(t), _mm256_set1_epi32((int)0x80000000u)));
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

/* int16 lane k of `dup` (8 int16 repeated in both halves) broadcast: low half lane a, high half lane b */
static inline __m256i pick2(__m256i dup, int a, int b) {
    const __m256i ctrl = _mm256_setr_epi8(2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1,
                                          2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1,
                                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1,
                                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1);
    return _mm256_shuffle_epi8(dup, ctrl);
}

#define MAX_ROWS 4   /* rows dotted with each decoded block */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Q4_K, R rows t0..t0+R-1: each 64-value step of a column's block decoded once, dotted with
 * every row */
ALWAYS_INLINE void gemv_q4_k_rows_impl(const mm_job *j, int64_t n0, int64_t n1, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, rb = j->row_bytes, K = j->K;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
        const int nc = (int)(n1 - c0 < COLS ? n1 - c0 : COLS);
        const uint8_t *w0 = j->w + c0 * rb;
        __m256 acc[MAX_ROWS];
        __m256i raw[MAX_ROWS][COLS];
        __m128i mins[MAX_ROWS][COLS];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_setzero_ps();
            for (int c = nc; c < COLS; c++) raw[r][c] = _mm256_setzero_si256(), mins[r][c] = _mm_setzero_si128();
        }
        for (int64_t b = 0; b < nb; b++) {
            __m128i bs32[MAX_ROWS];
            for (int r = 0; r < R; r++) {
                const int16_t *bs = j->bsums + (t0 + r) * (K / 16) + b * 16;
                bs32[r] = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs), _mm_loadu_si128((const __m128i *)(bs + 8)));
            }
            for (int c = 0; c < nc; c++) {
                const uint8_t *blk = w0 + c * rb + b * BYTES_Q4_K;
                prefetch_next_tile(blk, COLS * rb, BYTES_Q4_K);
                const __m256i sm16 = k4_scales_mins16(blk + 4);
                const __m256i scd = _mm256_permute2x128_si256(sm16, sm16, 0x00);
                __m256i a[MAX_ROWS];
                for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
                for (int c4 = 0; c4 < 4; c4++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c4));
                    const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    const __m256i slo = pick2(scd, 2 * c4, 2 * c4), shi = pick2(scd, 2 * c4 + 1, 2 * c4 + 1);
                    for (int r = 0; r < R; r++) {
                        const int8_t *x = j->qs + (t0 + r) * K + b * QK_K + 64 * c4;
                        const __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x));
                        const __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 32)));
                        a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(plo, slo));
                        a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(phi, shi));
                    }
                }
                const __m128i m8 = _mm256_extracti128_si256(sm16, 1);
                for (int r = 0; r < R; r++) {
                    raw[r][c] = a[r];
                    mins[r][c] = _mm_madd_epi16(m8, bs32[r]);
                }
            }
            const __m256 d = f16_of_rows(w0, rb, b * BYTES_Q4_K, nc, 0);
            const __m256 dmin = f16_of_rows(w0, rb, b * BYTES_Q4_K, nc, 1);
            for (int r = 0; r < R; r++) {
                const __m256 dx = _mm256_set1_ps(j->dx[(t0 + r) * nb + b]);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(reduce8(raw[r])), acc[r]);
                acc[r] = _mm256_fmadd_ps(negate(_mm256_mul_ps(dx, dmin)), _mm256_cvtepi32_ps(reduce8_128(mins[r])), acc[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            float out[COLS];
            _mm256_storeu_ps(out, acc[r]);
            for (int c = 0; c < nc; c++) store_out(j, t0 + r, c0 + c, out[c]);
        }
    }
}

/* Q6_K, R rows: values (low nibbles | two high bits), the +32 offset taken back with the sums */
ALWAYS_INLINE void gemv_q6_k_rows_impl(const mm_job *j, int64_t n0, int64_t n1, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, rb = j->row_bytes, K = j->K;
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
        const int nc = (int)(n1 - c0 < COLS ? n1 - c0 : COLS);
        const uint8_t *w0 = j->w + c0 * rb;
        __m256 acc[MAX_ROWS];
        __m256i raw[MAX_ROWS][COLS];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_setzero_ps();
            for (int c = nc; c < COLS; c++) raw[r][c] = _mm256_setzero_si256();
        }
        for (int64_t b = 0; b < nb; b++) {
            for (int c = 0; c < nc; c++) {
                const uint8_t *blk = w0 + c * rb + b * BYTES_Q6_K;
                prefetch_next_tile(blk, COLS * rb, BYTES_Q6_K);
                const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
                const __m256i lo8 = _mm256_permute2x128_si256(sc16, sc16, 0x00);   /* sc0..7 twice */
                const __m256i hi8 = _mm256_permute2x128_si256(sc16, sc16, 0x11);   /* sc8..15 twice */
                const __m256i sc32 = _mm256_slli_epi16(sc16, 5);
                __m256i a[MAX_ROWS];
                for (int r = 0; r < R; r++)   /* start from minus the +32 offset: 32 * sum_g sc[g] bs[g] */
                    a[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(sc32,
                                 _mm256_loadu_si256((const __m256i *)(j->bsums + (t0 + r) * (K / 16) + b * 16))));
                for (int h = 0; h < 2; h++) {
                    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                    const __m256i v[4] = {
                        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
                        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                        _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30))};
                    const __m256i s8 = h ? hi8 : lo8;   /* groups 8h .. 8h+7: v[k] covers groups 8h+2k, 8h+2k+1 */
                    for (int k4 = 0; k4 < 4; k4++) {
                        const __m256i sk = pick2(s8, 2 * k4, 2 * k4 + 1);
                        for (int r = 0; r < R; r++) {
                            const int8_t *x = j->qs + (t0 + r) * K + b * QK_K + 128 * h + 32 * k4;
                            a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(_mm256_maddubs_epi16(v[k4],
                                                    _mm256_loadu_si256((const __m256i *)x)), sk));
                        }
                    }
                }
                for (int r = 0; r < R; r++) raw[r][c] = a[r];
            }
            const __m256 d = f16_of_rows(w0, rb, b * BYTES_Q6_K + 208, nc, 0);
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(j->dx[(t0 + r) * nb + b]), d),
                                         _mm256_cvtepi32_ps(reduce8(raw[r])), acc[r]);
        }
        for (int r = 0; r < R; r++) {
            float out[COLS];
            _mm256_storeu_ps(out, acc[r]);
            for (int c = 0; c < nc; c++) store_out(j, t0 + r, c0 + c, out[c]);
        }
    }
}

GEMV_ROWS_DISPATCH(gemv_q4_k, avx2)
GEMV_ROWS_DISPATCH(gemv_q6_k, avx2)

/* Q8_0 / Q5_0 (32-value blocks): 8 columns' block b dotted with x, reduced across columns */
void gemv_k32_avx2(const mm_job *j, int64_t n0, int64_t n1, int q5) {
    const int64_t nb = j->K / QK_32, rb = j->row_bytes;
    const int bb = q5 ? BYTES_Q5_0 : BYTES_Q8_0;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
        const int nc = (int)(n1 - c0 < COLS ? n1 - c0 : COLS);
        const uint8_t *w0 = j->w + c0 * rb;
        __m256 acc = _mm256_setzero_ps();
        __m256i raw[COLS];
        for (int c = nc; c < COLS; c++) raw[c] = _mm256_setzero_si256();
        for (int64_t b = 0; b < nb; b++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(j->qs + b * QK_32));
            for (int c = 0; c < nc; c++) {
                const uint8_t *blk = w0 + c * rb + b * bb;
                prefetch_next_tile(blk, COLS * rb, bb);
                __m256i p;
                if (q5) {
                    p = _mm256_maddubs_epi16(q5_0_values(blk), x);
                } else {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
                    p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                }
                raw[c] = _mm256_madd_epi16(p, ones);
            }
            __m256i isum = reduce8(raw);
            if (q5) {
                const int16_t *bs = j->bsums + 2 * b;
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(16 * (bs[0] + bs[1])));
            }
            const __m256 d = f16_of_rows(w0, rb, b * bb, nc, 0);
            acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(j->dx[b]), d), _mm256_cvtepi32_ps(isum), acc);
        }
        float out[COLS];
        _mm256_storeu_ps(out, acc);
        for (int c = 0; c < nc; c++) store_out(j, 0, c0 + c, out[c]);
    }
}

#else
typedef int luce_gemv_avx2_empty;   /* built without AVX2: no kernels here */
#endif
