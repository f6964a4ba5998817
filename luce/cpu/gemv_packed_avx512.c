/* AVX-512 VNNI matmul over packed Q4_K / Q6_K / Q5_0 / Q8_0 weights (layout: packed.h). One 16-column
 * group at a time, up to MAX_ROWS rows per pass over it: lane c of every vector is column
 * 16 g + c, so each dpbusd (four weight values x one broadcast activation word) adds into
 * that column's own sum. Integer sums are exact; the float combine per block is blocks.h's,
 * so outputs are bitwise the row-major kernels' (tests/kernels/test_cpu_packed.py). */
#include "matmul.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "decode.h"
#include "packed.h"

#define MAX_ROWS 4
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* sum over i < n of dpbusd(w[i], x[4 i .. 4 i + 3] broadcast), plus `init`, as `chains`
 * independent dependency chains (integer sums: any split is exact). One row alone would
 * otherwise wait on the instruction's latency n times in a row. */
ALWAYS_INLINE __m512i dot_words(__m512i init, const __m512i *w, const int8_t *x, const int n, const int chains) {
    __m512i a[4];
    a[0] = _mm512_dpbusd_epi32(init, w[0], bcast4(x));
    for (int c = 1; c < chains; c++) a[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[c], bcast4(x + 4 * c));
    for (int i = chains; i < n; i++) a[i % chains] = _mm512_dpbusd_epi32(a[i % chains], w[i], bcast4(x + 4 * i));
    if (chains == 4) return _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
    if (chains == 2) return _mm512_add_epi32(a[0], a[1]);
    return a[0];
}

/* independent chains per row for R rows processed together (R rows are R chains already) */
#define CHAINS(R) ((R) >= 4 ? 1 : (R) >= 2 ? 2 : 4)

static inline __m512 negate(__m512 t) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(t), _mm512_set1_epi32((int)0x80000000u)));
}

static inline void prefetch_record(const uint8_t *rec, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)rec + o, _MM_HINT_T0);
}

static inline void store_group(const mm_job *j, int64_t t, int64_t c0, __m512 acc) {
    float out[PACK_COLS];
    _mm512_storeu_ps(out, acc);
    for (int c = 0; c < PACK_COLS; c++) store_out(j, t, c0 + c, out[c]);
}

/* Q4_K: isum = sum_j sc_j * (sum of 8 dpbusd over sub-block j), imin = sum_j m_j * bs32_j */
ALWAYS_INLINE void q4_k_rows(const mm_job *j, int64_t g, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, K = j->K;
    const uint8_t *rec = j->w + g * nb * PACKED_Q4_K;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += PACKED_Q4_K) {
        prefetch_record(rec + 2 * PACKED_Q4_K, PACKED_Q4_K);
        __m512i isum[MAX_ROWS], imin[MAX_ROWS];
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512(), imin[r] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = rec + 320 + 256 * s;
            __m512i w[8];
            for (int h = 0; h < 4; h++) {
                const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * h));
                w[2 * h] = _mm512_and_si512(v, m4);
                w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + 64 + 16 * s)));
            for (int r = 0; r < R; r++) {
                const __m512i a = dot_words(_mm512_setzero_si512(), w, j->qs + (t0 + r) * K + b * QK_K + 32 * s, 8, CHAINS(R));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(a, sc));
            }
        }
        for (int p = 0; p < 4; p++) {
            const __m512i m = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(rec + 192 + 32 * p)));
            for (int r = 0; r < R; r++) {
                const int16_t *bs = j->bsums + (t0 + r) * (K / 16) + b * 16 + 4 * p;
                const int32_t pair = (int32_t)(uint16_t)(int16_t)(bs[0] + bs[1]) |
                                     (int32_t)((uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16);
                imin[r] = _mm512_dpwssd_epi32(imin[r], m, _mm512_set1_epi32(pair));
            }
        }
        const __m512i dd = _mm512_loadu_si512((const void *)rec);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        for (int r = 0; r < R; r++) {
            const __m512 dx = _mm512_set1_ps(j->dx[(t0 + r) * nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(isum[r]), acc[r]);
            acc[r] = _mm512_fmadd_ps(negate(_mm512_mul_ps(dx, dmin)), _mm512_cvtepi32_ps(imin[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_group(j, t0 + r, g * PACK_COLS, acc[r]);
}

/* Q6_K: isum = sum_s sc_s * (sum of 4 dpbusd of u = q + 32 over sub-block s) - 32 sum_s sc_s bs_s */
ALWAYS_INLINE void q6_k_rows(const mm_job *j, int64_t g, int64_t t0, const int R) {
    const int64_t nb = j->K / QK_K, K = j->K;
    const uint8_t *rec = j->w + g * nb * PACKED_Q6_K;
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += PACKED_Q6_K) {
        prefetch_record(rec + 2 * PACKED_Q6_K, PACKED_Q6_K);
        __m512i isum[MAX_ROWS], corr[MAX_ROWS];
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512(), corr[r] = _mm512_setzero_si512();
        for (int s2 = 0; s2 < 8; s2++) {          /* sub-blocks 2 s2 and 2 s2 + 1 */
            const __m512i scp = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(rec + 32 + 32 * s2)));
            for (int half = 0; half < 2; half++) {
                const int s = 2 * s2 + half, qq = s / 4, p = s % 4;
                const __m512i sc = half ? _mm512_srai_epi32(scp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(scp, 16), 16);
                const __m512i lo0 = _mm512_loadu_si512((const void *)(rec + 288 + 512 * qq + 64 * (2 * p)));
                const __m512i lo1 = _mm512_loadu_si512((const void *)(rec + 288 + 512 * qq + 64 * (2 * p + 1)));
                const __m512i hb = _mm512_loadu_si512((const void *)(rec + 2336 + 256 * qq + 64 * p));
                __m512i w[4];
                w[0] = _mm512_or_si512(_mm512_and_si512(lo0, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
                w[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo0, 4), m4),
                                       _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
                w[2] = _mm512_or_si512(_mm512_and_si512(lo1, m4), _mm512_and_si512(hb, m30));
                w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo1, 4), m4),
                                       _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
                for (int r = 0; r < R; r++) {
                    const __m512i a = dot_words(_mm512_setzero_si512(), w, j->qs + (t0 + r) * K + b * QK_K + 16 * s, 4,
                                                CHAINS(R) > 2 ? 2 : CHAINS(R));
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(a, sc));
                }
            }
            for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, j->bsums + (t0 + r) * (K / 16) + b * 16 + 2 * s2, 4);
                corr[r] = _mm512_dpwssd_epi32(corr[r], scp, _mm512_set1_epi32(pair));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        for (int r = 0; r < R; r++) {
            const __m512i v = _mm512_sub_epi32(isum[r], _mm512_slli_epi32(corr[r], 5));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(j->dx[(t0 + r) * nb + b]), d),
                                     _mm512_cvtepi32_ps(v), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_group(j, t0 + r, g * PACK_COLS, acc[r]);
}

/* Q5_0 / Q8_0 (32-value blocks, activations per 32): isum = sum of 8 dpbusd of u - off * bs32,
 * u = q + off (off 16 for Q5_0, 128 for Q8_0) */
ALWAYS_INLINE void k32_rows(const mm_job *j, int64_t g, int64_t t0, const int R, const int q5) {
    const int64_t nb = j->K / QK_32, K = j->K;
    const int pb = q5 ? PACKED_Q5_0 : PACKED_Q8_0, off = q5 ? 16 : 128;
    const uint8_t *rec = j->w + g * nb * pb;
    const __m512i m4 = _mm512_set1_epi8(0xF), m10 = _mm512_set1_epi8(0x10);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += pb) {
        prefetch_record(rec + 4 * pb, pb);
        __m512i w[8];
        if (q5) {
            const __m512i hb = _mm512_loadu_si512((const void *)(rec + 288));
            for (int h = 0; h < 4; h++) {
                const __m512i v = _mm512_loadu_si512((const void *)(rec + 32 + 64 * h));
                w[2 * h] = _mm512_and_si512(v, m4);
                w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            /* bit i of each byte of hb is bit 4 of group i's values */
            w[0] = _mm512_or_si512(w[0], _mm512_and_si512(_mm512_slli_epi16(hb, 4), m10));
            w[1] = _mm512_or_si512(w[1], _mm512_and_si512(_mm512_slli_epi16(hb, 3), m10));
            w[2] = _mm512_or_si512(w[2], _mm512_and_si512(_mm512_slli_epi16(hb, 2), m10));
            w[3] = _mm512_or_si512(w[3], _mm512_and_si512(_mm512_slli_epi16(hb, 1), m10));
            w[4] = _mm512_or_si512(w[4], _mm512_and_si512(hb, m10));
            w[5] = _mm512_or_si512(w[5], _mm512_and_si512(_mm512_srli_epi16(hb, 1), m10));
            w[6] = _mm512_or_si512(w[6], _mm512_and_si512(_mm512_srli_epi16(hb, 2), m10));
            w[7] = _mm512_or_si512(w[7], _mm512_and_si512(_mm512_srli_epi16(hb, 3), m10));
        } else {
            for (int i = 0; i < 8; i++) w[i] = _mm512_loadu_si512((const void *)(rec + 32 + 64 * i));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        for (int r = 0; r < R; r++) {
            const int8_t *x = j->qs + (t0 + r) * K + b * QK_32;
            const int16_t *bs = j->bsums + (t0 + r) * (K / 16) + 2 * b;
            const __m512i a = dot_words(_mm512_set1_epi32(-off * (bs[0] + bs[1])), w, x, 8, CHAINS(R));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(j->dx[(t0 + r) * nb + b]), d),
                                     _mm512_cvtepi32_ps(a), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_group(j, t0 + r, g * PACK_COLS, acc[r]);
}

ALWAYS_INLINE void q5_0_rows(const mm_job *j, int64_t g, int64_t t0, const int R) { k32_rows(j, g, t0, R, 1); }
ALWAYS_INLINE void q8_0_rows(const mm_job *j, int64_t g, int64_t t0, const int R) { k32_rows(j, g, t0, R, 0); }

PACKED_KERNELS(avx512)
#else
#include "packed.h"
const mm_tile_fn mm_packed_avx512[MM_KINDS] = {0};   /* built without AVX-512: no kernels here */
#endif
