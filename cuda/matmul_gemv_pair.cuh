// Two one-row matmuls of one x in one launch (luce_matmul_pair, cuda/matmul.cu): the projections
// a Q4_K_M / Q5_K_M file keeps in two types where they cannot merge into one weight, q|k (Q4_K or
// Q5_K) and v (Q6_K) in 13 of the Coder-1.5B's 28 layers (llama.cpp's use_more_bits layers). Blocks
// [0, grid_a) are weight a's one-row kernel and the rest weight b's (gemv_block, matmul_gemv.cuh):
// each block does what it does in its own kernel's launch, so y is bitwise the two launches'. One
// launch fewer per such layer, and the small v matrix runs beside q|k instead of after it.
#pragma once

#include "matmul_gemv.cuh"

namespace mm {

template <class GA, int RA, class GB, int RB>
__global__ void __launch_bounds__(kGemvMaxThreads) gemv_pair_kernel(GemvArgs a, GemvArgs b, int grid_a) {
    if ((int)blockIdx.x < grid_a)
        gemv_block<GA, 1, RA, false, true>(a, blockIdx.x, (unsigned)grid_a);
    else
        gemv_block<GB, 1, RB, false, true>(b, blockIdx.x - (unsigned)grid_a, gridDim.x - (unsigned)grid_a);
}

// x from the workspace (quantized already), one chunk slot a lane (gemv_slots == 1) for both;
// weight a at RA rows a batch, b at RB. The resident blocks are shared in proportion to the
// weights' batches.
template <class GA, int RA, class GB, int RB>
int launch_gemv_pair(GemvArgs a, GemvArgs b, cudaStream_t stream) {
    a.warps = b.warps = (int)((a.x.chunks + kGemvChunksPerWarp - 1) / kGemvChunksPerWarp);
    const int threads = a.warps * WARP_SIZE;
    const size_t smem_a = gemv_smem_bytes<GA, 1, RA>(a.x), smem_b = gemv_smem_bytes<GB, 1, RB>(b.x);
    const size_t smem = smem_a > smem_b ? smem_a : smem_b;
    static int resident[kGemvMaxThreads / WARP_SIZE + 1] = {};
    auto kernel = gemv_pair_kernel<GA, RA, GB, RB>;
    int &res = resident[a.warps];
    if (res == 0) res = resident_blocks(kernel, threads, smem);
    const int64_t batches_a = (a.n + RA - 1) / RA, batches_b = (b.n + RB - 1) / RB;
    const int64_t share_a = res > 1 ? res * batches_a / (batches_a + batches_b) : 0;
    const int64_t cap_a = res > 1 ? (share_a > 1 ? share_a : 1) : 0, cap_b = res > 1 ? (res - cap_a > 1 ? res - cap_a : 1) : 0;
    const int64_t grid_a = balanced_grid(batches_a, cap_a), grid_b = balanced_grid(batches_b, cap_b);
    return luce_status(launch_overlapped(kernel, dim3((unsigned)(grid_a + grid_b)), dim3(threads), smem, stream, true,
                                         a, b, (int)grid_a));
}

}  // namespace mm
