/* GGUF weight blocks as the cpu backend reads them, and the canonical arithmetic every
 * instruction-set path of the quantized matmul shares (packed.h: the AVX-512 packed layout).
 *
 * A block of a weight row decodes to integers q (per-value), integer sub-block scales sc
 * (and mins m for Q4_K/Q5_K) and float block scales d (and dmin). Against an activation
 * block quantized to int8 (x = dx * qx) the exact integer sums are
 *     isum = sum_j sc_j * sum_{i in sub-block j} q_i * qx_i      (int32, exact)
 *     imin = sum_j m_j  * sum_{i in sub-block j} qx_i            (Q4_K, Q5_K only)
 * and the output accumulates over blocks in order, in f32:
 *     acc = fmaf(dx * d, (float) isum, acc);   acc = fmaf(-(dx * dmin), (float) imin, acc);
 * Integer sums do not depend on how SIMD lanes group the products, so every path (portable,
 * AVX2, AVX-512) gives bitwise the same y, whatever the row count, tile or thread.
 */
#ifndef LUCE_CPU_BLOCKS_H
#define LUCE_CPU_BLOCKS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ggml type ids (gguf GGMLQuantizationType) */
enum {
    QT_F32 = 0, QT_F16 = 1, QT_Q5_0 = 6, QT_Q8_0 = 8, QT_Q4_K = 12, QT_Q5_K = 13,
    QT_Q6_K = 14, QT_IQ4_XS = 23, QT_BF16 = 30,
};

#define QK_K 256
#define QK_32 32

/* bytes per block of each weight type */
#define BYTES_Q4_K 144   /* f16 d, f16 dmin, scales[12], qs[128] */
#define BYTES_Q5_K 176   /* f16 d, f16 dmin, scales[12], qh[32], qs[128] */
#define BYTES_Q6_K 210   /* ql[128], qh[64], int8 scales[16], f16 d */
#define BYTES_IQ4_XS 136 /* f16 d, u16 scales_h, scales_l[4], qs[128] */
#define BYTES_Q8_0 34    /* f16 d, int8 qs[32] */
#define BYTES_Q5_0 22    /* f16 d, qh[4], qs[16] */

static const int8_t KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1, 13, 25, 38, 53, 69, 89, 113};

/* IEEE half -> float, exact (subnormals, inf and NaN included). */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {                       /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t load_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t load_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* Q4_K / Q5_K 6-bit packed scale and min of sub-block j (ggml get_scale_min_k4). */
static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* IQ4_XS signed 6-bit scale of sub-block ib (ls - 32). */
static inline int iq4xs_scale(const uint8_t *blk, int ib) {
    uint16_t scales_h = load_u16(blk + 2);
    const uint8_t *scales_l = blk + 4;
    int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
    return ls - 32;
}

/* The float combine of one block (canonical: every path calls exactly this). */
static inline float combine_block(float acc, float dx, float d, int32_t isum) {
    return fmaf(dx * d, (float)isum, acc);
}

static inline float combine_block_min(float acc, float dx, float d, float dmin, int32_t isum, int32_t imin) {
    acc = fmaf(dx * d, (float)isum, acc);
    return fmaf(-(dx * dmin), (float)imin, acc);
}

/* Canonical f32 dot of float weights: 16 lanes, lane l sums k = 16 i + l with fmaf in order
 * (the row zero-padded to a multiple of 16), then lanes combine in a fixed tree. */
#define FLOAT_LANES 16

static inline float lanes16_reduce(float *l) {
    for (int h = FLOAT_LANES / 2; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) l[i] = l[i] + l[i + h];
    return l[0];
}

#endif
