// The causal conv1d's output of one channel and token, shared by cuda/conv1d.cu and the
// fused GDN decode (cuda/gdn_decode.cu) so both give the same bits (reference:
// luce/ref/conv1d.py): the K taps summed in tap order; window[K - 1] is the current token,
// window[j] the input K - 1 - j tokens before it.
#pragma once

#include "common.cuh"

template <int K>
__device__ __forceinline__ float conv1d_dot(const float (&w)[K], const float (&window)[K]) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc = fmaf(w[j], window[j], acc);
    return acc;
}
