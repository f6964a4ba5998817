/* AVX-512 activation quantization: quantize_act.c's arithmetic lane for lane (the same f32
 * multiply by 127 / amax, round to nearest even, clamp, exact integer sums), so the int8 values,
 * scales and sums are bitwise the portable ones (tests/kernels/test_cpu_quantize_act.py). The
 * portable loop calls rintf per value (a library call without SSE4.1): a quarter of a decode
 * step's matmul time at one row, and more at several. */
#include "matmul.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <float.h>
#include <immintrin.h>

/* one block of n values (n a multiple of 16) */
void quantize_block_avx512(const float *x, int n, int8_t *q, float *d, int16_t *sums) {
    const __m512 fmax = _mm512_set1_ps(FLT_MAX);
    __m512 amax = _mm512_setzero_ps();
    __mmask16 finite = 0xFFFF;
    for (int i = 0; i < n; i += 16) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        finite &= _mm512_cmp_ps_mask(a, fmax, _CMP_LE_OQ);
        amax = _mm512_max_ps(amax, a);
    }
    const float m = _mm512_reduce_max_ps(amax);
    if (finite != 0xFFFF || m == 0.0f) {
        memset(q, 0, (size_t)n);
        memset(sums, 0, (size_t)(n / 16) * sizeof(int16_t));
        *d = finite != 0xFFFF ? NAN : 0.0f;
        return;
    }
    const __m512 iscale = _mm512_set1_ps(127.0f / m), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), iscale),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
        const __m512i iv = _mm512_cvtps_epi32(v);
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(iv));
        sums[i / 16] = (int16_t)_mm512_reduce_add_epi32(iv);
    }
    *d = m / 127.0f;
}

const int quantize_avx512_built = 1;
#else
void quantize_block_avx512(const float *x, int n, int8_t *q, float *d, int16_t *sums) {
    (void)x, (void)n, (void)q, (void)d, (void)sums;
}
const int quantize_avx512_built = 0;   /* built without AVX-512: never called */
#endif
