// One row of the gated RMSNorm, shared by cuda/gated_rmsnorm.cu and the fused GDN decode
// (cuda/gdn_decode.cu) so both give the same bits (reference: luce/ref/gated_rmsnorm.py):
//   out = x * rsqrt(mean(x^2) + eps) * weight * silu(z)
// x, z, out, weight [cols] f32. A whole warp calls it; each lane owns whole chunks of 4
// (common.cuh), so the reduction's order depends only on cols. out may alias x or z: each
// lane rewrites only the chunks it read. A lane's first chunk of x, z and weight comes in one
// round of loads and stays in registers (up to 128 columns the whole row: the epilogues norm
// rows one after another, each row's latency counts).
#pragma once

#include "common.cuh"

__device__ __forceinline__ void gated_rmsnorm_row(const float *x, const float *z, const float *weight,
                                                  float *out, int64_t cols, float eps) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t chunks = (cols + 3) / 4;
    auto gate = [&](float v[4], const float g[4], const float w[4], float scale, int64_t j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] * scale * w[i] * silu_f32(g[i]);
        store_chunk4(out, j, cols, v);
    };
    // The lane's first chunk of x, z and weight in one round of loads, kept for the second pass.
    const bool first = lane < chunks;
    float v0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, g0[4], w0[4];
    if (first) {
        load_chunk4(x, lane, cols, v0);
        load_chunk4(z, lane, cols, g0);
        load_chunk4(weight, lane, cols, w0);
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) ss = first ? fmaf(v0[i], v0[i], ss) : ss;
    for (int64_t j = lane + WARP_SIZE; j < chunks; j += WARP_SIZE) {
        float v[4];
        load_chunk4(x, j, cols, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) ss = fmaf(v[i], v[i], ss);
    }
    const float scale = rsqrtf(warp_sum(ss) / (float)cols + eps);
    if (first) gate(v0, g0, w0, scale, lane);
    for (int64_t j = lane + WARP_SIZE; j < chunks; j += WARP_SIZE) {
        float v[4], g[4], w[4];
        load_chunk4(x, j, cols, v);
        load_chunk4(z, j, cols, g);
        load_chunk4(weight, j, cols, w);
        gate(v, g, w, scale, j);
    }
}
