/* Matmul driver: picks the instruction-set path, quantizes x once per activation format,
 * then splits every weight's output columns into tasks that threads take in any order (a
 * task computes all T rows of its columns, so an output never depends on the split). */
#include <stdlib.h>

#include "cpu_ops.h"
#include "decode.h"
#include "matmul.h"
#include "packed.h"
#include "pool.h"

/* Columns per task: a multiple of 16 (the widest tile), about TASKS_PER_THREAD tasks per thread
 * and weight, so each thread streams long runs of consecutive rows (a tile prefetches the
 * next one) while a slow thread still leaves work for the others. */
#define TASKS_PER_THREAD 2
#define MIN_COLUMNS_PER_TASK 64

static int64_t columns_per_task(int64_t n) {
    int64_t tasks = (int64_t)luce_cpu_get_threads() * TASKS_PER_THREAD;
    int64_t cols = (n + tasks - 1) / tasks;
    cols = (cols + 15) / 16 * 16;
    return cols < MIN_COLUMNS_PER_TASK ? MIN_COLUMNS_PER_TASK : cols;
}

int64_t luce_cpu_row_bytes(int32_t qtype, int64_t k) {
    int kind = mm_kind(qtype);
    if (kind < 0 || k <= 0 || k % mm_block_values(kind)) return -1;
    return k / mm_block_values(kind) * mm_block_bytes(kind);
}

/* the packed kernel of a kind on this path, or NULL (the weight's row-major bytes are used) */
static mm_tile_fn packed_tile_for(int kind) {
    const int isa = luce_cpu_get_isa();
    return isa == LUCE_ISA_AVX512 ? mm_packed_avx512[kind] : isa == LUCE_ISA_AVX2 ? mm_packed_avx2[kind] : NULL;
}

static mm_tile_fn tile_for(int kind) {
    int isa = luce_cpu_get_isa();
    mm_tile_fn f = NULL;
    if (isa == LUCE_ISA_AVX512) f = mm_tiles_avx512[kind];
    if (isa >= LUCE_ISA_AVX2 && f == NULL) f = mm_tiles_avx2[kind];
    return f ? f : mm_tiles_portable[kind];
}

typedef struct {
    int8_t *qs;
    float *dx;
    int16_t *bsums;
} act_buffers;

typedef struct {
    const float *x;
    int64_t K, rows_per_task, T;
    int format;
    act_buffers *a;
} quantize_job;

static void quantize_task(void *ctx, int64_t task) {
    const quantize_job *q = ctx;
    const int64_t K = q->K, nb = K / (q->format == ACT_Q8_K ? QK_K : QK_32);
    const int64_t t0 = task * q->rows_per_task, t1 = t0 + q->rows_per_task < q->T ? t0 + q->rows_per_task : q->T;
    const int isa = luce_cpu_get_isa();
    const quantize_block_fn fn = isa == LUCE_ISA_AVX512 && quantize_avx512_built ? quantize_block_avx512
                                 : isa >= LUCE_ISA_AVX2 && quantize_avx2_built    ? quantize_block_avx2
                                                                                   : quantize_block_portable;
    quantize_rows(fn, q->x + t0 * K, t1 - t0, K, (int)(K / nb), q->a->qs + t0 * K, q->a->dx + t0 * nb,
                  q->a->bsums + t0 * (K / 16));
}

static int quantize_x(const float *x, int64_t T, int64_t K, int format, act_buffers *a) {
    int block = format == ACT_Q8_K ? QK_K : QK_32;
    a->qs = malloc((size_t)(T * K));
    a->dx = malloc((size_t)(T * (K / block)) * sizeof(float));
    a->bsums = malloc((size_t)(T * (K / 16)) * sizeof(int16_t));
    if (!a->qs || !a->dx || !a->bsums) return LUCE_CPU_ENOMEM;
    const int threads = luce_cpu_get_threads();
    quantize_job q = {x, K, (T + threads - 1) / threads, T, format, a};
    pool_run((T + q.rows_per_task - 1) / q.rows_per_task, quantize_task, &q, threads);
    return LUCE_CPU_OK;
}

typedef struct {
    const luce_cpu_matmul_out *outs;
    const mm_job *jobs;
    const int64_t *first_task, *task_columns;
    const mm_tile_fn *tiles;   /* [n_outs] */
} columns_job;

static void columns_task(void *ctx, int64_t task) {
    const columns_job *c = ctx;
    int i = 0;
    while (c->first_task[i + 1] <= task) i++;
    const int64_t cols = c->task_columns[i];
    int64_t n0 = (task - c->first_task[i]) * cols;
    int64_t n1 = n0 + cols < c->outs[i].n ? n0 + cols : c->outs[i].n;
    c->tiles[i](&c->jobs[i], n0, n1);
}

static void free_act(act_buffers *a) {
    free(a->qs);
    free(a->dx);
    free(a->bsums);
}

int luce_cpu_matmuls(const float *x, int64_t T, int64_t K, const luce_cpu_matmul_out *outs, int n_outs) {
    if (T < 0 || K <= 0 || n_outs <= 0) return LUCE_CPU_EARG;
    int need[3] = {0, 0, 0};
    for (int i = 0; i < n_outs; i++) {
        int kind = mm_kind(outs[i].qtype);
        if (kind < 0 || luce_cpu_row_bytes(outs[i].qtype, K) != outs[i].row_bytes || outs[i].n < 0) return LUCE_CPU_EARG;
        need[mm_act_format(kind)] = 1;
    }
    if (T == 0) return LUCE_CPU_OK;
    act_buffers act[3] = {{0}};
    int rc = LUCE_CPU_OK;
    for (int f = ACT_Q8_K; f <= ACT_Q8_32 && rc == LUCE_CPU_OK; f++)
        if (need[f]) rc = quantize_x(x, T, K, f, &act[f]);
    mm_job *jobs = calloc((size_t)n_outs, sizeof(mm_job));
    int64_t *first_task = calloc((size_t)n_outs + 1, sizeof(int64_t));
    int64_t *task_columns = calloc((size_t)n_outs, sizeof(int64_t));
    mm_tile_fn *tiles = calloc((size_t)n_outs, sizeof(mm_tile_fn));
    if (!jobs || !first_task || !task_columns || !tiles) rc = LUCE_CPU_ENOMEM;
    if (rc == LUCE_CPU_OK) {
        for (int i = 0; i < n_outs; i++) {
            const int kind = mm_kind(outs[i].qtype);
            const act_buffers *a = &act[mm_act_format(kind)];
            const mm_tile_fn packed = outs[i].packed ? packed_tile_for(kind) : NULL;
            tiles[i] = packed ? packed : tile_for(kind);
            jobs[i] = (mm_job){x, a->qs, a->dx, a->bsums, T, K, packed ? outs[i].packed : outs[i].w, outs[i].row_bytes,
                               outs[i].bias, outs[i].y, outs[i].n};
            task_columns[i] = columns_per_task(outs[i].n);
            first_task[i + 1] = first_task[i] + (outs[i].n + task_columns[i] - 1) / task_columns[i];
        }
        columns_job c = {outs, jobs, first_task, task_columns, tiles};
        pool_run(first_task[n_outs], columns_task, &c, luce_cpu_get_threads());
    }
    for (int f = 0; f < 3; f++) free_act(&act[f]);
    free(jobs);
    free(first_task);
    free(task_columns);
    free(tiles);
    return rc;
}

/* rows [n] of a weight, decoded to f32 out [n, k] (the embedding; float weights are copied) */
int luce_cpu_dequantize_rows(const uint8_t *w, int32_t qtype, int64_t row_bytes, int64_t k, const int64_t *rows,
                             int64_t n, float *out) {
    int kind = mm_kind(qtype);
    if (kind < 0 || luce_cpu_row_bytes(qtype, k) != row_bytes || n < 0) return LUCE_CPU_EARG;
    const int bv = mm_block_values(kind), bb = mm_block_bytes(kind);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = w + rows[i] * row_bytes;
        float *y = out + i * k;
        if (kind == MM_F32) {
            memcpy(y, row, (size_t)k * sizeof(float));
            continue;
        }
        if (kind <= MM_BF16) {
            for (int64_t c = 0; c < k; c++)
                y[c] = kind == MM_F16 ? f16_to_f32(load_u16(row + 2 * c)) : bf16_to_f32(load_u16(row + 2 * c));
            continue;
        }
        decoded_block blk;
        for (int64_t b = 0; b < k / bv; b++, y += bv) {
            decode_block(kind, row + b * bb, &blk);
            for (int s = 0; s < blk.nsub; s++) {
                /* ggml's dequantization: d * sc * q - dmin * m, in f32 */
                const float dl = blk.d * (float)blk.sc[s], ml = blk.dmin * (float)(blk.has_min ? blk.m[s] : 0);
                for (int i2 = 0; i2 < blk.sub; i2++) y[s * blk.sub + i2] = dl * (float)blk.q[s * blk.sub + i2] - ml;
            }
        }
    }
    return LUCE_CPU_OK;
}
