// The one-row kernels' x quantized in lane: where a call's quantized x serves that call only
// (LUCE_MATMUL_X_ONCE, cuda/luce_ops_weights.h), the one-row kernel (matmul_gemv.cuh and its
// staged form, matmul_gemv_staged.cuh) reads its lanes' f32 values of x itself instead of the
// workspace that quantize_x_kernel (matmul_x.cuh) would have written: one launch fewer.
//
// Same bits (DESIGN 5 rule 6): a lane holds 4 units of 8 values (unit = quad q of a group:
// values 4q..4q+3 and 16+4q..16+4q+3, the 8 values one lane of quantize_x_values holds) and the 8
// lanes of a chunk (lane % 8, aligned) hold its 32 units once each (a lane past k or of a last
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
//
// Where x's f32 values come from (XSource, luce_matmul_produced): the call's x row (kXRow), or
// x formed in lane from its producer's inputs, so the producer's launch goes too: SwiGLU of a gate
// and an up row (kXSwiglu: swiglu_quant_kernel's element formula, cuda/norm_quant.cu) or the
// RMSNorm of a row plus a residual (kXNorm: add_rmsnorm_quant_kernel's, its scale summed by one warp
// of the block in that launch's order, rms::norm_scale_by_warp; block 0 stores x + residual). The
// f32 values are the producer's bits, so the quantized x and y are those of the producer's launch
// followed by the one-row kernel on its workspace.
#pragma once

#include "matmul_gemv_c.cuh"
#include "rmsnorm.cuh"

namespace mm {

enum XSourceKind { kXRow = 0, kXSwiglu = 1, kXNorm = 2 };

// The one-row kernel's x source arguments (GemvArgs): row a (x, gate or the norm's x), row b (up or
// the residual, may be null for the norm), the norm weight, where x + residual goes, eps; k values.
struct XSourceArgs {
    const float *a, *b, *weight;
    float *sum;
    float eps;
};

__device__ __forceinline__ float4 ldg4(const float *p) { return __ldg(reinterpret_cast<const float4 *>(p)); }

struct XRow {
    const float *x;
    __device__ __forceinline__ float4 at(int64_t i, bool) const { return ldg4(x + i); }
};

struct XSwiglu {
    const float *gate, *up;
    __device__ __forceinline__ float4 at(int64_t i, bool) const {
        const float4 g = ldg4(gate + i), u = ldg4(up + i);
        return make_float4(silu_f32(g.x) * u.x, silu_f32(g.y) * u.y, silu_f32(g.z) * u.z, silu_f32(g.w) * u.w);
    }
};

struct XNorm {
    const float *x, *residual, *weight;
    float *sum;
    float scale;
    // Values i..i+3: x + residual (stored into sum where `store`), times scale, times the weight.
    __device__ __forceinline__ float4 at(int64_t i, bool store) const {
        float4 v = ldg4(x + i);
        if (residual) {
            const float4 b = ldg4(residual + i);
            v.x = v.x + b.x; v.y = v.y + b.y; v.z = v.z + b.z; v.w = v.w + b.w;
            if (store) *reinterpret_cast<float4 *>(sum + i) = v;
        }
        const float4 w = ldg4(weight + i);
        return make_float4(v.x * scale * w.x, v.y * scale * w.y, v.z * scale * w.z, v.w * scale * w.w);
    }
};

// The source of kind kKind for this block (xf: row a; k values). kXNorm: the whole block calls (a
// barrier after warp 0 sums the row's scale).
template <int kKind>
__device__ __forceinline__ auto x_source(const float *xf, const XSourceArgs &s, int64_t k) {
    if constexpr (kKind == kXRow) {
        return XRow{xf};
    } else if constexpr (kKind == kXSwiglu) {
        return XSwiglu{xf, s.b};
    } else {
        static_assert(kKind == kXNorm, "an x source kind");
        __shared__ float scale_s;
        if (threadIdx.x < WARP_SIZE) {
            const rms::Row r{xf, s.weight, nullptr, k, s.eps, s.b, nullptr};
            const float scale = rms::norm_scale_by_warp(r, 0, (int)threadIdx.x);
            if (threadIdx.x == 0) scale_s = scale;
        }
        __syncthreads();
        return XNorm{xf, s.b, s.weight, s.sum, scale_s};
    }
}

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
// src: where the values come from (XRow, XSwiglu, XNorm); store: this lane stores what its source
// stores (XNorm's x + residual: block 0's live lanes, each value once).
template <class G, bool kOwn = G::kOwnLayout, class Src>
__device__ __forceinline__ void gemv_quantize_x(const Src &src, int64_t ch, int j, bool store, GroupX &gx, float &xd,
                                                float &xs) {
    float v[4][8];
    float amax = 0.0f, bad = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int group = j, quad = i;
        if constexpr (kOwn) G::x_unit(j, i, group, quad);
        const int64_t at = (ch * kGroups + group) * 32;
        const float4 a = src.at(at + 4 * quad, store);
        const float4 b = src.at(at + 16 + 4 * quad, store);
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
