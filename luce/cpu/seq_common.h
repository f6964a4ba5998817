/* Shared pieces of the cpu sequence kernels (attention.c, norms.c, rotary.c, pointwise.c,
 * gdn.c, gdn_tree.c): the instruction-set clone macro, the canonical f32 dot, a vectorizable
 * double exp, per-thread scratch and the batch CSR checks (seq_common.c).
 *
 * Bitwise rules these helpers keep: no reassociation (no -ffast-math, -ffp-contract=off),
 * fused multiply-adds only where written as fmaf()/fma() (correctly rounded on every path),
 * so every clone of a LUCE_CLONES function gives the same bits; a reduction's order depends
 * on its own length only.
 */
#ifndef LUCE_CPU_SEQ_COMMON_H
#define LUCE_CPU_SEQ_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "cpu_sequence_ops.h"

/* Hot functions are compiled for AVX-512, AVX2+FMA (x86-64-v4 / v3) and the baseline, the
 * best picked at load time (GCC on x86-64 Linux). Elsewhere, or with LUCE_NO_CLONES (the test
 * that builds each instruction set on its own, tests/kernels/test_cpu_sequence_isa.py), one
 * build for the compiler's target. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && \
    !defined(LUCE_NO_CLONES)
#define LUCE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LUCE_CLONES
#endif

/* lanes16_reduce's fixed tree (blocks.h), unrolled: the same adds on the same operands. */
static inline float seq_reduce16(const float *a) {
    float b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* Canonical f32 dot of n values (the order blocks.h fixes for float weights): lane l takes
 * indices 16 i + l in order with fmaf, missing tail lanes add nothing, lanes combine in
 * lanes16_reduce's fixed tree (seq_reduce16). */
static inline float seq_dot(const float *a, const float *b, int64_t n) {
    float acc[FLOAT_LANES];
    for (int l = 0; l < FLOAT_LANES; l++) acc[l] = 0.0f;
    int64_t full = n - n % FLOAT_LANES;
    for (int64_t i = 0; i < full; i += FLOAT_LANES)
        for (int l = 0; l < FLOAT_LANES; l++) acc[l] = fmaf(a[i + l], b[i + l], acc[l]);
    for (int64_t i = full; i < n; i++) acc[i - full] = fmaf(a[i], b[i], acc[i - full]);
    return seq_reduce16(acc);
}

/* Sum of x^2 over n f32 values in double (each square exact), the same lane layout. */
static inline double seq_sumsq(const float *x, int64_t n) {
    double acc[FLOAT_LANES];
    for (int l = 0; l < FLOAT_LANES; l++) acc[l] = 0.0;
    int64_t full = n - n % FLOAT_LANES;
    for (int64_t i = 0; i < full; i += FLOAT_LANES)
        for (int l = 0; l < FLOAT_LANES; l++) {
            double v = (double)x[i + l];
            acc[l] = acc[l] + v * v;
        }
    for (int64_t i = full; i < n; i++) {
        double v = (double)x[i];
        acc[i - full] = acc[i - full] + v * v;
    }
    for (int h = FLOAT_LANES / 2; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) acc[i] = acc[i] + acc[i + h];
    return acc[0];
}

static inline uint64_t seq_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static inline double seq_double(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* exp(x) in double, branch-free (vectorizes), relative error < 1e-15 on [-708, 709]: enough
 * that a result rounded to f32 is the correctly rounded one but for near-ties. Cody-Waite
 * reduction x = k ln2 + r (|r| <= ln2 / 2, k by the 1.5 * 2^52 shift), Taylor of degree 11 in
 * Horner form, 2^k built in the exponent bits. x < -708 gives 0 (far below f32 range), x > 709
 * gives +inf, NaN stays NaN. The special cases are integer bit masks, not branches or float
 * selects (which GCC will not if-convert under -ftrapping-math). Plain arithmetic only: the
 * same bits on every path. */
static inline double seq_exp(double x) {
    const double log2e = 1.4426950408889634, shift = 6755399441055744.0;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    uint64_t lo = -(uint64_t)(x < -708.0), hi = -(uint64_t)(x > 709.0), nan = -(uint64_t)(x != x);
    uint64_t special = lo | hi | nan;
    double xc = seq_double((seq_bits(x) & ~special) | (seq_bits(-708.0) & lo) | (seq_bits(709.0) & hi));
    double t = xc * log2e + shift;
    double kd = t - shift;
    double r = (xc - kd * ln2_hi) - kd * ln2_lo;
    double p = 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    double y = p * seq_double((seq_bits(t) - seq_bits(shift) + 1023u) << 52);   /* p 2^k */
    return seq_double((seq_bits(y) & ~special) | (seq_bits((double)INFINITY) & hi) | (seq_bits(x) & nan));
}

/* silu(x) = x / (1 + exp(-x)) in double */
static inline double seq_silu(double x) { return x / (1.0 + seq_exp(-x)); }

/* ---- seq_common.c ---------------------------------------------------------------------- */

/* Per-thread scratch buffer `which` (0..SEQ_SCRATCH_BUFFERS-1) of at least `bytes`, 64-byte
 * aligned, grown on demand and kept for the thread's life (no allocation in steady state).
 * NULL when out of memory. */
#define SEQ_SCRATCH_BUFFERS 3
void *seq_scratch(int which, size_t bytes);

/* Check the row CSR (qo_indptr from 0 to T, non-decreasing); with `kv`, also each live
 * segment's pages (in range, last page length 1..page_size, rows <= kv_len) and its tree
 * rows (root first, every other row's parent an earlier row of the segment). is_tree [S]
 * (or NULL) gets 1 for tree segments. Returns 0 or LUCE_CPU_EBATCH / LUCE_CPU_ETREE. */
int seq_check_batch(const luce_cpu_batch *b, int kv, uint8_t *is_tree);

/* KV rows of live segment s */
static inline int64_t seq_kv_len(const luce_cpu_batch *b, int64_t s) {
    int64_t n_pages = b->kv_indptr[s + 1] - b->kv_indptr[s];
    return n_pages == 0 ? 0 : (n_pages - 1) * b->page_size + b->kv_last_page_len[s];
}

/* Segment owning row `row` (rows of empty segments belong to the next non-empty one). */
static inline int64_t seq_segment_of_row(const luce_cpu_batch *b, int64_t row) {
    int64_t lo = 0, hi = b->n_segments - 1;
    while (lo < hi) {   /* first s with qo_indptr[s + 1] > row */
        int64_t mid = (lo + hi) / 2;
        if (b->qo_indptr[mid + 1] > row) hi = mid; else lo = mid + 1;
    }
    return lo;
}

#endif
