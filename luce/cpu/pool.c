/* The cpu kernels' thread pool: run n independent tasks on up to luce_cpu_get_threads()
 * threads, the caller included.
 *
 * Tasks are taken from one shared counter, so which thread runs a task never changes a
 * result. The caller returns once every task is done and every worker that joined has left:
 * it never waits for a worker that has not joined (one the OS has not scheduled), which is
 * what made OpenMP's barrier cost a whole scheduler quantum (~4 ms) per call on a busy
 * 2-core machine. Idle workers spin briefly (a decode step calls the pool every few tens of
 * microseconds), then sleep on a condition variable.
 */
#define _POSIX_C_SOURCE 200809L   /* clock_gettime, pthread_atfork under -std=c11 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cpu_ops.h"
#include "pool.h"

#define SPIN_NS 300000   /* how long an idle worker spins before sleeping */
#define MAX_WORKERS 255

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

static struct {
    pthread_mutex_t lock;        /* guards starting/stopping workers and sleeping */
    pthread_cond_t wake;
    pthread_t threads[MAX_WORKERS];
    int n_workers;
    atomic_int stop;
    atomic_int sleepers;
    atomic_uint_fast64_t gen;    /* bumped to publish a job */
    atomic_uint_fast64_t closed; /* the last generation whose tasks are all taken and done */
    atomic_int active;           /* workers inside the current job */
    /* the job (written by the caller before bumping gen, read by joined workers) */
    pool_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next;
    atomic_int_fast64_t done;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void take_tasks(void) {
    for (;;) {
        int64_t t = atomic_fetch_add(&P.next, 1);
        if (t >= P.n_tasks) return;
        P.fn(P.ctx, t);
        atomic_fetch_add(&P.done, 1);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    uint64_t seen = atomic_load(&P.gen);
    while (!atomic_load(&P.stop)) {
        uint64_t g = atomic_load(&P.gen);
        if (g == seen) {
            int64_t t0 = now_ns();
            while ((g = atomic_load(&P.gen)) == seen && !atomic_load(&P.stop) && now_ns() - t0 < SPIN_NS)
                for (int i = 0; i < 64; i++) CPU_RELAX();
            if (g == seen) {
                pthread_mutex_lock(&P.lock);
                atomic_fetch_add(&P.sleepers, 1);
                while ((g = atomic_load(&P.gen)) == seen && !atomic_load(&P.stop)) pthread_cond_wait(&P.wake, &P.lock);
                atomic_fetch_sub(&P.sleepers, 1);
                pthread_mutex_unlock(&P.lock);
            }
            continue;
        }
        seen = g;
        atomic_fetch_add(&P.active, 1);
        if (atomic_load(&P.gen) == g && atomic_load(&P.closed) < g) take_tasks();
        atomic_fetch_sub(&P.active, 1);
    }
    return NULL;
}

static void stop_workers(void) {
    pthread_mutex_lock(&P.lock);
    atomic_store(&P.stop, 1);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.lock);
    for (int i = 0; i < P.n_workers; i++) pthread_join(P.threads[i], NULL);
    P.n_workers = 0;
    atomic_store(&P.stop, 0);
}

/* a forked child has none of the parent's threads: start over */
static void after_fork_in_child(void) {
    pthread_mutex_init(&run_lock, NULL);
    pthread_mutex_init(&P.lock, NULL);
    pthread_cond_init(&P.wake, NULL);
    P.n_workers = 0;
    atomic_store(&P.stop, 0);
    atomic_store(&P.sleepers, 0);
    atomic_store(&P.active, 0);
}

static void ensure_workers(int n) {
    static int atfork_done = 0;
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, after_fork_in_child);
        atfork_done = 1;
    }
    if (n > MAX_WORKERS) n = MAX_WORKERS;
    if (n == P.n_workers) return;
    stop_workers();
    for (int i = 0; i < n; i++)
        if (pthread_create(&P.threads[i], NULL, worker_main, NULL) == 0) P.n_workers++;
}

void pool_run(int64_t n_tasks, pool_task_fn fn, void *ctx, int threads) {
    if (n_tasks <= 0) return;
    if (threads > n_tasks) threads = (int)n_tasks;
    if (threads <= 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t);
        return;
    }
    pthread_mutex_lock(&run_lock);
    ensure_workers(threads - 1);
    P.fn = fn;
    P.ctx = ctx;
    P.n_tasks = n_tasks;
    atomic_store(&P.next, 0);
    atomic_store(&P.done, 0);
    uint64_t g = atomic_fetch_add(&P.gen, 1) + 1;
    if (atomic_load(&P.sleepers) > 0) {
        pthread_mutex_lock(&P.lock);
        pthread_cond_broadcast(&P.wake);
        pthread_mutex_unlock(&P.lock);
    }
    take_tasks();
    while (atomic_load(&P.done) < n_tasks) CPU_RELAX();
    atomic_store(&P.closed, g);
    while (atomic_load(&P.active) > 0) CPU_RELAX();
    pthread_mutex_unlock(&run_lock);
}

typedef struct {
    int64_t n, parts;
    pool_range_fn fn;
    void *ctx;
} ranges_job;

static void range_task(void *ctx, int64_t part) {
    const ranges_job *r = ctx;
    r->fn(r->ctx, r->n * part / r->parts, r->n * (part + 1) / r->parts);
}

void pool_ranges(int64_t n, int64_t parts, pool_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (parts > n) parts = n;
    if (parts < 1) parts = 1;
    ranges_job r = {n, parts, fn, ctx};
    pool_run(parts, range_task, &r, luce_cpu_get_threads());
}

void pool_tasks(int64_t n, pool_task_fn fn, void *ctx) { pool_run(n, fn, ctx, luce_cpu_get_threads()); }
