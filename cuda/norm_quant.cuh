// The fused producers of a quantized matmul's input, a 256-value chunk a warp (reference:
// luce/ref/norm_quant.py): residual add + RMSNorm, and SwiGLU, each with the next matmul's
// activation quantization. Shared by cuda/norm_quant.cu's kernels and the one-row matmul's tails
// (cuda/matmul_gemv_tail.cuh), which therefore write the same bits.
#pragma once

#include "rmsnorm.cuh"
#include "matmul_x.cuh"

namespace rms {

// Chunk ch of row `row` by one whole warp: x + residual (stored as sum), out = that * scale *
// weight (norm_row's formula), both quantized into l; zeros quantized where !live (padding rows).
__device__ __forceinline__ void norm_quant_chunk(const Row &r, int64_t row, bool live, float scale,
                                                 const mm::XLayout &l, int64_t ch) {
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3;
    const int64_t base = row * r.cols, g = ch * mm::kGroups + (lane >> 2);
    float v[8] = {};
    if (live && 32 * g < r.cols) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int64_t c4 = 8 * g + 4 * half + quad;  // chunk of 4: values 32 g + 16 half + 4 quad ..
            float w[4];
            load_input(r, base, c4, true, v + 4 * half);
            load_chunk4(r.weight, c4, r.cols, w);
#pragma unroll
            for (int i = 0; i < 4; ++i) v[4 * half + i] = v[4 * half + i] * scale * w[i];
            store_chunk4(r.out + base, c4, r.cols, v + 4 * half);
        }
    }
    mm::quantize_x_values(v, l, row, ch);
}

// The scale add_rmsnorm_quant_kernel gives the row at `base`, by a block of whole warps (every
// thread calls it; `sums`: kThreads / WARP_SIZE floats of shared memory). Up to kWarpRowMaxCols
// columns each warp sums the row as the kernel's warp does (no barrier); past it, the kernel's
// block of kThreads threads, whose block_sum adds its warp sums in warp order from 0.0f: here the
// same warp sums (each of the same lanes' partials), spread over the warps, added in that order.
__device__ __forceinline__ float quant_row_scale(const Row &r, int64_t base, float *sums) {
    const int lane = threadIdx.x % WARP_SIZE;
    if (r.cols <= kWarpRowMaxCols) return norm_scale_of(r, warp_sum(norm_partial(r, base, lane, WARP_SIZE, false)));
    for (int w = threadIdx.x / WARP_SIZE; w < kThreads / WARP_SIZE; w += blockDim.x / WARP_SIZE) {
        const float s = warp_sum(norm_partial(r, base, w * WARP_SIZE + lane, kThreads, false));
        if (lane == 0) sums[w] = s;
    }
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < kThreads / WARP_SIZE; ++w) total += sums[w];
    return norm_scale_of(r, total);
}

// Chunk ch of token t by one whole warp: out = silu(gate) * up (swiglu.cu's element formula),
// stored in f32 and quantized into l; zeros quantized for padding tokens (t >= p.rows).
__device__ __forceinline__ void swiglu_quant_chunk(const luce_swiglu_quant_params &p, const mm::XLayout &l,
                                                   int64_t t, int64_t ch) {
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3;
    const int64_t g = ch * mm::kGroups + (lane >> 2);
    float v[8] = {};
    if (t < p.rows && 32 * g < p.cols) {
        const float *gate = p.gate + t * p.gate_stride + 32 * g, *up = p.up + t * p.up_stride + 32 * g;
        float *out = p.out + t * p.cols + 32 * g;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int at = 16 * half + 4 * quad;
            float gv[4], uv[4];
            load_chunk4(gate + at, 0, 4, gv);
            load_chunk4(up + at, 0, 4, uv);
#pragma unroll
            for (int i = 0; i < 4; ++i) v[4 * half + i] = silu_f32(gv[i]) * uv[i];
            store_chunk4(out + at, 0, 4, v + 4 * half);
        }
    }
    mm::quantize_x_values(v, l, t, ch);
}

}  // namespace rms
