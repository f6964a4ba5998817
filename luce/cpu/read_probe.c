/* The memory roof for tools/bench_cpu.py: stream n bytes once with every pool thread, as the
 * matmul streams its weights (a sum of 64-bit words, so nothing is skipped), prefetching ahead
 * as the matmul does (this machine's hardware prefetch alone reached ~22 GB/s). */
#include "cpu_ops.h"
#include "pool.h"

typedef struct {
    const uint64_t *words;
    int64_t n_words, per_task;
    uint64_t sums[256];
} probe_job;

static void probe_task(void *ctx, int64_t task) {
    probe_job *p = ctx;
    const int64_t w0 = task * p->per_task, w1 = w0 + p->per_task < p->n_words ? w0 + p->per_task : p->n_words;
    uint64_t s[8] = {0};
    for (int64_t i = w0; i + 8 <= w1; i += 8) {
        __builtin_prefetch(p->words + i + 256);   /* 2 KiB ahead */
        for (int l = 0; l < 8; l++) s[l] += p->words[i + l];
    }
    p->sums[task] = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
}

uint64_t luce_cpu_read_probe(const uint8_t *buf, int64_t n_bytes) {
    int threads = luce_cpu_get_threads();
    if (threads > 256) threads = 256;
    probe_job p = {(const uint64_t *)buf, n_bytes / 8, 0, {0}};
    p.per_task = (p.n_words + threads - 1) / threads;
    pool_run(threads, probe_task, &p, threads);
    uint64_t x = 0;
    for (int t = 0; t < threads; t++) x ^= p.sums[t];
    return x;
}
