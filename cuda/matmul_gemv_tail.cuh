// The one-row matmul's tails (cuda/matmul_norm.cu): the launch that computes y [n] also runs
// the fused producer of the next matmul's input on it, in that producer's bits (cuda/norm_quant.cuh
// is the code of both): one launch fewer between two projections of a decode step.
// - Norm tail (luce_matmul_add_rmsnorm): y + the residual, RMSNorm, quantization; the out
//   projection and the FFN norm, the down projection and the next layer's norm.
// - SwiGLU tail (luce_matmul_swiglu_quant): y = gate | up (merged), silu(gate) * up and its
//   quantization; the FFN's gate|up projection and the down projection's input.
#pragma once

#include "norm_quant.cuh"

namespace mm {

struct NormTail {
    rms::Row r;    // x: the launch's y (token 0); the residual, the norm weight, sum and out; cols = n
    XLayout l;     // the next matmuls' quantized x: token 0, then zeros for its padding tokens
    int *counter;  // blocks done: zero between launches (the last block zeroes it); null: no tail
};

struct SwigluTail {
    luce_swiglu_quant_params p;  // gate = y, up = y + F, row strides 2F, out [F]; rows 1, cols F (256 | F)
    XLayout l;                   // the down projection's quantized x: token 0, zeros for its padding tokens
    int *counters;               // batches done a 256-value chunk [F / 256]: zero between launches; null: no tail
};

enum GemvTailKind { kNoTail = 0, kTailNorm = 1, kTailSwiglu = 2 };

struct GemvTail {  // the kernel's kTail picks which one runs
    NormTail norm;
    SwigluTail swiglu;
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

// The SwiGLU tail after the chain of rows row0 .. row0 + R - 1 of y (one chunk's gate or up rows:
// 256 | F, R | 256), by the whole warp that wrote them: every writer fences, one atomic count a
// chunk; the warp that completes the chunk's 2 x 256 / R batches forms and quantizes it.
__device__ __forceinline__ void gemv_swiglu_batch(const SwigluTail &t, int64_t row0, int R) {
    const int64_t ch = row0 % t.p.cols / 256;
    __threadfence();
    __syncwarp();
    int before = 0;
    if (threadIdx.x % WARP_SIZE == 0) before = atomicAdd(t.counters + ch, 1);
    if (warp_shfl(before, 0) != 2 * 256 / R - 1) return;
    if (threadIdx.x % WARP_SIZE == 0) t.counters[ch] = 0;  // zero again for the next launch
    __threadfence();
    rms::swiglu_quant_chunk(t.p, t.l, 0, ch);
}

// luce_matmul, with a tail (tail.norm.counter or tail.swiglu.counters set) where the call takes
// the one-row kernel's register form at tune 0; *tail_done: whether it did (cuda/matmul.cu; for
// cuda/matmul_norm.cu). Internal to the library (not exported beside the luce_* ABI).
__attribute__((visibility("hidden"))) int matmul_with_tail(const luce_matmul_params *p, const GemvTail &tail,
                                                           bool *tail_done, cudaStream_t stream);

}  // namespace mm
