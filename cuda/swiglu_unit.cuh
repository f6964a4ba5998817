// A lane's unit of the SwiGLU (reference: luce/ref/norm_quant.py swiglu_quant), shared by
// swiglu_quant_kernel (cuda/norm_quant.cu) and the gate|up matmul's SwiGLU tail
// (matmul_gemv_swiglu.cuh), so both give the act bitwise alike: lane 4 j + quad of a warp holds
// values 4 quad .. 4 quad + 3 and 16 + 4 quad .. of group j (quantize_x_values' layout), each
// silu_f32(gate) * up.
#pragma once

#include "common.cuh"

// gate, up: the group's first value (16-byte aligned). kCoherent: values other blocks of the
// launch stored (load_coherent4).
template <bool kCoherent>
__device__ __forceinline__ void swiglu_unit(const float *gate, const float *up, int quad, float v[8]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int at = 16 * half + 4 * quad;
        float gv[4], uv[4];
        if constexpr (kCoherent) {
            load_coherent4(gate + at, gv);
            load_coherent4(up + at, uv);
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
