/* Gated DeltaNet over a draft tree on the cpu: exact verify (factor capture, or per-node
 * stored states) and the factor-replay commit. Reference: luce/ref/gdn_tree.py
 * (gdn_tree_verify, gdn_tree_verify_baseline, gdn_tree_commit); DESIGN.md section 3.
 *
 * Every node runs gdn_token (gdn.c, the AR step) from its parent's state, so node outputs
 * are bitwise the AR outputs of the node's root path; commit replays the path's factors
 * (k, g, u) with gdn_token's own write, so the committed state is bitwise what AR decoding of
 * the same tokens leaves. Factor mode walks the tree depth first with one running state per
 * head, saving a copy only at a branch node while children remain (children visited smallest
 * subtree first: at most floor(log2 n) saves alive); baseline mode keeps every node's state.
 * Threads take heads (independent states).
 */
#include <stdlib.h>

#include "gdn_step.h"
#include "pool.h"

static int check_parents(const int32_t *parents, int64_t n) {
    if (n < 1 || parents[0] != -1) return LUCE_CPU_ETREE;
    for (int64_t i = 1; i < n; i++)
        if (parents[i] < 0 || parents[i] >= i) return LUCE_CPU_ETREE;
    return LUCE_CPU_OK;
}

/* The depth-first walk: order [n] visit order; restore[node] the save slot the node starts
 * from (-1: the running state, which then holds its parent's state); save[node] the slot its
 * state is copied into (-1: none). Returns the number of slots, or -1 when out of memory. */
static int64_t walk_schedule(const int32_t *parents, int64_t n, int32_t *order, int32_t *restore, int32_t *save) {
    int64_t *size = malloc((size_t)n * sizeof(int64_t)), *first = calloc((size_t)n + 1, sizeof(int64_t));
    int32_t *kids = malloc((size_t)n * sizeof(int32_t)), *stack = malloc((size_t)n * sizeof(int32_t));
    int32_t *seen = calloc((size_t)n, sizeof(int32_t));
    int64_t slots = -1;
    if (!size || !first || !kids || !stack || !seen) goto out;
    for (int64_t i = 0; i < n; i++) size[i] = 1;
    for (int64_t i = n - 1; i > 0; i--) size[parents[i]] += size[i];
    for (int64_t i = 1; i < n; i++) first[parents[i] + 1]++;                 /* children CSR */
    for (int64_t i = 0; i < n; i++) first[i + 1] += first[i];
    for (int64_t i = 1; i < n; i++) kids[first[parents[i]] + seen[parents[i]]++] = (int32_t)i;
    for (int64_t p = 0; p < n; p++)                                           /* by (size, id) */
        for (int64_t a = first[p] + 1; a < first[p + 1]; a++)
            for (int64_t b = a; b > first[p]; b--) {
                int32_t x = kids[b - 1], y = kids[b];
                if (size[x] < size[y] || (size[x] == size[y] && x < y)) break;
                kids[b - 1] = y;
                kids[b] = x;
            }
    int64_t top = 0, visited = 0, alive = 0, peak = 0;
    stack[top++] = 0;
    for (int64_t i = 0; i < n; i++) seen[i] = 0;   /* now: children of i visited so far */
    while (top > 0) {
        int32_t node = stack[--top], p = parents[node];
        order[visited++] = node;
        restore[node] = save[node] = -1;
        if (p >= 0 && first[p + 1] - first[p] > 1) {
            int64_t k = seen[p]++;
            if (k > 0) restore[node] = save[p];
            if (k == first[p + 1] - first[p] - 1) alive--;   /* last child consumes the save */
        }
        if (first[node + 1] - first[node] > 1) {
            save[node] = (int32_t)alive++;
            peak = alive > peak ? alive : peak;
        }
        for (int64_t c = first[node + 1] - 1; c >= first[node]; c--) stack[top++] = kids[c];
    }
    slots = peak;
out:
    free(size);
    free(first);
    free(kids);
    free(stack);
    free(seen);
    return slots;
}

static void verify_factor_head(const luce_cpu_gdn_rows *r, int64_t head, const int32_t *order,
                               const int32_t *restore, const int32_t *save, float *h, float *saves, float *o,
                               float *u) {
    int64_t H = r->H, Dk = r->Dk, Dv = r->Dv, he = Dk * Dv;
    for (int64_t i = 0; i < r->T; i++) {
        int64_t node = order[i], th = node * H + head;
        if (restore[node] >= 0) memcpy(h, saves + restore[node] * he, (size_t)he * sizeof(float));
        gdn_token(h, Dk, Dv, gdn_decay(r->g[th]), r->k + th * Dk, r->v + th * Dv, r->beta[th], u + th * Dv,
                  r->q + th * Dk, o + th * Dv);
        if (save[node] >= 0) memcpy(saves + save[node] * he, h, (size_t)he * sizeof(float));
    }
}

static void verify_baseline_head(const luce_cpu_gdn_rows *r, int64_t head, const int32_t *parents,
                                 const float *state, float *o, float *node_states) {
    int64_t H = r->H, Dk = r->Dk, Dv = r->Dv, he = Dk * Dv;
    float u[GDN_MAX_DV];
    for (int64_t node = 0; node < r->T; node++) {
        int64_t th = node * H + head, p = parents[node];
        float *h = node_states + th * he;
        memcpy(h, p < 0 ? state + head * he : node_states + (p * H + head) * he, (size_t)he * sizeof(float));
        gdn_token(h, Dk, Dv, gdn_decay(r->g[th]), r->k + th * Dk, r->v + th * Dv, r->beta[th], u, r->q + th * Dk,
                  o + th * Dv);
    }
}

typedef struct {
    const luce_cpu_gdn_rows *r;
    const int32_t *parents, *sched;
    const float *state;
    float *o, *u, *node_states;
    int64_t slots;
    int status;
} verify_job;

static void verify_baseline_task(void *ctx, int64_t head) {
    const verify_job *j = ctx;
    verify_baseline_head(j->r, head, j->parents, j->state, j->o, j->node_states);
}

static void verify_factor_task(void *ctx, int64_t head) {
    verify_job *j = ctx;
    const int64_t n = j->r->T, he = j->r->Dk * j->r->Dv;
    float *h = seq_scratch(0, (size_t)((1 + j->slots) * he) * sizeof(float));
    if (h == NULL) {
        __atomic_store_n(&j->status, LUCE_CPU_ENOMEM, __ATOMIC_RELAXED);
        return;
    }
    memcpy(h, j->state + head * he, (size_t)he * sizeof(float));
    verify_factor_head(j->r, head, j->sched, j->sched + n, j->sched + 2 * n, h, h + he, j->o, j->u);
}

int luce_cpu_gdn_tree_verify(const luce_cpu_gdn_rows *r, const int32_t *parents, const float *state,
                             float *o, float *u, float *node_states) {
    int rc = gdn_check_rows(r);
    if (rc == LUCE_CPU_OK) rc = check_parents(parents, r->T);
    if (rc == LUCE_CPU_OK && (u == NULL) == (node_states == NULL)) rc = LUCE_CPU_EARG;
    if (rc) return rc;
    int64_t n = r->T;
    verify_job j = {r, parents, NULL, state, o, u, node_states, 0, LUCE_CPU_OK};
    if (node_states != NULL) {
        pool_tasks(r->H, verify_baseline_task, &j);
        return LUCE_CPU_OK;
    }
    int32_t *sched = malloc((size_t)(3 * n) * sizeof(int32_t));
    j.slots = sched ? walk_schedule(parents, n, sched, sched + n, sched + 2 * n) : -1;
    j.sched = sched;
    j.status = j.slots < 0 ? LUCE_CPU_ENOMEM : LUCE_CPU_OK;
    if (j.status == LUCE_CPU_OK) pool_tasks(r->H, verify_factor_task, &j);
    free(sched);
    return j.status;
}

typedef struct {
    const float *k, *g, *u;
    const int32_t *path;
    int64_t n_path, H, Dk, Dv;
    float *state;
} commit_job;

static void commit_head(void *ctx, int64_t head) {
    const commit_job *j = ctx;
    float *h = j->state + head * j->Dk * j->Dv;
    for (int64_t i = 0; i < j->n_path; i++) {
        int64_t th = (int64_t)j->path[i] * j->H + head;
        gdn_token(h, j->Dk, j->Dv, gdn_decay(j->g[th]), j->k + th * j->Dk, NULL, 0.0f, (float *)(j->u + th * j->Dv),
                  NULL, NULL);
    }
}

int luce_cpu_gdn_tree_commit(const float *k, const float *g, const float *u, const int32_t *parents,
                             int64_t n, const int32_t *path, int64_t n_path, float *state, int64_t H,
                             int64_t Dk, int64_t Dv) {
    if (H <= 0 || Dk <= 0 || Dv <= 0 || Dv > GDN_MAX_DV || n_path < 1) return LUCE_CPU_EARG;
    int rc = check_parents(parents, n);
    if (rc) return rc;
    if (path[0] != 0) return LUCE_CPU_ETREE;
    for (int64_t i = 1; i < n_path; i++)
        if (path[i] < 0 || path[i] >= n || parents[path[i]] != path[i - 1]) return LUCE_CPU_ETREE;
    commit_job j = {k, g, u, path, n_path, H, Dk, Dv, state};
    pool_tasks(H, commit_head, &j);
    return LUCE_CPU_OK;
}
