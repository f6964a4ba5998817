// The one-row kernels' x quantized in lane: where a call's quantized x serves that call only
// (LUCE_MATMUL_X_ONCE, cuda/luce_ops_weights.h), the one-row kernel (matmul_gemv.cuh and its
// staged form, matmul_gemv_staged.cuh) reads its lanes' f32 values of x itself instead of the
// workspace that quantize_x_kernel (matmul_x.cuh) would have written: one launch fewer.
//
// Same bits (DESIGN 5 rule 6): a lane holds 4 units of 8 values (unit = quad q of a group:
// values 4q..4q+3 and 16+4q..16+4q+3, the 8 values one lane of quantize_x_values holds; a reader
// of its own layout names its units' values, G::x_unit, and quantizes them alike: rounding is per
// value) and the 8 lanes of a chunk (lane % 8, aligned) hold its 256 values once each (a lane past k or of a last
// partial chunk holds copies of a live group's units, which change no maximum). It forms what
// quantize_x_values stores with the same helpers:
//   amax = max |v| over the chunk (a max over lanes is exact in any order: shuffles over the 8),
//   bad = some |v| not <= 3e38 (inf, NaN) in the chunk, inv = x_quant_factor(amax, bad),
//   a unit's word of xq = x_unit_word(v, inv) (rintf(v * inv) clamped, high and low bytes),
//   xd = x_chunk_scale(amax, bad) (amax / kQMax, NaN if bad),
//   the group's integer sum (the byte planes' s_j, exact), and its float sums S0 = (p0 + p1) +
//   (p2 + p3) over its quads' x_unit_sum0, S1 likewise: the association quantize_x_values' xor
//   butterfly gives (its lane of quad 0 stores them); the Q5_0 chain takes S0 + S1.
// Weights still load before wait_for_prior_kernels (cuda/pdl.cuh), x only after it.
#pragma once

#include "matmul_gemv_c.cuh"

namespace mm {

// Max over the 8 lanes of the caller's aligned group of lanes (lane % 8); the whole warp calls.
__device__ __forceinline__ float lanes8_max(float v) {
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) v = fmaxf(v, warp_shfl_xor(v, m));
    return v;
}

// Lane j (= lane % 8) of chunk ch of token 0's f32 row x: quantizes its units and fills gx as
// the reader's load from the workspace would (kOwn: the reader's own layout, G::x_unit and
// G::set_x; else group j's 4 quads and, for the types with mins, its integer sum); xd the
// chunk's scale; xs the group's S0 + S1 (the default layout only). The whole warp calls.
template <class G, bool kOwn = G::kOwnLayout>
__device__ __forceinline__ void gemv_quantize_x(const float *x, int64_t ch, int j, GroupX &gx, float &xd, float &xs) {
    float v[4][8];
    float amax = 0.0f, bad = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int at = 32 * j + 4 * i, bt = at + 16;  // values of quad i of group j
        if constexpr (kOwn) G::x_unit(j, i, at, bt);
        const float *src = x + ch * kGroups * 32;
        const float4 a = __ldg(reinterpret_cast<const float4 *>(src + at));
        const float4 b = __ldg(reinterpret_cast<const float4 *>(src + bt));
        v[i][0] = a.x; v[i][1] = a.y; v[i][2] = a.z; v[i][3] = a.w;
        v[i][4] = b.x; v[i][5] = b.y; v[i][6] = b.z; v[i][7] = b.w;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float m = fabsf(v[i][e]);
            amax = fmaxf(amax, m);
            if (!(m <= 3.0e38f)) bad = 1.0f;  // inf or NaN: the chunk's outputs become NaN
        }
    }
    amax = lanes8_max(amax);
    const bool chunk_bad = lanes8_max(bad) != 0.0f;
    const float inv = x_quant_factor(amax, chunk_bad);
    uint4 w[4];
    int qsum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = x_unit_word(v[i], inv, qsum);
    xd = x_chunk_scale(amax, chunk_bad);
    xs = 0.0f;
    if constexpr (kOwn) {
        G::set_x(w, qsum, j, gx);
    } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) gx.v[q] = w[q];
        gx.s = G::kOffset && !G::kGroupScale ? qsum : 0;
        if constexpr (G::kGroupScale && G::kOffset) {
            const float s0 = (x_unit_sum0(v[0]) + x_unit_sum0(v[1])) + (x_unit_sum0(v[2]) + x_unit_sum0(v[3]));
            const float s1 = (x_unit_sum1(v[0]) + x_unit_sum1(v[1])) + (x_unit_sum1(v[2]) + x_unit_sum1(v[3]));
            xs = s0 + s1;
        }
    }
}

}  // namespace mm
