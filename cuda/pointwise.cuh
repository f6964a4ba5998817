// Device maths of cuda/pointwise.cu shared with the fused GDN decode kernel (cuda/gdn_decode.cu),
// so both compute the same bits: the unary activations in double, rounded once, and the row
// L2 norm's pieces (a lane's sum of squares in double over its columns in order, the warp's
// butterfly, the scale). Reference: luce/ref/pointwise.py.
#pragma once

#include "common.cuh"

__device__ __forceinline__ double unary_op(int op, double x) {
    switch (op) {
        case LUCE_PW_SILU: return x / (1.0 + exp(-x));
        case LUCE_PW_SIGMOID: return 1.0 / (1.0 + exp(-x));
        case LUCE_PW_SOFTPLUS: return fmax(x, 0.0) + log1p(exp(-fabs(x)));
        default: return exp(x);
    }
}

// A lane's running sum of squares, one column at a time in column order.
__device__ __forceinline__ double l2norm_accumulate(double sum, float x) {
    const double v = x;
    return sum + v * v;
}

// 1 / sqrt(row sum + eps) from every lane's partial, combined in a fixed butterfly order
// (the whole warp calls it; every lane gets the result).
__device__ __forceinline__ double l2norm_inverse(double sum, float eps) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) sum += warp_shfl_xor(sum, m);
    return 1.0 / sqrt(sum + (double)eps);
}

__device__ __forceinline__ float l2norm_apply(float x, double inv) { return (float)((double)x * inv); }
