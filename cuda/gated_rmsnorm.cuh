// One row of the gated RMSNorm, shared by cuda/gated_rmsnorm.cu and the fused GDN decode
// (cuda/gdn_decode.cu) so both give the same bits (reference: luce/ref/gated_rmsnorm.py):
//   out = x * rsqrt(mean(x^2) + eps) * weight * silu(z)
// x, z, out, weight [cols] f32. A whole warp calls it; each lane owns whole chunks of 4
// (common.cuh), so the reduction's order depends only on cols. out may alias x or z: each
// lane rewrites only the chunks it read. Up to 128 columns a lane holds its one chunk of x, z
// and weight from a single round of loads (the epilogues norm rows one after another: each
// row's latency counts); the same arithmetic as the two passes past that.
#pragma once

#include "common.cuh"

__device__ __forceinline__ void gated_rmsnorm_row(const float *x, const float *z, const float *weight,
                                                  float *out, int64_t cols, float eps) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t chunks = (cols + 3) / 4;
    if (chunks <= WARP_SIZE) {   // a chunk a lane at most (Dv <= 128): x, z and weight in one round trip
        const bool mine = lane < chunks;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f}, g[4], w[4];
        if (mine) {
            load_chunk4(x, lane, cols, v);
            load_chunk4(z, lane, cols, g);
            load_chunk4(weight, lane, cols, w);
        }
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) ss = mine ? fmaf(v[i], v[i], ss) : ss;
        const float scale = rsqrtf(warp_sum(ss) / (float)cols + eps);
        if (mine) {
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = v[i] * scale * w[i] * silu_f32(g[i]);
            store_chunk4(out, lane, cols, v);
        }
        return;
    }
    float ss = 0.0f;
    for (int64_t j = lane; j < chunks; j += WARP_SIZE) {
        float v[4];
        load_chunk4(x, j, cols, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) ss = fmaf(v[i], v[i], ss);
    }
    const float scale = rsqrtf(warp_sum(ss) / (float)cols + eps);
    for (int64_t j = lane; j < chunks; j += WARP_SIZE) {
        float v[4], g[4], w[4];
        load_chunk4(x, j, cols, v);
        load_chunk4(z, j, cols, g);
        load_chunk4(weight, j, cols, w);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] * scale * w[i] * silu_f32(g[i]);
        store_chunk4(out, j, cols, v);
    }
}
