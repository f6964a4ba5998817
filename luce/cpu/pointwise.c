/* Elementwise maths of the cpu backend. References: luce/ref/pointwise.py (sigmoid,
 * softplus, exp), luce/ref/swiglu.py (silu, swiglu).
 *
 * Each value is computed in double from its f32 input and rounded to f32 once, as the
 * references do: exp by seq_exp (seq_common.h, vectorized, < 1e-15 relative), softplus as
 * numpy's logaddexp(0, x) = max(x, 0) + log1p(exp(-|x|)) with libm log1p. Results differ
 * from the references by at most one f32 ulp (a near-tie rounded the other way). Elementwise
 * results do not depend on how threads split the array.
 */
#include "seq_common.h"
#include "pool.h"

#define POINTWISE_SERIAL 65536   /* below this many values one thread is faster than a fork */
#define POINTWISE_CHUNK 16384    /* values per task above it */

/* x == y is allowed: each value is read before it is written (no restrict) */
LUCE_CLONES static void unary_range(const float *x, float *y, int64_t i0, int64_t i1, int op) {
    switch (op) {
    case LUCE_UNARY_SILU:
        for (int64_t i = i0; i < i1; i++) y[i] = (float)seq_silu((double)x[i]);
        break;
    case LUCE_UNARY_SIGMOID:
        for (int64_t i = i0; i < i1; i++) y[i] = (float)(1.0 / (1.0 + seq_exp(-(double)x[i])));
        break;
    case LUCE_UNARY_EXP:
        for (int64_t i = i0; i < i1; i++) y[i] = (float)seq_exp((double)x[i]);
        break;
    default:   /* LUCE_UNARY_SOFTPLUS */
        for (int64_t i = i0; i < i1; i++) {
            double v = (double)x[i];
            y[i] = (float)((v > 0.0 ? v : 0.0) + log1p(seq_exp(-fabs(v))));
        }
    }
}

typedef struct {
    const float *x, *up;
    float *y;
    int op;
} pointwise_job;

static void unary_part(void *ctx, int64_t i0, int64_t i1) {
    const pointwise_job *j = ctx;
    unary_range(j->x, j->y, i0, i1, j->op);
}

static int64_t pointwise_parts(int64_t n) {
    return n >= POINTWISE_SERIAL ? (n + POINTWISE_CHUNK - 1) / POINTWISE_CHUNK : 1;
}

int luce_cpu_unary(const float *x, float *y, int64_t n, int op) {
    if (n < 0 || op < LUCE_UNARY_SILU || op > LUCE_UNARY_EXP) return LUCE_CPU_EARG;
    pointwise_job j = {x, NULL, y, op};
    pool_ranges(n, pointwise_parts(n), unary_part, &j);
    return LUCE_CPU_OK;
}

LUCE_CLONES static void swiglu_range(const float *gate, const float *up, float *y, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) y[i] = (float)(seq_silu((double)gate[i]) * (double)up[i]);
}

static void swiglu_part(void *ctx, int64_t i0, int64_t i1) {
    const pointwise_job *j = ctx;
    swiglu_range(j->x, j->up, j->y, i0, i1);
}

int luce_cpu_swiglu(const float *gate, const float *up, float *y, int64_t n) {
    if (n < 0) return LUCE_CPU_EARG;
    pointwise_job j = {gate, up, y, 0};
    pool_ranges(n, pointwise_parts(n), swiglu_part, &j);
    return LUCE_CPU_OK;
}
