// One head of a step's attention input, by one warp (reference: luce/ref/rope_kv.py): the
// per-head RMSNorm (rmsnorm.cuh's warp path, luce_rmsnorm's for head_dim <= 1024) and rotary
// (rotary.cuh: the table and the rotation of luce_rotary) of a q or k head, and the KV write
// of a k or v head. Shared by cuda/rope_kv.cu and the fused decode attention input of
// cuda/attention.cu (attention_rope_input.cuh), so both give every q', k' and KV byte alike.
#pragma once

#include "rmsnorm.cuh"
#include "rotary.cuh"

namespace rope {

// One head of head_dim values: normed (norm != nullptr) from src into dst, then rotated in
// dst; without a norm rotated from src into dst. By one warp. scratch (head_dim floats of the
// warp's own, or nullptr): the normed values go there instead and dst is written once, with
// its final values. The fused decode attention needs it: the head groups of one KV head (other
// blocks) all write its new key at once, and a writer that read another's normed-but-not-yet-
// rotated values from dst would rotate them twice.
__device__ __forceinline__ void head_norm_rope(const float *src, float *dst, const float *norm, float eps,
                                               const float *table, int head_dim, int rope_dim, int lane,
                                               float *scratch = nullptr) {
    const int half = rope_dim / 2;
    if (norm) {
        float *normed = scratch ? scratch : dst;
        const rms::Row r{src, norm, normed, head_dim, eps};
        rms::norm_row<true>(r, 0, lane, WARP_SIZE, [](float v) { return warp_sum(v); });
        __syncwarp();
        src = normed;
    }
    for (int i = lane; i < half; i += WARP_SIZE) {
        const float x0 = src[i], x1 = src[i + half];
        rotate(x0, x1, table[i], table[half + i], &dst[i], &dst[i + half]);
    }
    if (src != dst)   // the dims past rope_dim, unless the norm left them in dst
        for (int d = rope_dim + lane; d < head_dim; d += WARP_SIZE) dst[d] = src[d];
}

// KV head j of row `row` (j < heads_kv: key head j, normed and rotated; else value head
// j - heads_kv, copied) into KV row dst (>= 0) of the pages. By one warp; table: the row's;
// scratch: head_norm_rope's (where other blocks write the same KV row at once).
__device__ __forceinline__ void kv_head_write(const luce_rope_kv_params &p, int64_t row, int64_t dst, int j,
                                              const float *table, int lane, float *scratch = nullptr) {
    const int D = p.head_dim;
    if (j < p.heads_kv) {
        head_norm_rope(p.k + row * p.k_stride + (int64_t)j * D, p.k_pages + (dst * p.heads_kv + j) * D, p.k_norm,
                       p.eps, table, D, p.rope_dim, lane, scratch);
    } else {
        const int hv = j - p.heads_kv;
        const float *src = p.v + row * p.v_stride + (int64_t)hv * D;
        float *out = p.v_pages + (dst * p.heads_kv + hv) * D;
        for (int d = lane; d < D; d += WARP_SIZE) out[d] = src[d];
    }
}

// The checks of luce_rope_kv's params but q_out (host).
inline bool params_valid(const luce_rope_kv_params &p) {
    const bool sectioned = p.sections[0] || p.sections[1] || p.sections[2] || p.sections[3];
    return !(p.rows < 0 || p.rows > 0x7fffffff || p.q_head_stride < 0 || p.heads_q <= 0 || p.heads_kv <= 0 ||
             p.head_dim <= 0 || p.head_dim > rms::kWarpRowMaxCols || p.rope_dim <= 0 || p.rope_dim % 2 ||
             p.rope_dim > p.head_dim ||
             p.sections[0] < 0 || p.sections[1] < 0 || p.sections[2] < 0 || p.sections[3] < 0 ||
             !(p.n_pos == 1 || (p.n_pos == 4 && sectioned)) || !(p.theta > 0.0f) || !p.q || !p.k || !p.v ||
             !p.k_pages || !p.v_pages || !p.kv_dst || !p.positions);
}

}  // namespace rope
