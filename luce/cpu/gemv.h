/* One-row (decode) kernels of the hot types, per instruction set (gemv_*.c), and their row-group
 * dispatch (each file defines COLS, MAX_ROWS and fn##_rows_impl). */
#ifndef LUCE_CPU_GEMV_H
#define LUCE_CPU_GEMV_H

#include "matmul.h"

void gemv_q4_k_avx512(const mm_job *j, int64_t n0, int64_t n1);
void gemv_q6_k_avx512(const mm_job *j, int64_t n0, int64_t n1);
void gemv_k32_avx512(const mm_job *j, int64_t n0, int64_t n1, int q5);
void gemv_k32_avx2(const mm_job *j, int64_t n0, int64_t n1, int q5);
void gemv_q4_k_avx2(const mm_job *j, int64_t n0, int64_t n1);
void gemv_q6_k_avx2(const mm_job *j, int64_t n0, int64_t n1);

/* Column tiles outside, row groups inside: a tile's weights are read from memory once and
 * stay in cache for every group of MAX_ROWS rows (so 5..8 rows do not read the matrix twice). */
#define GEMV_ROWS_DISPATCH(fn, isa)                                                     \
    void fn##_##isa(const mm_job *j, int64_t n0, int64_t n1) {                          \
        for (int64_t c0 = n0; c0 < n1; c0 += COLS) {                                    \
            const int64_t c1 = n1 - c0 < COLS ? n1 : c0 + COLS;                         \
            for (int64_t t0 = 0; t0 < j->T; t0 += MAX_ROWS) {                           \
                switch (j->T - t0 >= MAX_ROWS ? MAX_ROWS : (int)(j->T - t0)) {         \
                case 1: fn##_rows_impl(j, c0, c1, t0, 1); break;                        \
                case 2: fn##_rows_impl(j, c0, c1, t0, 2); break;                        \
                case 3: fn##_rows_impl(j, c0, c1, t0, 3); break;                        \
                default: fn##_rows_impl(j, c0, c1, t0, 4); break;                       \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    }

#endif
