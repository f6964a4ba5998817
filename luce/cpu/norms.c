/* Row norms of the cpu backend. References: luce/ref/rmsnorm.py (rmsnorm),
 * luce/ref/pointwise.py (l2norm), luce/ref/gated_rmsnorm.py (gated_rmsnorm).
 *
 * Per row of D: the sum of squares in double over seq_sumsq's fixed 16 lanes (each square
 * exact), then the reference's own double expression rounded to f32 once:
 *   rmsnorm        x * (1 / sqrt(ss / D + eps)) * w
 *   l2norm         x / sqrt(ss + eps)
 *   gated_rmsnorm  x * (1 / sqrt(ss / D + eps)) * w * (z / (1 + exp(-z)))
 * A row depends on itself only; threads take contiguous row ranges.
 */
#include "seq_common.h"
#include "pool.h"

#define ROWS_SERIAL_ELEMS 32768   /* below this many values one thread is faster than a fork */

enum { NORM_RMS, NORM_L2, NORM_GATED };

LUCE_CLONES static void norm_rows(int kind, const float *restrict x, const float *restrict z,
                                  const float *restrict w, float *restrict y, int64_t r0, int64_t r1, int64_t D,
                                  double eps) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        double ss = seq_sumsq(xr, D);
        if (kind == NORM_L2) {
            double norm = sqrt(ss + eps);
            for (int64_t d = 0; d < D; d++) yr[d] = (float)((double)xr[d] / norm);
            continue;
        }
        double scale = 1.0 / sqrt(ss / (double)D + eps);
        if (kind == NORM_RMS) {
            for (int64_t d = 0; d < D; d++) yr[d] = (float)((double)xr[d] * scale * (double)w[d]);
        } else {
            const float *zr = z + r * D;
            for (int64_t d = 0; d < D; d++)
                yr[d] = (float)((double)xr[d] * scale * (double)w[d] * seq_silu((double)zr[d]));
        }
    }
}

typedef struct {
    int kind;
    const float *x, *z, *w;
    float *y;
    int64_t D;
    double eps;
} norm_job;

static void norm_range(void *ctx, int64_t r0, int64_t r1) {
    const norm_job *j = ctx;
    norm_rows(j->kind, j->x, j->z, j->w, j->y, r0, r1, j->D, j->eps);
}

static int run_norm(int kind, const float *x, const float *z, const float *w, float *y, int64_t rows, int64_t D,
                    double eps) {
    if (rows < 0 || D <= 0 || !(eps >= 0.0)) return LUCE_CPU_EARG;
    int64_t parts = rows * D >= ROWS_SERIAL_ELEMS ? luce_cpu_get_threads() : 1;
    norm_job j = {kind, x, z, w, y, D, eps};
    pool_ranges(rows, parts, norm_range, &j);
    return LUCE_CPU_OK;
}

int luce_cpu_rmsnorm(const float *x, const float *weight, float *y, int64_t rows, int64_t D, double eps) {
    return run_norm(NORM_RMS, x, NULL, weight, y, rows, D, eps);
}

int luce_cpu_l2norm(const float *x, float *y, int64_t rows, int64_t D, double eps) {
    return run_norm(NORM_L2, x, NULL, NULL, y, rows, D, eps);
}

int luce_cpu_gated_rmsnorm(const float *x, const float *z, const float *weight, float *y, int64_t rows,
                           int64_t D, double eps) {
    return run_norm(NORM_GATED, x, z, weight, y, rows, D, eps);
}
