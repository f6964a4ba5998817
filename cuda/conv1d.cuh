// The causal conv1d's output of one channel and token, shared by cuda/conv1d.cu and the
// fused GDN decode (cuda/gdn_decode.cu) so both give the same bits (reference:
// luce/ref/conv1d.py): the K taps summed in tap order; window[K - 1] is the current token,
// window[j] the input K - 1 - j tokens before it.
#pragma once

#include "common.cuh"

// The window of draft-tree row `row` (global) of the segment whose first row is r0: position
// K-1 the row's own input, K-2, K-3, .. its ancestors along tree_parents (global rows) while
// there are any, then state rows: with m ancestors, position j < K-1-m reads state row m + j.
// x rows lie x_stride elements apart (channel c), state_c is the channel's column of the slot's
// state [K-1, C]. False (window unfinished) where a parent lies outside the segment or not
// before its child (a malformed tree: the callers write NaN).
template <int K>
__device__ __forceinline__ bool tree_window(const float *x, int64_t x_stride, int64_t c, const int32_t *tree_parents,
                                            int64_t r0, int64_t row, const float *state_c, int64_t C,
                                            float (&window)[K]) {
    window[K - 1] = x[row * x_stride + c];
    int64_t a = tree_parents[row], below = row;
    int m = 0;
#pragma unroll
    for (int j = K - 2; j >= 0; --j) {
        if (a >= 0) {
            if (a < r0 || a >= below) return false;
            window[j] = x[a * x_stride + c];
            below = a;
            a = tree_parents[a];
            ++m;
        } else {
            window[j] = state_c[(int64_t)(m + j) * C];
        }
    }
    return true;
}

template <int K>
__device__ __forceinline__ float conv1d_dot(const float (&w)[K], const float (&window)[K]) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc = fmaf(w[j], window[j], acc);
    return acc;
}
