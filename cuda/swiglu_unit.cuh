// A lane's unit of the SwiGLU (reference: luce/ref/norm_quant.py swiglu_quant), shared by
// swiglu_quant_kernel (cuda/norm_quant.cu) and the gate|up matmul's SwiGLU tail
// (matmul_gemv_swiglu.cuh), so both give the act bitwise alike: lane 4 j + quad of a warp holds
// values 4 quad .. 4 quad + 3 and 16 + 4 quad .. of group j (quantize_x_values' layout), each
// silu_f32(gate) * up.
#pragma once

#include "common.cuh"

// gate, up: the group's first value (16-byte aligned). kCoherent: read from L2, for values other
// blocks of the launch stored (never a stale L1 line).
template <bool kCoherent>
__device__ __forceinline__ void swiglu_unit(const float *gate, const float *up, int quad, float v[8]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int at = 16 * half + 4 * quad;
        float gv[4], uv[4];
        if constexpr (kCoherent) {
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
            const float4 g4 = __ldcg(reinterpret_cast<const float4 *>(gate + at));
            const float4 u4 = __ldcg(reinterpret_cast<const float4 *>(up + at));
            gv[0] = g4.x; gv[1] = g4.y; gv[2] = g4.z; gv[3] = g4.w;
            uv[0] = u4.x; uv[1] = u4.y; uv[2] = u4.z; uv[3] = u4.w;
#else
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                gv[i] = reinterpret_cast<const volatile float *>(gate)[at + i];
                uv[i] = reinterpret_cast<const volatile float *>(up)[at + i];
            }
#endif
        } else {
            load_chunk4(gate + at, 0, 4, gv);
            load_chunk4(up + at, 0, 4, uv);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) v[4 * half + i] = silu_f32(gv[i]) * uv[i];
    }
}

// The unit's 8 values into out (the group's first value).
__device__ __forceinline__ void store_unit(float *out, int quad, const float v[8]) {
    store_chunk4(out + 4 * quad, 0, 4, v);
    store_chunk4(out + 16 + 4 * quad, 0, 4, v + 4);
}
