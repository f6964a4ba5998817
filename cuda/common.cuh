// Shared device helpers for every luce kernel. The only place a warp width is spelled:
// NVIDIA warps and RDNA waves are 32 lanes, CDNA waves 64 (hip/compat.h sets LUCE_WAVE64).
#pragma once

#ifdef __HIPCC__
#include "../hip/compat.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#include <stdint.h>
#include "luce_ops.h"

#ifdef LUCE_WAVE64
#define WARP_SIZE 64
#else
#define WARP_SIZE 32
#endif

// Full-mask shuffle xor across one warp.
template <typename T>
__device__ __forceinline__ T warp_shfl_xor(T v, int lane_mask) {
#ifdef __HIPCC__
    return __shfl_xor(v, lane_mask, WARP_SIZE);
#else
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, WARP_SIZE);
#endif
}

// Full-mask shuffle: the value of lane `src` of the warp.
template <typename T>
__device__ __forceinline__ T warp_shfl(T v, int src) {
#ifdef __HIPCC__
    return __shfl(v, src, WARP_SIZE);
#else
    return __shfl_sync(0xffffffffu, v, src, WARP_SIZE);
#endif
}

// Butterfly sum: every lane ends with the same total, added in a fixed order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += warp_shfl_xor(v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v = fmaxf(v, warp_shfl_xor(v, m));
    return v;
}

// Block-wide sum in a fixed order (warp partials in warp order). `scratch` holds >= 32 floats.
// Every thread gets the total. blockDim.x must be a multiple of WARP_SIZE.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n_warps = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < n_warps; ++w) total += scratch[w];
    return total;
}

// Status every extern "C" entry point returns: 0 on success, else the runtime's error code.
static inline int luce_status(cudaError_t err) { return (int)err; }

// ---- chunk-of-4 row access (build engineer; used by rmsnorm, gated_rmsnorm, swiglu) --------
// Element c of a row belongs to chunk c / 4 and a thread always owns whole chunks, so its
// arithmetic (and any reduction's order) is the same whether a chunk moves as one float4
// (16-byte aligned row) or as scalars: a row's result must not depend on where it sits in
// memory (batch invariance). Elements past `cols` read as 0 and are not written.
__host__ __device__ __forceinline__ bool is_aligned16(const void *p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ void load_chunk4(const float *row, int64_t chunk, int64_t cols,
                                            float v[4]) {
    const int64_t c0 = chunk * 4;
    if (c0 + 4 <= cols && is_aligned16(row)) {
        const float4 q = *reinterpret_cast<const float4 *>(row + c0);
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = c0 + i < cols ? row[c0 + i] : 0.0f;
}

__device__ __forceinline__ void store_chunk4(float *row, int64_t chunk, int64_t cols,
                                             const float v[4]) {
    const int64_t c0 = chunk * 4;
    if (c0 + 4 <= cols && is_aligned16(row)) {
        *reinterpret_cast<float4 *>(row + c0) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (c0 + i < cols) row[c0 + i] = v[i];
}

// Reads what other blocks of this launch wrote (the attention's fused combine, the GDN norm
// epilogue's quantization): from L2, never a stale L1 line.
__device__ __forceinline__ float load_coherent(const float *a) {
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
    return __ldcg(a);
#else
    return *reinterpret_cast<const volatile float *>(a);
#endif
}

// x * sigmoid(x) in f32 (saturates to -0 for very negative x, never NaN for finite x).
__device__ __forceinline__ float silu_f32(float x) { return x / (1.0f + expf(-x)); }
