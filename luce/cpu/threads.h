/* Parallel loops of the cpu kernels (OpenMP when the build has it, else serial).
 * Work is split over independent outputs only; which thread runs a task never changes a result. */
#ifndef LUCE_CPU_THREADS_H
#define LUCE_CPU_THREADS_H

#include <stdint.h>

int luce_cpu_get_threads(void);

#ifdef _OPENMP
#define LUCE_PRAGMA(x) _Pragma(#x)
/* body runs once per task in [0, n_tasks), tasks taken dynamically */
#define PARALLEL_TASKS(n_tasks, task, body)                                                  \
    do {                                                                                     \
        int64_t luce_n_ = (n_tasks);                                                         \
        int luce_nt_ = luce_cpu_get_threads();                                               \
        if (luce_nt_ > luce_n_) luce_nt_ = (int)(luce_n_ > 0 ? luce_n_ : 1);                 \
        LUCE_PRAGMA(omp parallel for schedule(dynamic, 1) num_threads(luce_nt_) if (luce_nt_ > 1)) \
        for (int64_t task = 0; task < luce_n_; task++) body                                  \
    } while (0)
#else
#define PARALLEL_TASKS(n_tasks, task, body)                                                  \
    do {                                                                                     \
        int64_t luce_n_ = (n_tasks);                                                         \
        for (int64_t task = 0; task < luce_n_; task++) body                                  \
    } while (0)
#endif

/* body runs on contiguous row ranges [r0, r1) covering [0, n_rows) */
#define PARALLEL_FOR_ROWS(n_rows, r0, r1, body)                                              \
    do {                                                                                     \
        int64_t luce_rows_ = (n_rows), luce_parts_ = luce_cpu_get_threads();                 \
        if (luce_parts_ > luce_rows_) luce_parts_ = luce_rows_;                               \
        PARALLEL_TASKS(luce_parts_, luce_part_, {                                            \
            int64_t r0 = luce_rows_ * luce_part_ / luce_parts_;                               \
            int64_t r1 = luce_rows_ * (luce_part_ + 1) / luce_parts_;                         \
            body                                                                             \
        });                                                                                  \
    } while (0)

#endif
