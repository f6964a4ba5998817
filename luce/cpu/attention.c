/* Paged GQA attention of the cpu backend and the paged KV write. Reference:
 * luce/ref/attention.py (paged_attention, attend_row); tree rows: luce/ref/tree_attention.py
 * (layout in luce/models/tree_rows.py).
 *
 * A task is one (row, KV head): the G = Hq / Hkv query heads of the group run together, so
 * each key and value row is read once per task. Per query head, over the row's own keys in
 * order: s_j = seq_dot(q, k_j) * scale (f32, the canonical lane order); m = max_j s_j (NaN if
 * any s_j is); p_j = (float) exp((double) s_j - m); l = sum_j p_j (double, sequential in j);
 * acc = sum_j p_j v_j (f32 fmaf, sequential in j, vectorized over d only); out = acc / l.
 * Nothing depends on other rows, the thread or where a key is stored. A tree node's keys are
 * the committed prefix then its root path: once the path is committed they are exactly the
 * keys of the AR row at the node's position, in the same order, reduced by the same code, so
 * the two rows are bitwise equal.
 */
#include <stdlib.h>

#include "seq_common.h"
#include "pool.h"

#define ATTN_GMAX 8   /* query heads scored together (a larger group runs in chunks of 8) */
#define ATTN_VCHUNK 32  /* value dims accumulated in registers at a time */
#define ATTN_VKEYS 64   /* keys per pass over a value chunk */
#define ATTN_AHEAD 8    /* keys scored ahead of the prefetch */

/* Sixteen lanes as a GNU vector: only for the shuffles of the batched reduction below (no
 * instruction set named; every target lowers it to its own registers, the same adds). */
typedef float v16f __attribute__((vector_size(64)));
#define SHUF __builtin_shufflevector

/* out[m] = seq_reduce16(a[m]) for 16 accumulators at once: each level of the fixed tree adds
 * the same lane pairs, for two (then four, eight, sixteen) accumulators per vector add. */
static inline __attribute__((always_inline)) void reduce16x16(const v16f *a, float *out) {
    v16f l1[8], l2[4], l3[2];
    for (int p = 0; p < 8; p++)   /* b_i = a_i + a_{i+8} */
        l1[p] = SHUF(a[2 * p], a[2 * p + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                SHUF(a[2 * p], a[2 * p + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int p = 0; p < 4; p++)   /* c_i = b_i + b_{i+4} */
        l2[p] = SHUF(l1[2 * p], l1[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                SHUF(l1[2 * p], l1[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int p = 0; p < 2; p++)   /* (c_0 + c_2, c_1 + c_3) */
        l3[p] = SHUF(l2[2 * p], l2[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
                SHUF(l2[2 * p], l2[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    v16f r = SHUF(l3[0], l3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
             SHUF(l3[0], l3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    memcpy(out, &r, sizeof r);
}

/* s[g * ns + j] = seq_dot(q_g, k_j) * scale for the G heads q [G, D] and keys j < n, KB = 16 / G
 * keys at a time (q loaded once per block; the block's G * KB lane sums reduced together).
 * Each (g, j) is exactly seq_dot's order: lanes over 16 i + l, fmaf, the fixed tree. */
static inline __attribute__((always_inline)) void scores_impl(const float *restrict q, const float *restrict k,
                                                              const int64_t *restrict rows, int64_t n, int64_t D,
                                                              float scale, float *restrict s, int64_t ns,
                                                              const int G) {
    const int KB = FLOAT_LANES / G;   /* G <= ATTN_GMAX = 8: at least 2 */
    int64_t full = D - D % FLOAT_LANES;
    for (int64_t j = 0; j < n; j += KB) {
        const float *kr[FLOAT_LANES];
        for (int b = 0; b < KB; b++) kr[b] = k + rows[j + b < n ? j + b : n - 1];
        for (int b = 0; b < KB && j + ATTN_AHEAD + b < n; b++)   /* a hint only: no value depends on it */
            for (int64_t line = 0; line < D; line += 16) __builtin_prefetch(k + rows[j + ATTN_AHEAD + b] + line);
        v16f acc[FLOAT_LANES];
        float (*a)[FLOAT_LANES] = (float (*)[FLOAT_LANES])acc;   /* a[b * G + g] */
        for (int m = 0; m < FLOAT_LANES; m++)
            for (int l = 0; l < FLOAT_LANES; l++) a[m][l] = 0.0f;
        for (int64_t i = 0; i < full; i += FLOAT_LANES)
            for (int g = 0; g < G; g++)
                for (int b = 0; b < KB; b++)
                    for (int l = 0; l < FLOAT_LANES; l++)
                        a[b * G + g][l] = fmaf(q[g * D + i + l], kr[b][i + l], a[b * G + g][l]);
        for (int64_t i = full; i < D; i++)
            for (int g = 0; g < G; g++)
                for (int b = 0; b < KB; b++)
                    a[b * G + g][i - full] = fmaf(q[g * D + i], kr[b][i], a[b * G + g][i - full]);
        float r[FLOAT_LANES];
        reduce16x16(acc, r);
        for (int b = 0; b < KB && j + b < n; b++)
            for (int g = 0; g < G; g++) s[g * ns + j + b] = r[b * G + g] * scale;
    }
}

/* acc [G, D] += sum_j p[g * ns + j] v_j over keys j0 <= j < j1, sequential in j for every
 * (g, d); a chunk of ATTN_VCHUNK dims of all G heads stays in registers. */
static inline __attribute__((always_inline)) void values_impl(const float *restrict p, const float *restrict v,
                                                              const int64_t *restrict rows, int64_t j0, int64_t j1,
                                                              int64_t D, int64_t ns, float *restrict acc,
                                                              const int G) {
    int64_t full = D - D % ATTN_VCHUNK;
    for (int64_t c = 0; c < full; c += ATTN_VCHUNK) {
        float a[ATTN_GMAX][ATTN_VCHUNK];
        for (int g = 0; g < G; g++)
            for (int x = 0; x < ATTN_VCHUNK; x++) a[g][x] = acc[g * D + c + x];
        for (int64_t j = j0; j < j1; j++) {
            const float *vr = v + rows[j] + c;
            if (c == 0 && j + ATTN_VKEYS < ns)   /* the next block's rows (ns = keys), a hint only */
                for (int64_t line = 0; line < D; line += 16) __builtin_prefetch(v + rows[j + ATTN_VKEYS] + line);
            for (int g = 0; g < G; g++) {
                float pj = p[g * ns + j];
                for (int x = 0; x < ATTN_VCHUNK; x++) a[g][x] = fmaf(pj, vr[x], a[g][x]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int x = 0; x < ATTN_VCHUNK; x++) acc[g * D + c + x] = a[g][x];
    }
    for (int64_t j = j0; j < j1; j++)
        for (int g = 0; g < G; g++)
            for (int64_t d = full; d < D; d++) acc[g * D + d] = fmaf(p[g * ns + j], v[rows[j] + d], acc[g * D + d]);
}

/* Softmax numerators in place over s [G, ns] (the first n of each row): p = exp(s - max), the
 * max NaN when any score is; l [G] = sum_j p_j in double, sequential in j (heads interleaved). */
static inline __attribute__((always_inline)) void softmax_impl(float *restrict s, int64_t n, int64_t ns,
                                                               double *restrict l, const int G) {
    float m[ATTN_GMAX];
    int nan[ATTN_GMAX];
    double sum[ATTN_GMAX];
    for (int g = 0; g < G; g++) {
        m[g] = s[g * ns];
        nan[g] = 0;
        sum[g] = 0.0;
    }
    for (int64_t j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            float x = s[g * ns + j];
            nan[g] |= x != x;
            m[g] = x > m[g] ? x : m[g];
        }
    for (int g = 0; g < G; g++) {
        float *sg = s + g * ns;
        double md = nan[g] ? (double)NAN : (double)m[g];
        for (int64_t j = 0; j < n; j++) sg[j] = (float)seq_exp((double)sg[j] - md);
    }
    for (int64_t j = 0; j < n; j++)
        for (int g = 0; g < G; g++) sum[g] += (double)s[g * ns + j];
    for (int g = 0; g < G; g++) l[g] = sum[g];
}

#define ATTN_KERNELS(G)                                                                                     \
    LUCE_CLONES static void scores_##G(const float *q, const float *k, const int64_t *rows, int64_t n,        \
                                       int64_t D, float scale, float *s, int64_t ns) {                        \
        scores_impl(q, k, rows, n, D, scale, s, ns, G);                                                       \
    }                                                                                                         \
    LUCE_CLONES static void values_##G(const float *p, const float *v, const int64_t *rows, int64_t j0,       \
                                       int64_t j1, int64_t D, int64_t ns, float *acc) {                       \
        values_impl(p, v, rows, j0, j1, D, ns, acc, G);                                                       \
    }                                                                                                         \
    LUCE_CLONES static void softmax_##G(float *s, int64_t n, int64_t ns, double *l) { softmax_impl(s, n, ns, l, G); }
ATTN_KERNELS(1)
ATTN_KERNELS(2)
ATTN_KERNELS(3)
ATTN_KERNELS(4)
ATTN_KERNELS(5)
ATTN_KERNELS(6)
ATTN_KERNELS(7)
ATTN_KERNELS(8)

typedef void (*scores_fn)(const float *, const float *, const int64_t *, int64_t, int64_t, float, float *, int64_t);
typedef void (*values_fn)(const float *, const float *, const int64_t *, int64_t, int64_t, int64_t, int64_t, float *);
typedef void (*softmax_fn)(float *, int64_t, int64_t, double *);
static const scores_fn SCORES[ATTN_GMAX + 1] = {NULL, scores_1, scores_2, scores_3, scores_4,
                                                scores_5, scores_6, scores_7, scores_8};
static const values_fn VALUES[ATTN_GMAX + 1] = {NULL, values_1, values_2, values_3, values_4,
                                                values_5, values_6, values_7, values_8};
static const softmax_fn SOFTMAX[ATTN_GMAX + 1] = {NULL, softmax_1, softmax_2, softmax_3, softmax_4,
                                                  softmax_5, softmax_6, softmax_7, softmax_8};

/* One task: G query heads q [G, D] over the n keys at `rows` (element offsets of the keys'
 * rows, KV head included, in k and v) -> out [G, D]. s [G, n] and acc [G, D] are scratch. */
static void attend_keys(const float *q, const float *k, const float *v, const int64_t *rows, int64_t n, int64_t G,
                        int64_t D, float scale, float *s, float *acc, float *out) {
    double l[64];
    for (int64_t g0 = 0; g0 < G; g0 += ATTN_GMAX) {
        int64_t gc = G - g0 < ATTN_GMAX ? G - g0 : ATTN_GMAX;
        SCORES[gc](q + g0 * D, k, rows, n, D, scale, s + g0 * n, n);
        SOFTMAX[gc](s + g0 * n, n, n, l + g0);
    }
    for (int64_t i = 0; i < G * D; i++) acc[i] = 0.0f;
    for (int64_t g0 = 0; g0 < G; g0 += ATTN_GMAX) {
        int64_t gc = G - g0 < ATTN_GMAX ? G - g0 : ATTN_GMAX;
        for (int64_t j0 = 0; j0 < n; j0 += ATTN_VKEYS)
            VALUES[gc](s + g0 * n, v, rows, j0, j0 + ATTN_VKEYS < n ? j0 + ATTN_VKEYS : n, D, n, acc + g0 * D);
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t d = 0; d < D; d++) out[g * D + d] = (float)((double)acc[g * D + d] / l[g]);
}

typedef struct {
    const float *q, *k, *v;
    float *out;
    const luce_cpu_batch *b;
    const uint8_t *is_tree;
    int64_t Hq, Hkv, D, G;
    float scale;
    int causal;
} attn_job;

/* Element offset of KV index idx (KV head kvh) of a segment whose pages are `pages`. */
static inline int64_t kv_offset(const attn_job *jb, const int32_t *pages, int64_t idx, int64_t kvh) {
    int64_t ps = jb->b->page_size;
    return (((int64_t)pages[idx / ps] * ps + idx % ps) * jb->Hkv + kvh) * jb->D;
}

static int attend_task(const attn_job *jb, int64_t row, int64_t kvh) {
    const luce_cpu_batch *b = jb->b;
    int64_t G = jb->G, D = jb->D;
    float *out = jb->out + (row * jb->Hq + kvh * G) * D;
    int64_t s = seq_segment_of_row(b, row);
    if (b->seq_slots[s] < 0) {
        memset(out, 0, (size_t)(G * D) * sizeof(float));
        return LUCE_CPU_OK;
    }
    int64_t r0 = b->qo_indptr[s], n_rows = b->qo_indptr[s + 1] - r0, kv_len = seq_kv_len(b, s);
    const int32_t *pages = b->kv_indices + b->kv_indptr[s];
    int64_t n_prefix, n_keys, depth = 0;
    if (jb->is_tree[s]) {
        n_prefix = kv_len - n_rows;
        for (int64_t r = row; b->tree_parents[r] >= 0; r = b->tree_parents[r]) depth++;
        n_keys = n_prefix + depth + 1;
    } else {
        n_prefix = n_keys = jb->causal ? kv_len - n_rows + (row - r0) + 1 : kv_len;
    }
    int64_t *rows = seq_scratch(0, (size_t)n_keys * sizeof(int64_t));
    float *sc = seq_scratch(1, (size_t)(G * n_keys) * sizeof(float));
    float *acc = seq_scratch(2, (size_t)(G * D) * sizeof(float));
    if (!rows || !sc || !acc) return LUCE_CPU_ENOMEM;
    int64_t ps = b->page_size, row_elems = jb->Hkv * D;
    for (int64_t p = 0, idx = 0; idx < n_prefix; p++) {   /* committed keys, page by page */
        int64_t base = (int64_t)pages[p] * ps * row_elems + kvh * D;
        for (int64_t off = 0; off < ps && idx < n_prefix; off++, idx++) rows[idx] = base + off * row_elems;
    }
    if (jb->is_tree[s])   /* then the root path, root first */
        for (int64_t r = row, d = depth; d >= 0; r = b->tree_parents[r], d--)
            rows[n_prefix + d] = kv_offset(jb, pages, n_prefix + (r - r0), kvh);
    attend_keys(jb->q + (row * jb->Hq + kvh * G) * D, jb->k, jb->v, rows, n_keys, G, D, jb->scale, sc, acc, out);
    return LUCE_CPU_OK;
}

typedef struct {
    const attn_job *jb;
    int status;
} attn_run;

static void attend_one(void *ctx, int64_t task) {
    attn_run *a = ctx;
    int r = attend_task(a->jb, task / a->jb->Hkv, task % a->jb->Hkv);
    if (r) __atomic_store_n(&a->status, r, __ATOMIC_RELAXED);
}

int luce_cpu_attention(const float *q, const float *k_pages, const float *v_pages, float *out,
                       const luce_cpu_batch *batch, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                       int causal) {
    if (Hq <= 0 || Hkv <= 0 || D <= 0 || Hq % Hkv || Hq / Hkv > 64) return LUCE_CPU_EARG;
    int64_t S = batch->n_segments, T = batch->n_rows;
    uint8_t *is_tree = malloc((size_t)(S > 0 ? S : 1));
    if (!is_tree) return LUCE_CPU_ENOMEM;
    int rc = seq_check_batch(batch, 1, is_tree);
    if (rc == LUCE_CPU_OK && T > 0) {
        attn_job jb = {q, k_pages, v_pages, out, batch, is_tree, Hq, Hkv, D, Hq / Hkv, scale, causal};
        attn_run run = {&jb, LUCE_CPU_OK};
        pool_tasks(T * Hkv, attend_one, &run);
        rc = run.status;
    }
    free(is_tree);
    return rc;
}

typedef struct {
    float *k_pages, *v_pages;
    const float *k, *v;
    const luce_cpu_batch *batch;
    int64_t row_elems;
} kv_write_job;

static void kv_write_rows(void *ctx, int64_t t0, int64_t t1) {
    const kv_write_job *j = ctx;
    const luce_cpu_batch *batch = j->batch;
    const int64_t ps = batch->page_size, row_elems = j->row_elems;
    const size_t row_bytes = (size_t)row_elems * sizeof(float);
    for (int64_t row = t0; row < t1; row++) {
        int64_t s = seq_segment_of_row(batch, row);
        if (batch->seq_slots[s] < 0) continue;
        int64_t n = batch->qo_indptr[s + 1] - batch->qo_indptr[s];
        int64_t idx = seq_kv_len(batch, s) - n + (row - batch->qo_indptr[s]);
        int64_t page = batch->kv_indices[batch->kv_indptr[s] + idx / ps];
        int64_t dst = (page * ps + idx % ps) * row_elems;
        memcpy(j->k_pages + dst, j->k + row * row_elems, row_bytes);
        memcpy(j->v_pages + dst, j->v + row * row_elems, row_bytes);
    }
}

int luce_cpu_kv_write(float *k_pages, float *v_pages, const float *k, const float *v,
                      const luce_cpu_batch *batch, int64_t Hkv, int64_t D) {
    if (Hkv <= 0 || D <= 0) return LUCE_CPU_EARG;
    int rc = seq_check_batch(batch, 1, NULL);
    if (rc) return rc;
    const int64_t T = batch->n_rows;
    kv_write_job j = {k_pages, v_pages, k, v, batch, Hkv * D};
    pool_ranges(T, T >= 64 ? luce_cpu_get_threads() : 1, kv_write_rows, &j);   /* copies: any split, same bytes */
    return LUCE_CPU_OK;
}
