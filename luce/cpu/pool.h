/* The cpu kernels' thread pool (pool.c). */
#ifndef LUCE_CPU_POOL_H
#define LUCE_CPU_POOL_H

#include <stdint.h>

typedef void (*pool_task_fn)(void *ctx, int64_t task);

/* fn(ctx, t) for every t in [0, n_tasks), on up to `threads` threads (the caller is one);
 * returns when all are done. Not reentrant: kernels call it from one thread at a time. */
void pool_run(int64_t n_tasks, pool_task_fn fn, void *ctx, int threads);

#endif
