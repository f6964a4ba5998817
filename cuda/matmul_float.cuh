// Float-weight matmul (F32, F16, BF16 rows) for cuda/matmul.cu: y = x @ W^T (+ bias), x f32
// as is. One warp per output row; lane l accumulates k = l, l + WARP_SIZE, ... in order (one
// f32 fma per value), then warp_sum's fixed butterfly: the order depends on k only, so a
// row's result is the same for any token count or grouping. Tokens come NTOK per block.
#pragma once

#include "matmul_mma.cuh"

namespace mm {

struct FloatArgs {
    const float *x;       // [rows, k]
    const uint8_t *w;     // [n, row_bytes]
    const float *bias;    // [n] or null
    float *y;             // [rows, n]
    int64_t rows, n, k, row_bytes;
};

template <int QT>
__device__ __forceinline__ float weight_value(const uint8_t *row, int64_t i) {
    if (QT == LUCE_QT_F32) return __ldg(reinterpret_cast<const float *>(row) + i);
    const uint32_t bits = ld16(row + 2 * i);
    if (QT == LUCE_QT_F16) return f16_to_f32(bits);
    return __uint_as_float(bits << 16);  // BF16
}

constexpr int kFloatWarps = 4;

template <int QT, int NTOK>
__global__ void __launch_bounds__(kFloatWarps * WARP_SIZE) float_matmul_kernel(FloatArgs a) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int64_t row = (int64_t)blockIdx.x * kFloatWarps + warp;
    if (row >= a.n) return;
    const int64_t t0 = (int64_t)blockIdx.y * NTOK;
    const uint8_t *w = a.w + row * a.row_bytes;
    const float *x[NTOK];
#pragma unroll
    for (int t = 0; t < NTOK; ++t) x[t] = a.x + min(t0 + t, a.rows - 1) * a.k;
    float acc[NTOK] = {};
#pragma unroll 4
    for (int64_t i = lane; i < a.k; i += WARP_SIZE) {
        const float wv = weight_value<QT>(w, i);
#pragma unroll
        for (int t = 0; t < NTOK; ++t) acc[t] = fmaf(wv, __ldg(x[t] + i), acc[t]);
    }
#pragma unroll
    for (int t = 0; t < NTOK; ++t) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t0 + t < a.rows) {
            if (a.bias) s = s + a.bias[row];
            a.y[(t0 + t) * a.n + row] = s;
        }
    }
}

template <int QT>
int launch_float_matmul(const FloatArgs &a, cudaStream_t stream) {
    const unsigned blocks_x = (unsigned)((a.n + kFloatWarps - 1) / kFloatWarps);
    if (a.rows == 1) {
        float_matmul_kernel<QT, 1><<<dim3(blocks_x, 1), kFloatWarps * WARP_SIZE, 0, stream>>>(a);
    } else {
        const unsigned blocks_y = (unsigned)((a.rows + 7) / 8);
        float_matmul_kernel<QT, 8><<<dim3(blocks_x, blocks_y), kFloatWarps * WARP_SIZE, 0, stream>>>(a);
    }
    return luce_status(cudaGetLastError());
}

}  // namespace mm
