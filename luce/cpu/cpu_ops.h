/* The C ABI of the cpu backend's kernels (luce/_cpu.pyx launches them; luce/ops/cpu_backend.py
 * is the backend). Every entry returns 0, or a negative LUCE_CPU_E* code on bad arguments.
 *
 * Batch invariance by construction (DESIGN 5 rule 7): each output's reduction order is fixed
 * by its own sizes (K, its KV length) alone; threads split outputs, never a reduction; every
 * instruction-set path gives bitwise the same results as the portable one.
 */
#ifndef LUCE_CPU_OPS_H
#define LUCE_CPU_OPS_H

#include <stdint.h>

#define LUCE_CPU_OK 0
#define LUCE_CPU_EARG -1      /* a size or type the kernel does not take */
#define LUCE_CPU_ENOMEM -2

/* instruction-set paths */
enum { LUCE_ISA_PORTABLE = 0, LUCE_ISA_AVX2 = 1, LUCE_ISA_AVX512 = 2 };

int luce_cpu_isa_supported(int isa);   /* 1 if this CPU (and build) runs path `isa` */
int luce_cpu_set_isa(int isa);         /* select a supported path; returns the one selected */
int luce_cpu_get_isa(void);
void luce_cpu_set_threads(int n);      /* threads of every parallel kernel (>= 1) */
int luce_cpu_get_threads(void);

/* One weight of a matmul: W [n, k] in blocks of ggml type `qtype`, row r at w + r * row_bytes
 * (and, or NULL, the same weight packed: luce_cpu_pack); writes y [T, n] (= x W^T + bias). */
typedef struct {
    const uint8_t *w;
    const uint8_t *packed;
    int32_t qtype;
    int64_t n;
    int64_t row_bytes;
    const float *bias;    /* [n] or NULL */
    float *y;             /* [T, n] */
} luce_cpu_matmul_out;

/* x [T, k] f32 times every weight of outs (all with the same k), sharing the activation
 * quantization; one parallel region over all weights' output columns. */
int luce_cpu_matmuls(const float *x, int64_t T, int64_t k, const luce_cpu_matmul_out *outs, int n_outs);

/* Packed weights (luce/cpu/packed.h): the column-interleaved copy the AVX-512 path multiplies
 * (Q4_K, Q6_K, Q5_0, Q8_0 with n % 16 == 0; -1 / LUCE_CPU_EARG otherwise). */
int64_t luce_cpu_packed_bytes(int32_t qtype, int64_t n, int64_t k);
int luce_cpu_pack(const uint8_t *w, int32_t qtype, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out);

/* bytes of one row of k values of `qtype` (-1 if the type is not supported or k not whole blocks) */
int64_t luce_cpu_row_bytes(int32_t qtype, int64_t k);

/* rows[i] of W [., k] (qtype, row_bytes) decoded to f32 out [n, k] as ggml decodes them */
int luce_cpu_dequantize_rows(const uint8_t *w, int32_t qtype, int64_t row_bytes, int64_t k, const int64_t *rows,
                             int64_t n, float *out);

/* stream n_bytes of buf once on every thread (the memory roof of the benchmarks); returns a
 * checksum so the reads cannot be dropped */
uint64_t luce_cpu_read_probe(const uint8_t *buf, int64_t n_bytes);

#endif
