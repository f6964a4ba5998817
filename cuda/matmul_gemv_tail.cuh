// The one-row matmul's norm tail (luce_matmul_add_rmsnorm, cuda/matmul_norm.cu): the launch that
// computes y [n] also adds the residual, norms the sum and quantizes it for the next matmuls,
// the work of luce_add_rmsnorm's quantizing kernel (cuda/norm_quant.cu) on y, in its bits
// (cuda/norm_quant.cuh is both's code): one launch fewer between two projections of a decode
// step (the out projection and the FFN norm; the down projection and the next layer's norm).
#pragma once

#include "norm_quant.cuh"

namespace mm {

struct NormTail {
    rms::Row r;    // x: the launch's y (token 0); the residual, the norm weight, sum and out; cols = n
    XLayout l;     // the next matmuls' quantized x: token 0, then zeros for its padding tokens
    int *counter;  // blocks done: zero between launches (the last block zeroes it); null: no tail
};

// Run at the end of a launch by every thread of every block, after the block's writes of y:
// the grid zeroes l's padding tokens, then the last block to finish (the threadFenceReduction
// pattern of the attention's merge, cuda/attention.cu: every writer fences, one atomic count)
// adds, norms and quantizes token 0, a chunk a warp, with the row's scale in the norm kernel's
// bits (quant_row_scale).
__device__ __forceinline__ void gemv_norm_tail(const NormTail &t) {
    __shared__ int last;
    __shared__ float sums[rms::kThreads / WARP_SIZE];
    zero_x_tokens(t.l, 1, (int64_t)blockIdx.x * blockDim.x + threadIdx.x, (int64_t)gridDim.x * blockDim.x);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(t.counter, 1) == (int)gridDim.x - 1;
        if (last) *t.counter = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float scale = rms::quant_row_scale(t.r, 0, sums);
    for (int64_t ch = threadIdx.x / WARP_SIZE; ch < t.l.chunks; ch += blockDim.x / WARP_SIZE)
        rms::norm_quant_chunk(t.r, 0, true, scale, t.l, ch);
}

// luce_matmul, with the norm tail (tail.counter set) where the call takes the one-row kernel's
// register form at tune 0; *tail_done: whether it did (cuda/matmul.cu; for luce_matmul_add_rmsnorm,
// cuda/matmul_norm.cu). Internal to the library (not exported beside the luce_* ABI).
__attribute__((visibility("hidden"))) int matmul_with_tail(const luce_matmul_params *p, const NormTail &tail,
                                                           bool *tail_done, cudaStream_t stream);

}  // namespace mm
