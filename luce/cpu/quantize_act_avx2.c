/* AVX2 activation quantization: quantize_act.c's arithmetic lane for lane, as the AVX-512 file
 * (quantize_act_avx512.c) does it with 16 lanes; bitwise the portable result. */
#include "matmul.h"

#if defined(__AVX2__)
#include <float.h>
#include <immintrin.h>

void quantize_block_avx2(const float *x, int n, int8_t *q, float *d, int16_t *sums) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), fmax = _mm256_set1_ps(FLT_MAX);
    __m256 amax = _mm256_setzero_ps(), finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int i = 0; i < n; i += 8) {
        const __m256 a = _mm256_and_ps(abs_mask, _mm256_loadu_ps(x + i));
        finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, fmax, _CMP_LE_OQ));
        amax = _mm256_max_ps(amax, a);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, amax);
    float m = 0.0f;
    for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    const int all_finite = _mm256_movemask_ps(finite) == 0xFF;
    if (!all_finite || m == 0.0f) {
        memset(q, 0, (size_t)n);
        memset(sums, 0, (size_t)(n / 16) * sizeof(int16_t));
        *d = all_finite ? 0.0f : NAN;
        return;
    }
    const __m256 iscale = _mm256_set1_ps(127.0f / m), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (int i = 0; i < n; i += 16) {
        __m256i iv[2];
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * h), iscale),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            iv[h] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(v, hi), lo));
        }
        /* int32 -> int8 in value order (packs work per 128-bit lane: permute back) */
        const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[0], iv[1]), 0xD8);
        const __m128i w8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
        _mm_storeu_si128((__m128i *)(q + i), w8);
        const __m256i s = _mm256_add_epi32(iv[0], iv[1]);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        sums[i / 16] = (int16_t)_mm_cvtsi128_si32(t);
    }
    *d = m / 127.0f;
}

const int quantize_avx2_built = 1;
#else
void quantize_block_avx2(const float *x, int n, int8_t *q, float *d, int16_t *sums) {
    (void)x, (void)n, (void)q, (void)d, (void)sums;
}
const int quantize_avx2_built = 0;   /* built without AVX2: never called */
#endif
