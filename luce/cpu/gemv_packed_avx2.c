/* AVX2 matmul over packed Q4_K / Q6_K / Q5_0 / Q8_0 weights (layout: packed.h), the AVX-512
 * kernel's (gemv_packed_avx512.c) integer sums and float combine on 8 lanes: a 64-byte record
 * row is two 256-bit halves, columns 0-7 and 8-15, taken one after the other within each
 * record (one pass over the weight, as memory streams it). Without VNNI a four-value product
 * sum is maddubs (u8 weight x s8 activation -> s16 pairs) then madd (-> s32); activations are
 * in [-127, 127], and each s16 sum below states why it cannot saturate, so the integers are
 * exact and the outputs bitwise the row-major kernels' (tests/kernels/test_cpu_packed.py). */
#include "matmul.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "decode.h"
#include "packed.h"

#define MAX_ROWS 4
#define HALF 8
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* s16 lanes of w (u8) x the activation word at x (s8): pairs of products, |.| <= 2 * 255 * 127
 * before saturation, so callers bound u */
static inline __m256i mul4(__m256i w, const int8_t *x) { return _mm256_maddubs_epi16(w, bcast4(x)); }

/* s32 lanes: the two s16 of each lane times the lane's two s16 of f (exact) */
static inline __m256i madd(__m256i v, __m256i f) { return _mm256_madd_epi16(v, f); }

/* s32 lanes of v (each in s16 range) as two equal s16, for madd */
static inline __m256i dup16(__m256i v) { return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xAA); }

static inline __m256 negate(__m256 t) {
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(t), _mm256_set1_epi32((int)0x80000000u)));
}

static inline void prefetch_record(const uint8_t *rec, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)rec + o, _MM_HINT_T0);
}

static inline void store_half(const mm_job *j, int64_t t, int64_t c0, __m256 acc) {
    float out[HALF];
    _mm256_storeu_ps(out, acc);
    for (int c = 0; c < HALF; c++) store_out(j, t, c0 + c, out[c]);
}

/* 8 f16 at p as f32 */
static inline __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Q4_K: isum = sum_j sc_j * (sum of 8 products over sub-block j), imin = sum_j m_j * bs32_j.
 * The 8 maddubs of a sub-block add in s16: 16 values * 15 * 127 = 30480 < 2^15. */
ALWAYS_INLINE void q4_k_rows(const mm_job *j, int64_t g, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, K = j->K;
    const uint8_t *rec = j->w + g * nb * PACKED_Q4_K;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    /* bytes 0,1 of each u32 to the low 8 bytes of its 128-bit lane, bytes 2,3 to the high 8 */
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    __m256 acc[2][MAX_ROWS];
    for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += PACKED_Q4_K) {
        prefetch_record(rec + 2 * PACKED_Q4_K, PACKED_Q4_K);
        for (int half = 0; half < 2; half++) {   /* columns 0-7, then 8-15 */
            __m256i isum[MAX_ROWS], imin[MAX_ROWS];
            for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256(), imin[r] = _mm256_setzero_si256();
            for (int s = 0; s < 8; s++) {
                const uint8_t *q = rec + 320 + 256 * s + 32 * half;
                __m256i w[8];
                for (int h = 0; h < 4; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * h));
                    w[2 * h] = _mm256_and_si256(v, m4);
                    w[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                }
                const __m128i sc8 = _mm_loadl_epi64((const __m128i *)(rec + 64 + 16 * s + 8 * half));
                const __m256i sc = dup16(_mm256_cvtepu8_epi32(sc8));
                for (int r = 0; r < R; r++) {
                    const int8_t *x = j->qs + (t0 + r) * K + b * QK_K + 32 * s;
                    __m256i p[4];
                    for (int i = 0; i < 4; i++)
                        p[i] = _mm256_add_epi16(mul4(w[2 * i], x + 8 * i), mul4(w[2 * i + 1], x + 8 * i + 4));
                    const __m256i a = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
                    isum[r] = _mm256_add_epi32(isum[r], madd(a, sc));
                }
            }
            for (int p = 0; p < 4; p++) {
                const __m256i m = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(rec + 192 + 32 * p + 16 * half)));
                for (int r = 0; r < R; r++) {
                    const int16_t *bs = j->bsums + (t0 + r) * (K / 16) + b * 16 + 4 * p;
                    const int32_t pair = (int32_t)(uint16_t)(int16_t)(bs[0] + bs[1]) |
                                         (int32_t)((uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16);
                    imin[r] = _mm256_add_epi32(imin[r], madd(m, _mm256_set1_epi32(pair)));
                }
            }
            const __m256i dd = _mm256_permute4x64_epi64(
                _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(rec + 32 * half)), split), 0xD8);
            const __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
            const __m256 dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1));
            for (int r = 0; r < R; r++) {
                const __m256 dx = _mm256_set1_ps(j->dx[(t0 + r) * nb + b]);
                acc[half][r] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(isum[r]), acc[half][r]);
                acc[half][r] =
                    _mm256_fmadd_ps(negate(_mm256_mul_ps(dx, dmin)), _mm256_cvtepi32_ps(imin[r]), acc[half][r]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int half = 0; half < 2; half++) store_half(j, t0 + r, g * PACK_COLS + HALF * half, acc[half][r]);
}

/* Q6_K: isum = sum_s sc_s * (sum of 4 products of u = q + 32 over sub-block s) - 32 sum_s sc_s bs_s.
 * Two maddubs add in s16: 4 values * 63 * 127 = 32004 < 2^15 (four would not). */
ALWAYS_INLINE void q6_k_rows(const mm_job *j, int64_t g, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, K = j->K;
    const uint8_t *rec = j->w + g * nb * PACKED_Q6_K;
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[2][MAX_ROWS];
    for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += PACKED_Q6_K) {
        prefetch_record(rec + 2 * PACKED_Q6_K, PACKED_Q6_K);
        for (int half = 0; half < 2; half++) {   /* columns 0-7, then 8-15 */
            __m256i isum[MAX_ROWS], corr[MAX_ROWS];
            for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256(), corr[r] = _mm256_setzero_si256();
            for (int s2 = 0; s2 < 8; s2++) {          /* sub-blocks 2 s2 and 2 s2 + 1 */
                const __m256i scp =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 32 + 32 * s2 + 16 * half)));
                for (int hs = 0; hs < 2; hs++) {
                    const int s = 2 * s2 + hs, qq = s / 4, p = s % 4;
                    const __m256i sc =
                        dup16(hs ? _mm256_srai_epi32(scp, 16) : _mm256_srai_epi32(_mm256_slli_epi32(scp, 16), 16));
                    const uint8_t *lo = rec + 288 + 512 * qq + 64 * (2 * p) + 32 * half;
                    const __m256i lo0 = _mm256_loadu_si256((const __m256i *)lo);
                    const __m256i lo1 = _mm256_loadu_si256((const __m256i *)(lo + 64));
                    const uint8_t *hi = rec + 2336 + 256 * qq + 64 * p + 32 * half;
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)hi);
                    __m256i w[4];
                    w[0] = _mm256_or_si256(_mm256_and_si256(lo0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
                    w[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m4),
                                           _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
                    w[2] = _mm256_or_si256(_mm256_and_si256(lo1, m4), _mm256_and_si256(hb, m30));
                    w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
                    for (int r = 0; r < R; r++) {
                        const int8_t *x = j->qs + (t0 + r) * K + b * QK_K + 16 * s;
                        const __m256i a0 = _mm256_add_epi16(mul4(w[0], x), mul4(w[1], x + 4));
                        const __m256i a1 = _mm256_add_epi16(mul4(w[2], x + 8), mul4(w[3], x + 12));
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(madd(a0, sc), madd(a1, sc)));
                    }
                }
                for (int r = 0; r < R; r++) {
                    int32_t pair;
                    memcpy(&pair, j->bsums + (t0 + r) * (K / 16) + b * 16 + 2 * s2, 4);
                    corr[r] = _mm256_add_epi32(corr[r], madd(scp, _mm256_set1_epi32(pair)));
                }
            }
            const __m256 d = f16x8(rec + 16 * half);
            for (int r = 0; r < R; r++) {
                const __m256i v = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(corr[r], 5));
                acc[half][r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(j->dx[(t0 + r) * nb + b]), d),
                                         _mm256_cvtepi32_ps(v), acc[half][r]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int half = 0; half < 2; half++) store_half(j, t0 + r, g * PACK_COLS + HALF * half, acc[half][r]);
}

/* Q5_0 / Q8_0 (32-value blocks, activations per 32): isum = the 32 products q x.
 * Q5_0 multiplies u = q + 16 (isum = sum u x - 16 bs32); four maddubs add in s16:
 * 8 values * 31 * 127 = 31496 < 2^15. Q8_0's u = q + 128 would saturate maddubs (2 * 255 * 127),
 * so it multiplies |q| by x with q's sign: 2 * 128 * 127 = 32512 < 2^15, one maddubs per madd. */
ALWAYS_INLINE void k32_rows(const mm_job *j, int64_t g, int64_t t0, const int R, const int q5) {
    const int64_t nb = j->K / QK_32, K = j->K;
    const int pb = q5 ? PACKED_Q5_0 : PACKED_Q8_0;
    const uint8_t *rec = j->w + g * nb * pb;
    const __m256i m4 = _mm256_set1_epi8(0xF), m10 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
    __m256 acc[2][MAX_ROWS];
    for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += pb) {
        prefetch_record(rec + 4 * pb, pb);
        for (int half = 0; half < 2; half++) {   /* columns 0-7, then 8-15 */
            __m256i w[8], sq[8];
            if (q5) {
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(rec + 288 + 32 * half));
                for (int h = 0; h < 4; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 32 + 64 * h + 32 * half));
                    w[2 * h] = _mm256_and_si256(v, m4);
                    w[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                }
                /* bit i of each byte of hb is bit 4 of group i's values */
                w[0] = _mm256_or_si256(w[0], _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10));
                w[1] = _mm256_or_si256(w[1], _mm256_and_si256(_mm256_slli_epi16(hb, 3), m10));
                w[2] = _mm256_or_si256(w[2], _mm256_and_si256(_mm256_slli_epi16(hb, 2), m10));
                w[3] = _mm256_or_si256(w[3], _mm256_and_si256(_mm256_slli_epi16(hb, 1), m10));
                w[4] = _mm256_or_si256(w[4], _mm256_and_si256(hb, m10));
                w[5] = _mm256_or_si256(w[5], _mm256_and_si256(_mm256_srli_epi16(hb, 1), m10));
                w[6] = _mm256_or_si256(w[6], _mm256_and_si256(_mm256_srli_epi16(hb, 2), m10));
                w[7] = _mm256_or_si256(w[7], _mm256_and_si256(_mm256_srli_epi16(hb, 3), m10));
            } else {
                for (int i = 0; i < 8; i++) {
                    sq[i] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + 32 + 64 * i + 32 * half)),
                                             _mm256_set1_epi8((char)0x80));   /* q as s8 */
                    w[i] = _mm256_abs_epi8(sq[i]);
                }
            }
            const __m256 d = f16x8(rec + 16 * half);
            for (int r = 0; r < R; r++) {
                const int8_t *x = j->qs + (t0 + r) * K + b * QK_32;
                __m256i a;
                if (q5) {
                    const int16_t *bs = j->bsums + (t0 + r) * (K / 16) + 2 * b;
                    __m256i p[2];
                    for (int i = 0; i < 2; i++)
                        p[i] = _mm256_add_epi16(
                            _mm256_add_epi16(mul4(w[4 * i], x + 16 * i), mul4(w[4 * i + 1], x + 16 * i + 4)),
                            _mm256_add_epi16(mul4(w[4 * i + 2], x + 16 * i + 8), mul4(w[4 * i + 3], x + 16 * i + 12)));
                    a = _mm256_add_epi32(_mm256_set1_epi32(-16 * (bs[0] + bs[1])),
                                         _mm256_add_epi32(madd(p[0], ones), madd(p[1], ones)));
                } else {
                    __m256i p[8];
                    for (int i = 0; i < 8; i++)
                        p[i] = madd(_mm256_maddubs_epi16(w[i], _mm256_sign_epi8(bcast4(x + 4 * i), sq[i])), ones);
                    a = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])),
                                         _mm256_add_epi32(_mm256_add_epi32(p[4], p[5]), _mm256_add_epi32(p[6], p[7])));
                }
                acc[half][r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(j->dx[(t0 + r) * nb + b]), d),
                                         _mm256_cvtepi32_ps(a), acc[half][r]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int half = 0; half < 2; half++) store_half(j, t0 + r, g * PACK_COLS + HALF * half, acc[half][r]);
}

ALWAYS_INLINE void q5_0_rows(const mm_job *j, int64_t g, int64_t t0, const int R) { k32_rows(j, g, t0, R, 1); }
ALWAYS_INLINE void q8_0_rows(const mm_job *j, int64_t g, int64_t t0, const int R) { k32_rows(j, g, t0, R, 0); }

PACKED_KERNELS(avx2)
#else
#include "packed.h"
const mm_tile_fn mm_packed_avx2[MM_KINDS] = {0};   /* built without AVX2: no kernels here */
#endif
