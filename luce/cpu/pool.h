/* The cpu kernels' thread pool (pool.c). */
#ifndef LUCE_CPU_POOL_H
#define LUCE_CPU_POOL_H

#include <stdint.h>

typedef void (*pool_task_fn)(void *ctx, int64_t task);

/* fn(ctx, t) for every t in [0, n_tasks), on up to `threads` threads (the caller is one);
 * returns when all are done. Not reentrant: kernels call it from one thread at a time. */
void pool_run(int64_t n_tasks, pool_task_fn fn, void *ctx, int threads);

/* fn(ctx, i0, i1) over `parts` contiguous ranges covering [0, n), on the kernels' threads */
typedef void (*pool_range_fn)(void *ctx, int64_t i0, int64_t i1);
void pool_ranges(int64_t n, int64_t parts, pool_range_fn fn, void *ctx);

/* tasks [0, n) on the kernels' threads (luce_cpu_set_threads) */
void pool_tasks(int64_t n, pool_task_fn fn, void *ctx);

#endif
