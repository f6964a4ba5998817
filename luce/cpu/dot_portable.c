/* Portable matmul tiles: plain C, the definition every SIMD path must equal bitwise, and the
 * path of CPUs without AVX2 (aarch64 included). One output at a time, in the canonical order
 * of blocks.h. */
#include <stdlib.h>

#include "decode.h"

static float weight_value(int kind, const uint8_t *row, int64_t k) {
    switch (kind) {
    case MM_F32: { float v; memcpy(&v, row + 4 * k, 4); return v; }
    case MM_F16: return f16_to_f32(load_u16(row + 2 * k));
    default: return bf16_to_f32(load_u16(row + 2 * k));
    }
}

static void tile_float(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = j->w + n * j->row_bytes;
        for (int64_t t = 0; t < j->T; t++) {
            const float *x = j->x + t * j->K;
            float lanes[FLOAT_LANES] = {0};
            for (int64_t k0 = 0; k0 < j->K; k0 += FLOAT_LANES)
                for (int l = 0; l < FLOAT_LANES; l++) {
                    int64_t k = k0 + l;
                    float xv = k < j->K ? x[k] : 0.0f, wv = k < j->K ? weight_value(kind, row, k) : 0.0f;
                    lanes[l] = fmaf(xv, wv, lanes[l]);
                }
            store_out(j, t, n, lanes16_reduce(lanes));
        }
    }
}

static void tile_blocks(const mm_job *j, int64_t n0, int64_t n1, int kind) {
    const int bv = mm_block_values(kind), bb = mm_block_bytes(kind);
    const int64_t nb = j->K / bv, T = j->T;
    float *acc = malloc((size_t)T * sizeof(float));
    decoded_block blk;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = j->w + n * j->row_bytes;
        for (int64_t t = 0; t < T; t++) acc[t] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            decode_block(kind, row + b * bb, &blk);
            for (int64_t t = 0; t < T; t++) {
                const int8_t *qx = j->qs + t * j->K + b * bv;
                const int16_t *bs = j->bsums + t * (j->K / 16) + b * (bv / 16);
                int32_t isum = 0, imin = 0;
                for (int s = 0; s < blk.nsub; s++) {
                    int32_t dot = 0;
                    for (int i = 0; i < blk.sub; i++) dot += blk.q[s * blk.sub + i] * qx[s * blk.sub + i];
                    isum += blk.sc[s] * dot;
                }
                float dx = j->dx[t * nb + b];
                if (blk.has_min) {
                    for (int s = 0; s < blk.nsub; s++) imin += blk.m[s] * (bs[2 * s] + bs[2 * s + 1]);
                    acc[t] = combine_block_min(acc[t], dx, blk.d, blk.dmin, isum, imin);
                } else {
                    acc[t] = combine_block(acc[t], dx, blk.d, isum);
                }
            }
        }
        for (int64_t t = 0; t < T; t++) store_out(j, t, n, acc[t]);
    }
    free(acc);
}

#define FLOAT_TILE(name, kind) \
    static void name(const mm_job *j, int64_t n0, int64_t n1) { tile_float(j, n0, n1, kind); }
#define BLOCK_TILE(name, kind) \
    static void name(const mm_job *j, int64_t n0, int64_t n1) { tile_blocks(j, n0, n1, kind); }

FLOAT_TILE(tile_f32, MM_F32)
FLOAT_TILE(tile_f16, MM_F16)
FLOAT_TILE(tile_bf16, MM_BF16)
BLOCK_TILE(tile_q8_0, MM_Q8_0)
BLOCK_TILE(tile_q5_0, MM_Q5_0)
BLOCK_TILE(tile_q4_k, MM_Q4_K)
BLOCK_TILE(tile_q5_k, MM_Q5_K)
BLOCK_TILE(tile_q6_k, MM_Q6_K)
BLOCK_TILE(tile_iq4_xs, MM_IQ4_XS)

const mm_tile_fn mm_tiles_portable[MM_KINDS] = {
    tile_f32, tile_f16, tile_bf16, tile_q8_0, tile_q5_0, tile_q4_k, tile_q5_k, tile_q6_k, tile_iq4_xs,
};
