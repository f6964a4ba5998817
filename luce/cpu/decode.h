/* One weight block decoded to the canonical integers of blocks.h (the portable path's view,
 * and the definition the SIMD paths are tested against bitwise).
 *
 *   q[i]   per-value integer, in value order      sc[j]  integer scale of sub-block j
 *   m[j]   integer min of sub-block j (Q4_K, Q5_K) d, dmin  float block scales
 */
#ifndef LUCE_CPU_DECODE_H
#define LUCE_CPU_DECODE_H

#include "matmul.h"

typedef struct {
    int8_t q[QK_K];
    int16_t sc[16];
    int16_t m[8];
    float d, dmin;
    int sub;        /* values per sub-block (16 or 32) */
    int nsub;       /* sub-blocks per block */
    int has_min;
} decoded_block;

static inline void decode_q4_k(const uint8_t *b, decoded_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = f16_to_f32(load_u16(b + 2));
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        k4_scale_min(j, scales, &sc, &m);
        o->sc[j] = (int16_t)sc;
        o->m[j] = (int16_t)m;
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->q[64 * c + l] = (int8_t)(qs[32 * c + l] & 0xF);
            o->q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
    o->sub = 32, o->nsub = 8, o->has_min = 1;
}

static inline void decode_q5_k(const uint8_t *b, decoded_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = f16_to_f32(load_u16(b + 2));
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        k4_scale_min(j, scales, &sc, &m);
        o->sc[j] = (int16_t)sc;
        o->m[j] = (int16_t)m;
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            o->q[64 * c + l] = (int8_t)lo;
            o->q[64 * c + 32 + l] = (int8_t)hi;
        }
    o->sub = 32, o->nsub = 8, o->has_min = 1;
}

static inline void decode_q6_k(const uint8_t *b, decoded_block *o) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    o->d = f16_to_f32(load_u16(b + 208));
    o->dmin = 0.0f;
    for (int j = 0; j < 16; j++) o->sc[j] = sc[j];
    for (int h = 0; h < 2; h++) {
        const uint8_t *l8 = ql + 64 * h, *h8 = qh + 32 * h;
        int8_t *q = o->q + 128 * h;
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((l8[l] & 0xF) | (((h8[l] >> 0) & 3) << 4)) - 32);
            q[l + 32] = (int8_t)(((l8[l + 32] & 0xF) | (((h8[l] >> 2) & 3) << 4)) - 32);
            q[l + 64] = (int8_t)(((l8[l] >> 4) | (((h8[l] >> 4) & 3) << 4)) - 32);
            q[l + 96] = (int8_t)(((l8[l + 32] >> 4) | (((h8[l] >> 6) & 3) << 4)) - 32);
        }
    }
    o->sub = 16, o->nsub = 16, o->has_min = 0;
}

static inline void decode_iq4_xs(const uint8_t *b, decoded_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = 0.0f;
    const uint8_t *qs = b + 8;
    for (int ib = 0; ib < 8; ib++) {
        o->sc[ib] = (int16_t)iq4xs_scale(b, ib);
        for (int j = 0; j < 16; j++) {
            o->q[32 * ib + j] = KVALUES_IQ4NL[qs[16 * ib + j] & 0xF];
            o->q[32 * ib + 16 + j] = KVALUES_IQ4NL[qs[16 * ib + j] >> 4];
        }
    }
    o->sub = 32, o->nsub = 8, o->has_min = 0;
}

static inline void decode_q8_0(const uint8_t *b, decoded_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = 0.0f;
    memcpy(o->q, b + 2, 32);
    o->sc[0] = 1;
    o->sub = 32, o->nsub = 1, o->has_min = 0;
}

static inline void decode_q5_0(const uint8_t *b, decoded_block *o) {
    o->d = f16_to_f32(load_u16(b));
    o->dmin = 0.0f;
    uint32_t qh = load_u32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
        int x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        o->q[j] = (int8_t)(x0 - 16);
        o->q[j + 16] = (int8_t)(x1 - 16);
    }
    o->sc[0] = 1;
    o->sub = 32, o->nsub = 1, o->has_min = 0;
}

static inline void decode_block(int kind, const uint8_t *b, decoded_block *o) {
    switch (kind) {
    case MM_Q4_K: decode_q4_k(b, o); break;
    case MM_Q5_K: decode_q5_k(b, o); break;
    case MM_Q6_K: decode_q6_k(b, o); break;
    case MM_IQ4_XS: decode_iq4_xs(b, o); break;
    case MM_Q8_0: decode_q8_0(b, o); break;
    default: decode_q5_0(b, o); break;
    }
}

/* y = acc (+ bias): the one place an output is written */
static inline void store_out(const mm_job *j, int64_t t, int64_t n, float acc) {
    j->y[t * j->ldy + n] = j->bias ? acc + j->bias[n] : acc;
}

#endif
