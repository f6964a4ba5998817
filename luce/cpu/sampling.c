/* Greedy and top-k of the cpu backend (reference: luce/ref/sampling.py argmax, top_k_logprobs).
 *
 * One row per task. argmax: the first maximum (ties to the lowest id). top_k_logprobs: the k
 * largest logits in descending order, ties to the lowest id (the scan runs in id order and
 * only a strictly larger value displaces), and each one's log-softmax over the whole row:
 * x - m - log(sum_j exp(x_j - m)) in double, m the row maximum, the sum over 8 lanes in a
 * fixed order (row_sum_exp). A row
 * holding NaN gets id -1 (the caller names the row). */
#include <math.h>

#include "cpu_sequence_ops.h"
#include "pool.h"
#include "seq_common.h"

#define TOPK_MAX 64

typedef struct {
    const float *logits;
    int64_t V, k;
    int64_t *ids;
    float *logprobs;
} sample_job;

/* sum_j exp(x_j - m) in double: 8 lanes (lane l takes j = 8i + l, in order), then a fixed tree */
LUCE_CLONES static double row_sum_exp(const float *x, int64_t V, float m) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const double md = (double)m;
    int64_t i = 0;
    for (; i + 8 <= V; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += seq_exp((double)x[i + l] - md);
    for (int l = 0; i + l < V; l++) lane[l] += seq_exp((double)x[i + l] - md);
    return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

static int64_t row_max(const float *x, int64_t V, float *m) {
    int64_t best = 0;
    float v = x[0];
    for (int64_t i = 0; i < V; i++) {
        if (x[i] != x[i]) return -1;
        if (x[i] > v) v = x[i], best = i;
    }
    *m = v;
    return best;
}

static void argmax_row(void *ctx, int64_t row) {
    const sample_job *j = ctx;
    float m;
    j->ids[row] = row_max(j->logits + row * j->V, j->V, &m);
}

static void top_k_row(void *ctx, int64_t row) {
    const sample_job *j = ctx;
    const float *x = j->logits + row * j->V;
    const int64_t k = j->k;
    int64_t *ids = j->ids + row * k;
    float *lp = j->logprobs + row * k, m;
    if (row_max(x, j->V, &m) < 0) {
        for (int64_t i = 0; i < k; i++) ids[i] = -1, lp[i] = NAN;
        return;
    }
    float top[TOPK_MAX];
    int64_t n = 0;
    for (int64_t i = 0; i < j->V; i++) {
        float v = x[i];
        if (n == k && !(v > top[k - 1])) continue;
        int64_t at = n < k ? n++ : k - 1;        /* the slot it takes, then sift up */
        while (at > 0 && v > top[at - 1]) {
            top[at] = top[at - 1];
            ids[at] = ids[at - 1];
            at--;
        }
        top[at] = v;
        ids[at] = i;
    }
    const double log_z = log(row_sum_exp(x, j->V, m));
    for (int64_t i = 0; i < k; i++) lp[i] = (float)((double)top[i] - (double)m - log_z);
}

int luce_cpu_argmax(const float *logits, int64_t L, int64_t V, int64_t *ids) {
    if (L < 0 || V <= 0) return LUCE_CPU_EARG;
    sample_job j = {logits, V, 1, ids, NULL};
    pool_tasks(L, argmax_row, &j);
    return LUCE_CPU_OK;
}

int luce_cpu_top_k_logprobs(const float *logits, int64_t L, int64_t V, int64_t k, int64_t *ids, float *logprobs) {
    if (L < 0 || V <= 0 || k < 1 || k > V || k > TOPK_MAX) return LUCE_CPU_EARG;
    sample_job j = {logits, V, k, ids, logprobs};
    pool_tasks(L, top_k_row, &j);
    return LUCE_CPU_OK;
}
