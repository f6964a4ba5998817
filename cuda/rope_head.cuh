// One head of a step's attention input, by one warp (reference: luce/ref/rope_kv.py): the
// per-head RMSNorm (rmsnorm.cuh's warp path, luce_rmsnorm's for head_dim <= 1024) and rotary
// (rotary.cuh: the table and the rotation of luce_rotary) of a q or k head, and the KV write
// of a k or v head. Shared by cuda/rope_kv.cu and the fused decode attention input of
// cuda/attention.cu (attention_rope_input.cuh), so both give every q', k' and KV byte alike.
#pragma once

#include "rmsnorm.cuh"
#include "rotary.cuh"

namespace rope {

constexpr int kLaneBatch = 8;  // values (or pairs) a lane loads before it stores any

// out[0, n) = src[0, n) by one warp, kLaneBatch values a lane loaded before any is stored.
__device__ __forceinline__ void copy_lanes(const float *src, float *out, int n, int lane) {
    for (int d0 = lane; d0 < n; d0 += kLaneBatch * WARP_SIZE) {
        float v[kLaneBatch];
#pragma unroll
        for (int u = 0; u < kLaneBatch; ++u)
            if (d0 + u * WARP_SIZE < n) v[u] = src[d0 + u * WARP_SIZE];
#pragma unroll
        for (int u = 0; u < kLaneBatch; ++u)
            if (d0 + u * WARP_SIZE < n) out[d0 + u * WARP_SIZE] = v[u];
    }
}

// One head of head_dim values: normed (norm != nullptr) from src into dst, then rotated in
// dst; without a norm rotated from src into dst. By one warp. A lane loads kLaneBatch pairs
// before it stores any (dst may alias src for the compiler: a loop of load-then-store was one
// round trip a pair, 2 at head_dim 128 and 4 at 256 on the decode attention's path).
__device__ __forceinline__ void head_norm_rope(const float *src, float *dst, const float *norm, float eps,
                                               const float *table, int head_dim, int rope_dim, int lane) {
    const int half = rope_dim / 2;
    if (norm) {
        const rms::Row r{src, norm, dst, head_dim, eps};
        rms::norm_row<true>(r, 0, lane, WARP_SIZE, [](float v) { return warp_sum(v); });
        __syncwarp();
        src = dst;
    }
    for (int i0 = lane; i0 < half; i0 += kLaneBatch * WARP_SIZE) {
        float x0[kLaneBatch], x1[kLaneBatch];
#pragma unroll
        for (int u = 0; u < kLaneBatch; ++u) {
            const int i = i0 + u * WARP_SIZE;
            if (i < half) { x0[u] = src[i]; x1[u] = src[i + half]; }
        }
#pragma unroll
        for (int u = 0; u < kLaneBatch; ++u) {
            const int i = i0 + u * WARP_SIZE;
            if (i < half) rotate(x0[u], x1[u], table[i], table[half + i], &dst[i], &dst[i + half]);
        }
    }
    if (!norm) copy_lanes(src + rope_dim, dst + rope_dim, head_dim - rope_dim, lane);
}

// KV head j of row `row` (j < heads_kv: key head j, normed and rotated; else value head
// j - heads_kv, copied) into KV row dst (>= 0) of the pages. By one warp; table: the row's.
__device__ __forceinline__ void kv_head_write(const luce_rope_kv_params &p, int64_t row, int64_t dst, int j,
                                              const float *table, int lane) {
    const int D = p.head_dim;
    if (j < p.heads_kv) {
        head_norm_rope(p.k + row * p.k_stride + (int64_t)j * D, p.k_pages + (dst * p.heads_kv + j) * D, p.k_norm,
                       p.eps, table, D, p.rope_dim, lane);
    } else {
        const int hv = j - p.heads_kv;
        copy_lanes(p.v + row * p.v_stride + (int64_t)hv * D, p.v_pages + (dst * p.heads_kv + hv) * D, D, lane);
    }
}

// The checks of luce_rope_kv's params but q_out (host).
inline bool params_valid(const luce_rope_kv_params &p) {
    const bool sectioned = p.sections[0] || p.sections[1] || p.sections[2] || p.sections[3];
    return !(p.rows < 0 || p.rows > 0x7fffffff || p.heads_q <= 0 || p.heads_kv <= 0 || p.head_dim <= 0 ||
             p.head_dim > rms::kWarpRowMaxCols || p.rope_dim <= 0 || p.rope_dim % 2 || p.rope_dim > p.head_dim ||
             p.sections[0] < 0 || p.sections[1] < 0 || p.sections[2] < 0 || p.sections[3] < 0 ||
             !(p.n_pos == 1 || (p.n_pos == 4 && sectioned)) || !(p.theta > 0.0f) || !p.q || !p.k || !p.v ||
             !p.k_pages || !p.v_pages || !p.kv_dst || !p.positions);
}

}  // namespace rope
