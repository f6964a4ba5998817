// RMSNorm over rows (reference: luce/ref/rmsnorm.py rmsnorm).
//   luce_rmsnorm: out = x * rsqrt(mean(x^2) + eps) * weight
// Shapes: x, out [rows, cols] f32 row-major; weight [cols] f32.
// Rows of up to kWarpRowMaxCols columns (q/k norms over a head) take one warp each, longer
// rows (the hidden state) one block of kThreads. The choice depends only on cols, and a
// thread always owns whole chunks of 4 (common.cuh), so a row's reduction order depends only
// on cols: batch-invariant by construction (DESIGN 5).
#include "rmsnorm.cuh"

namespace {

using namespace rms;

// kRegisters is a template parameter: a kernel's register count is fixed when compiled.
template <bool kRegisters>
__global__ void __launch_bounds__(kThreads) rmsnorm_block_kernel(Row r) {
    __shared__ float scratch[32];
    norm_row<kRegisters>(r, (int64_t)blockIdx.x * r.cols, threadIdx.x, kThreads,
                                    [&](float v) { return block_sum(v, scratch); });
}

__global__ void __launch_bounds__(kThreads) rmsnorm_warp_kernel(Row r, int64_t rows) {
    const int64_t row = (int64_t)blockIdx.x * kWarpRowsPerBlock + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;  // whole warps leave together
    norm_row<true>(r, row * r.cols, threadIdx.x % WARP_SIZE, WARP_SIZE,
                              [](float v) { return warp_sum(v); });
}

}  // namespace

int rms::launch_rmsnorm(const Row &r, int64_t rows, cudaStream_t stream) {
    if (rows < 0 || r.cols <= 0 || rows > 0x7fffffff) return (int)cudaErrorInvalidValue;
    if (rows == 0) return 0;
    if (r.cols <= kWarpRowMaxCols) {
        const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
        rmsnorm_warp_kernel<<<(unsigned)blocks, kThreads, 0, stream>>>(r, rows);
    } else if (rows <= kRegisterBlockRowsMax) {
        rmsnorm_block_kernel<true><<<(unsigned)rows, kThreads, 0, stream>>>(r);
    } else {
        rmsnorm_block_kernel<false><<<(unsigned)rows, kThreads, 0, stream>>>(r);
    }
    return luce_status(cudaGetLastError());
}

extern "C" int luce_rmsnorm(const luce_rmsnorm_params *p, void *stream) {
    const Row r{p->x, p->weight, p->out, p->cols, p->eps};
    return launch_rmsnorm(r, p->rows, (cudaStream_t)stream);
}
