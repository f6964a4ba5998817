/* Per-thread scratch and the batch CSR checks shared by the sequence kernels (seq_common.h).
 * The checks follow luce.models.batch.ForwardBatch.validate and luce/models/tree_rows.py. */
#include <stdlib.h>

#include "seq_common.h"

static _Thread_local struct {
    void *ptr;
    size_t bytes;
} scratch[SEQ_SCRATCH_BUFFERS];

void *seq_scratch(int which, size_t bytes) {
    if (which < 0 || which >= SEQ_SCRATCH_BUFFERS) return NULL;
    if (bytes == 0) bytes = 64;
    if (scratch[which].bytes < bytes) {
        size_t grown = bytes + bytes / 2;
        grown = (grown + 63) & ~(size_t)63;
        void *p = aligned_alloc(64, grown);
        if (p == NULL) return NULL;
        free(scratch[which].ptr);
        scratch[which].ptr = p;
        scratch[which].bytes = grown;
    }
    return scratch[which].ptr;
}

static int check_tree_segment(const luce_cpu_batch *b, int64_t r0, int64_t r1, uint8_t *is_tree) {
    const int32_t *tp = b->tree_parents;
    int any = 0;
    for (int64_t r = r0; r < r1; r++) any |= tp[r] >= 0;
    if (!any) return LUCE_CPU_OK;
    if (tp[r0] != -1) return LUCE_CPU_ETREE;
    for (int64_t r = r0 + 1; r < r1; r++)
        if (tp[r] < r0 || tp[r] >= r) return LUCE_CPU_ETREE;
    if (is_tree) *is_tree = 1;
    return LUCE_CPU_OK;
}

int seq_check_batch(const luce_cpu_batch *b, int kv, uint8_t *is_tree) {
    int64_t S = b->n_segments, T = b->n_rows;
    if (S < 0 || T < 0 || b->qo_indptr == NULL || b->seq_slots == NULL) return LUCE_CPU_EBATCH;
    if (b->qo_indptr[0] != 0 || b->qo_indptr[S] != T) return LUCE_CPU_EBATCH;
    for (int64_t s = 0; s < S; s++)
        if (b->qo_indptr[s + 1] < b->qo_indptr[s]) return LUCE_CPU_EBATCH;
    if (is_tree) memset(is_tree, 0, (size_t)S);
    if (!kv) return LUCE_CPU_OK;
    if (b->kv_indptr == NULL || b->kv_last_page_len == NULL || b->page_size <= 0 || b->n_pages < 0)
        return LUCE_CPU_EBATCH;
    if (b->kv_indptr[0] != 0 || b->kv_indptr[S] > b->n_indices) return LUCE_CPU_EBATCH;
    for (int64_t s = 0; s < S; s++) {
        if (b->kv_indptr[s + 1] < b->kv_indptr[s]) return LUCE_CPU_EBATCH;
        if (b->seq_slots[s] < 0) continue;
        int64_t p0 = b->kv_indptr[s], p1 = b->kv_indptr[s + 1];
        for (int64_t p = p0; p < p1; p++)
            if (b->kv_indices[p] < 0 || b->kv_indices[p] >= b->n_pages) return LUCE_CPU_EBATCH;
        if (p1 > p0 && (b->kv_last_page_len[s] < 1 || b->kv_last_page_len[s] > b->page_size))
            return LUCE_CPU_EBATCH;
        int64_t r0 = b->qo_indptr[s], r1 = b->qo_indptr[s + 1];
        if (r1 - r0 > seq_kv_len(b, s)) return LUCE_CPU_EBATCH;
        if (b->tree_parents != NULL) {
            int rc = check_tree_segment(b, r0, r1, is_tree ? is_tree + s : NULL);
            if (rc) return rc;
        }
    }
    return LUCE_CPU_OK;
}
