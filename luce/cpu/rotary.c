/* NEOX rotary (plain and M-RoPE / IMROPE sections) of the cpu backend. Reference:
 * luce/ref/rotary.py.
 *
 * Pair i of the first rope_dim dims of every head, (x[i], x[i + rope_dim/2]), rotates by
 * angle = p * theta^(-2i / rope_dim) with p the row's position (M-RoPE: the position of the
 * pair's section by ggml's imrope rule). Angles, cos and sin in double (libm), the rotation
 * in double, rounded to f32 once, as the reference. cos/sin are computed once per (row,
 * pair) for all heads; positions [T] with sections read the same position everywhere.
 * Rows are independent; threads take contiguous row ranges.
 */
#include <stdlib.h>

#include "seq_common.h"
#include "pool.h"

#define ROPE_SERIAL_ROWS 16

/* ggml's imrope: which of (t, h, w, e) rotates pair i */
static int imrope_section(int64_t i, const int64_t *sec) {
    int64_t total = sec[0] + sec[1] + sec[2] + sec[3], sector = i % total;
    if (sector % 3 == 1 && sector < 3 * sec[1]) return 1;
    if (sector % 3 == 2 && sector < 3 * sec[2]) return 2;
    if (sector % 3 == 0 && sector < 3 * sec[0]) return 0;
    return 3;
}

static void rope_rows(const float *x, float *y, const int64_t *positions, int64_t pos_cols, int64_t t0, int64_t t1,
                      int64_t H, int64_t D, int64_t half, const double *inv_freq, const int *section,
                      double *cs) {
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t i = 0; i < half; i++) {
            int64_t p = positions[t * pos_cols + (section ? section[i] : 0)];
            double angle = (double)p * inv_freq[i];
            cs[2 * i] = cos(angle);
            cs[2 * i + 1] = sin(angle);
        }
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (t * H + h) * D;
            float *yr = y + (t * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                double x0 = (double)xr[i], x1 = (double)xr[i + half], c = cs[2 * i], s = cs[2 * i + 1];
                float a = (float)(x0 * c - x1 * s), b = (float)(x0 * s + x1 * c);
                yr[i] = a;
                yr[i + half] = b;
            }
            if (yr != xr)
                for (int64_t d = 2 * half; d < D; d++) yr[d] = xr[d];
        }
    }
}

typedef struct {
    const float *x;
    float *y;
    const int64_t *positions;
    int64_t pos_cols, H, D, half;
    const double *inv_freq;
    const int *section;
    int status;
} rope_job;

static void rope_range(void *ctx, int64_t r0, int64_t r1) {
    rope_job *j = ctx;
    double *cs = seq_scratch(0, (size_t)(2 * j->half + 1) * sizeof(double));
    if (cs == NULL)
        __atomic_store_n(&j->status, LUCE_CPU_ENOMEM, __ATOMIC_RELAXED);
    else
        rope_rows(j->x, j->y, j->positions, j->pos_cols, r0, r1, j->H, j->D, j->half, j->inv_freq, j->section, cs);
}

int luce_cpu_rope(const float *x, float *y, const int64_t *positions, int64_t pos_cols, int64_t T,
                  int64_t H, int64_t D, int64_t rope_dim, double theta, const int64_t *sections) {
    if (T < 0 || H < 0 || D <= 0 || rope_dim < 0 || rope_dim > D || rope_dim % 2) return LUCE_CPU_EARG;
    if (pos_cols != 1 && !(sections && pos_cols == 4)) return LUCE_CPU_EARG;
    if (pos_cols == 1) sections = NULL;   /* one position per row: every section reads it */
    if (sections && (sections[0] + sections[1] + sections[2] + sections[3] <= 0)) return LUCE_CPU_EARG;
    int64_t half = rope_dim / 2;
    double *inv_freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(double));
    int *section = sections ? malloc((size_t)(half > 0 ? half : 1) * sizeof(int)) : NULL;
    if (!inv_freq || (sections && !section)) {
        free(inv_freq);
        free(section);
        return LUCE_CPU_ENOMEM;
    }
    for (int64_t i = 0; i < half; i++) {
        inv_freq[i] = pow(theta, (-2.0 * (double)i) / (double)rope_dim);
        if (section) section[i] = imrope_section(i, sections);
    }
    int64_t parts = T >= ROPE_SERIAL_ROWS ? luce_cpu_get_threads() : 1;
    rope_job j = {x, y, positions, pos_cols, H, D, half, inv_freq, section, LUCE_CPU_OK};
    pool_ranges(T, parts, rope_range, &j);
    free(inv_freq);
    free(section);
    return j.status;
}
