/* Gated DeltaNet recurrence of the cpu backend: the one token update (gdn_token) that AR rows,
 * prefill chunks, tree nodes and the commit replay all run (DESIGN 3 and 5 rule 4), the
 * recurrent op and the segments op over slot pools. Reference: luce/ref/gdn_recurrent.py
 * (gdn_step, gdn_replay, gdn_recurrent); tree verify and commit are gdn_tree.c.
 *
 * Per token and value head, state h [Dk, Dv] f32 (row r = key dim, column c = value dim),
 * decay = (float) exp((double) g):
 *   u[c] = beta * (v[c] - sum_r (decay * h[r][c]) * k[r])    (fmaf, sequential in r)
 *   h[r][c] = fmaf(k[r], u[c], decay * h[r][c])
 *   o[c] = sum_r h[r][c] * q[r]                              (fmaf, sequential in r)
 * Loops over c are independent and vectorized; each sum over r keeps its order. The state
 * is f32 after every token, so tokens split over calls (prefill chunks, AR rows, tree paths)
 * give bitwise the same states and outputs. The cpu gdn_chunked runs this same recurrence
 * (no chunk form): prefill, AR and tree rows are bitwise consistent whatever the chunking.
 */
#include <stdlib.h>

#include "gdn_step.h"
#include "pool.h"

float gdn_decay(float g) { return (float)exp((double)g); }

LUCE_CLONES void gdn_token(float *restrict h, int64_t Dk, int64_t Dv, float decay, const float *restrict k,
                           const float *restrict v, float beta, float *restrict u, const float *restrict q,
                           float *restrict o) {
    if (v != NULL) {   /* delta: what the decayed state mispredicts */
        for (int64_t c = 0; c < Dv; c++) u[c] = 0.0f;
        for (int64_t r = 0; r < Dk; r++) {
            const float *hr = h + r * Dv;
            float kr = k[r];
            for (int64_t c = 0; c < Dv; c++) u[c] = fmaf(decay * hr[c], kr, u[c]);
        }
        for (int64_t c = 0; c < Dv; c++) u[c] = beta * (v[c] - u[c]);
    }
    if (q != NULL) {   /* write and read in one pass over the state */
        for (int64_t c = 0; c < Dv; c++) o[c] = 0.0f;
        for (int64_t r = 0; r < Dk; r++) {
            float *hr = h + r * Dv;
            float kr = k[r], qr = q[r];
            for (int64_t c = 0; c < Dv; c++) {
                float x = fmaf(kr, u[c], decay * hr[c]);
                hr[c] = x;
                o[c] = fmaf(x, qr, o[c]);
            }
        }
    } else {
        for (int64_t r = 0; r < Dk; r++) {
            float *hr = h + r * Dv;
            float kr = k[r];
            for (int64_t c = 0; c < Dv; c++) hr[c] = fmaf(kr, u[c], decay * hr[c]);
        }
    }
}

int gdn_check_rows(const luce_cpu_gdn_rows *r) {
    if (r->T < 0 || r->H <= 0 || r->Dk <= 0 || r->Dv <= 0 || r->Dv > GDN_MAX_DV) return LUCE_CPU_EARG;
    return LUCE_CPU_OK;
}

void gdn_run_tokens(const luce_cpu_gdn_rows *r, int64_t head, int64_t t0, int64_t t1, float *h, float *o) {
    int64_t H = r->H, Dk = r->Dk, Dv = r->Dv;
    float u[GDN_MAX_DV];
    for (int64_t t = t0; t < t1; t++) {
        int64_t th = t * H + head;
        gdn_token(h, Dk, Dv, gdn_decay(r->g[th]), r->k + th * Dk, r->v + th * Dv, r->beta[th], u, r->q + th * Dk,
                  o + th * Dv);
    }
}

typedef struct {
    const luce_cpu_gdn_rows *r;
    const float *state_in;
    float *state_out, *o;
} recurrent_job;

static void recurrent_head(void *ctx, int64_t head) {
    const recurrent_job *j = ctx;
    const int64_t head_elems = j->r->Dk * j->r->Dv;
    float *h = j->state_out + head * head_elems;
    if (j->state_in != j->state_out) memcpy(h, j->state_in + head * head_elems, (size_t)head_elems * sizeof(float));
    gdn_run_tokens(j->r, head, 0, j->r->T, h, j->o);
}

int luce_cpu_gdn_recurrent(const luce_cpu_gdn_rows *r, const float *state_in, float *state_out, float *o) {
    int rc = gdn_check_rows(r);
    if (rc) return rc;
    recurrent_job j = {r, state_in, state_out, o};
    pool_tasks(r->H, recurrent_head, &j);
    return LUCE_CPU_OK;
}

typedef struct {
    const luce_cpu_gdn_rows *r;
    float *pool, *o;
    const luce_cpu_batch *batch;
} segments_job;

static void segment_head(void *ctx, int64_t task) {
    const segments_job *j = ctx;
    const int64_t H = j->r->H, s = task / H, head = task % H, head_elems = j->r->Dk * j->r->Dv;
    const int64_t t0 = j->batch->qo_indptr[s], t1 = j->batch->qo_indptr[s + 1];
    const int32_t slot = j->batch->seq_slots[s];
    if (slot < 0) {
        for (int64_t t = t0; t < t1; t++) memset(j->o + (t * H + head) * j->r->Dv, 0, (size_t)j->r->Dv * sizeof(float));
    } else {
        gdn_run_tokens(j->r, head, t0, t1, j->pool + ((int64_t)slot * H + head) * head_elems, j->o);
    }
}

int luce_cpu_gdn_segments(const luce_cpu_gdn_rows *r, float *pool, int64_t n_slots, const luce_cpu_batch *batch,
                          float *o) {
    int rc = gdn_check_rows(r);
    if (rc == LUCE_CPU_OK && batch->n_rows != r->T) rc = LUCE_CPU_EBATCH;
    if (rc == LUCE_CPU_OK) rc = seq_check_batch(batch, 0, NULL);
    if (rc) return rc;
    int64_t S = batch->n_segments, H = r->H;
    uint8_t *taken = calloc((size_t)(n_slots > 0 ? n_slots : 1), 1);
    if (!taken) return LUCE_CPU_ENOMEM;
    for (int64_t s = 0; s < S && rc == LUCE_CPU_OK; s++) {   /* each live slot once */
        int32_t slot = batch->seq_slots[s];
        if (slot < 0) continue;
        if (slot >= n_slots || taken[slot]) rc = LUCE_CPU_ESLOT;
        else taken[slot] = 1;
    }
    free(taken);
    if (rc) return rc;
    segments_job j = {r, pool, o, batch};
    pool_tasks(S * H, segment_head, &j);
    return LUCE_CPU_OK;
}
