/* Weight blocks unpacked for the SIMD tiles (dot_avx2.c, dot_avx512.c): the integers of
 * decode.h in the form maddubs (unsigned x signed bytes) takes.
 *
 * A 256-value block (K-quants, IQ4_XS) becomes 16 groups of 16 values:
 *   w[256]   unsigned values u (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 = q + 32), or for the signed
 *            types (IQ4_XS table values, Q8_0) the signed values themselves (sign trick)
 *   sc[16]   int16 scale of each group (a 32-value sub-block's scale twice)
 *   a[16]    int16 weights of the activation group sums bs[g]: the mins (Q4_K, Q5_K), or the
 *            offset 32 * sc[g] to take back out (Q6_K); 0 for the signed types
 * so that, with raw = sum_g sc[g] * sum_{i in g} w_i qx_i and s1 = sum_g a[g] * bs[g]:
 *   Q4_K/Q5_K: isum = raw, imin = s1        Q6_K: isum = raw - s1        IQ4_XS: isum = raw
 * which are exactly decode.h's integers. Q8_0 / Q5_0 (32-value blocks) unpack to w[32]
 * (Q5_0: u = q + 16, a = 16 for its two groups).
 */
#ifndef LUCE_CPU_UNPACK_H
#define LUCE_CPU_UNPACK_H

#include "blocks.h"

typedef struct {
    uint8_t w[QK_K] __attribute__((aligned(64)));
    int16_t sc[16] __attribute__((aligned(32)));
    int16_t a[16] __attribute__((aligned(32)));
    float d, dmin;
} unpacked_block;

/* the 8 six-bit scales and 8 mins of a Q4_K/Q5_K block as bytes sc[0..7], m[0..7] (ggml's
 * utmp unpacking; equal to k4_scale_min for every j) */
static inline void k4_scales_mins(const uint8_t *scales, uint8_t sc[8], uint8_t m[8]) {
    uint32_t u[4];
    memcpy(u, scales, 12);
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t aux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = aux;
    u[0] &= kmask1;
    memcpy(sc, u, 8);
    memcpy(m, u + 2, 8);
}

#ifdef __AVX2__
#include <immintrin.h>
/* bytes v[0..7] -> int16 [v0 v0 v1 v1 ... v7 v7] */
static inline void store_doubled(const uint8_t v[8], int16_t *out) {
    uint64_t bits;
    memcpy(&bits, v, 8);
    __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)bits));
    _mm256_store_si256((__m256i *)out, _mm256_set_m128i(_mm_unpackhi_epi16(w, w), _mm_unpacklo_epi16(w, w)));
}
#else
static inline void store_doubled(const uint8_t v[8], int16_t *out) {
    for (int j = 0; j < 8; j++) out[2 * j] = out[2 * j + 1] = v[j];
}
#endif

static inline void unpack_k4_scales(const uint8_t *scales, unpacked_block *o) {
    uint8_t sc[8], m[8];
    k4_scales_mins(scales, sc, m);
    store_doubled(sc, o->sc);
    store_doubled(m, o->a);
}

static inline void unpack_q4_k(const uint8_t *b, unpacked_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = f16_to_f32(load_u16(b + 2));
    unpack_k4_scales(b + 4, o);
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->w[64 * c + l] = qs[32 * c + l] & 0xF;
            o->w[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
}

static inline void unpack_q5_k(const uint8_t *b, unpacked_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = f16_to_f32(load_u16(b + 2));
    const uint8_t *qh = b + 16, *qs = b + 48;
    unpack_k4_scales(b + 4, o);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->w[64 * c + l] = (uint8_t)((qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4));
            o->w[64 * c + 32 + l] = (uint8_t)((qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
        }
}

static inline void unpack_q6_k(const uint8_t *b, unpacked_block *o) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    o->d = f16_to_f32(load_u16(b + 208));
    o->dmin = 0.0f;
    for (int g = 0; g < 16; g++) {
        o->sc[g] = sc[g];
        o->a[g] = (int16_t)(32 * sc[g]);
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *l8 = ql + 64 * h, *h8 = qh + 32 * h;
        uint8_t *w = o->w + 128 * h;
        for (int l = 0; l < 32; l++) {
            w[l] = (uint8_t)((l8[l] & 0xF) | ((h8[l] & 3) << 4));
            w[l + 32] = (uint8_t)((l8[l + 32] & 0xF) | (((h8[l] >> 2) & 3) << 4));
            w[l + 64] = (uint8_t)((l8[l] >> 4) | (((h8[l] >> 4) & 3) << 4));
            w[l + 96] = (uint8_t)((l8[l + 32] >> 4) | (((h8[l] >> 6) & 3) << 4));
        }
    }
}

static inline void unpack_iq4_xs(const uint8_t *b, unpacked_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = 0.0f;
    const uint8_t *qs = b + 8;
    for (int ib = 0; ib < 8; ib++) {
        int s = iq4xs_scale(b, ib);
        o->sc[2 * ib] = o->sc[2 * ib + 1] = (int16_t)s;
        o->a[2 * ib] = o->a[2 * ib + 1] = 0;
        for (int j = 0; j < 16; j++) {
            o->w[32 * ib + j] = (uint8_t)KVALUES_IQ4NL[qs[16 * ib + j] & 0xF];
            o->w[32 * ib + 16 + j] = (uint8_t)KVALUES_IQ4NL[qs[16 * ib + j] >> 4];
        }
    }
}

#endif
