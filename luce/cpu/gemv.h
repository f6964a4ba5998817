/* One-row (decode) kernels of the hot types, per instruction set (gemv_*.c). */
#ifndef LUCE_CPU_GEMV_H
#define LUCE_CPU_GEMV_H

#include "matmul.h"

void gemv_q4_k_avx512(const mm_job *j, int64_t n0, int64_t n1);
void gemv_q6_k_avx512(const mm_job *j, int64_t n0, int64_t n1);
void gemv_k32_avx512(const mm_job *j, int64_t n0, int64_t n1, int q5);
void gemv_k32_avx2(const mm_job *j, int64_t n0, int64_t n1, int q5);
void gemv_q4_k_avx2(const mm_job *j, int64_t n0, int64_t n1);
void gemv_q6_k_avx2(const mm_job *j, int64_t n0, int64_t n1);

#endif
