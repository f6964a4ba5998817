// Rotary pieces shared by cuda/rotary.cu and the fused q/k norm + rotary + KV write of
// cuda/rope_kv.cu, so both rotate bitwise alike (reference: luce/ref/rotary.py rope).
#pragma once

#include "common.cuh"

namespace rope {

// Which of the 4 positions (t, h, w, e) pair i takes under IMROPE (ggml's mrope rule).
__device__ __forceinline__ int imrope_section(int pair, const int32_t *sections, int total) {
    const int sector = pair % total;
    if (sector % 3 == 1 && sector < 3 * sections[1]) return 1;
    if (sector % 3 == 2 && sector < 3 * sections[2]) return 2;
    if (sector % 3 == 0 && sector < 3 * sections[0]) return 0;
    return 3;
}

// Row `row`'s cos [half] then sin [half] into table (shared memory), computed in double by
// threads t, t + width, ...; the caller syncs before reading it.
__device__ __forceinline__ void fill_table(float *table, const int32_t *positions, int64_t row, int n_pos,
                                           const int32_t *sections, int rope_dim, float theta, int t, int width) {
    const int half = rope_dim / 2;
    const int total = sections[0] + sections[1] + sections[2] + sections[3];
    for (int i = t; i < half; i += width) {
        int section = 0;
        if (total > 0 && n_pos == 4) section = imrope_section(i, sections, total);
        const double pos = (double)positions[row * n_pos + section];
        const double inv_freq = pow((double)theta, -2.0 * (double)i / (double)rope_dim);
        double s, c;
        sincos(pos * inv_freq, &s, &c);
        table[i] = (float)c;
        table[half + i] = (float)s;
    }
}

// Pair (x0, x1) rotated by (c, s), each product rounded (no contraction into an fma: the
// same bits wherever it is inlined).
__device__ __forceinline__ void rotate(float x0, float x1, float c, float s, float *o0, float *o1) {
    *o0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *o1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

}  // namespace rope
