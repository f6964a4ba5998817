/* Activation quantization for the block-type matmuls (one implementation for every path).
 *
 * Per block of B values (B = 256 for K-quants and IQ4_XS, 32 for Q8_0 and Q5_0):
 *     amax = max |x_i|;  dx = amax / 127;  qx_i = rint(x_i * (127 / amax))  in [-127, 127]
 * (all zero when amax is 0), plus the int16 sum of every 16 consecutive qx. A block holding
 * inf or NaN gets dx = NaN, so its output rows are NaN rather than silently finite.
 * Error against f32: |x_i - dx qx_i| <= amax / 254 per value (tests/kernels/test_cpu_matmul.py).
 */
#include <float.h>
#include <math.h>

#include "matmul.h"

void quantize_block_portable(const float *x, int n, int8_t *q, float *d, int16_t *sums) {
    if (n <= 0) return;   /* blocks hold 32 or 256 values */
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        finite &= (a <= FLT_MAX);
        amax = a > amax ? a : amax;
    }
    if (!finite || amax == 0.0f) {
        memset(q, 0, (size_t)n);
        *d = finite ? 0.0f : NAN;
    } else {
        float iscale = 127.0f / amax;
        for (int i = 0; i < n; i++) {
            float v = rintf(x[i] * iscale);
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
            q[i] = (int8_t)v;
        }
        *d = amax / 127.0f;
    }
    for (int g = 0; g < n / 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += q[16 * g + i];
        sums[g] = (int16_t)s;
    }
}

void quantize_rows(quantize_block_fn block_fn, const float *x, int64_t T, int64_t K, int block, int8_t *qs,
                   float *dx, int16_t *bsums) {
    int64_t nb = K / block;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++)
            block_fn(x + t * K + b * block, block, qs + t * K + b * block, dx + t * nb + b,
                     bsums + t * (K / 16) + b * (block / 16));
}
