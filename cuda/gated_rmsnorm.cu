// Gated RMSNorm, the Gated DeltaNet output norm (reference: luce/ref/gated_rmsnorm.py):
//   out = x * rsqrt(mean(x^2) + eps) * weight * silu(z)
// Shapes: x, z, out [rows, cols] f32 row-major (rows = tokens x value heads, cols = head dim);
// weight [cols] f32. One warp per row (kRowsPerBlock rows a block; gated_rmsnorm.cuh): a row's
// reduction order depends only on cols, so the result is batch-invariant. out may alias x or z.
#include "gated_rmsnorm.cuh"

namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kThreads = kRowsPerBlock * WARP_SIZE;

__global__ void __launch_bounds__(kThreads) gated_rmsnorm_kernel(luce_gated_rmsnorm_params p) {
    const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + threadIdx.x / WARP_SIZE;
    if (row >= p.rows) return;  // whole warps leave together: the row's warp_sum stays full
    gated_rmsnorm_row(p.x + row * p.cols, p.z + row * p.cols, p.weight, p.out + row * p.cols, p.cols, p.eps);
}

int launch_gated_rmsnorm(const luce_gated_rmsnorm_params &p, cudaStream_t stream) {
    if (p.rows < 0 || p.cols <= 0) return (int)cudaErrorInvalidValue;
    if (p.rows == 0) return 0;
    const int64_t blocks = (p.rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks > 0x7fffffff) return (int)cudaErrorInvalidValue;
    gated_rmsnorm_kernel<<<(unsigned)blocks, kThreads, 0, stream>>>(p);
    return luce_status(cudaGetLastError());
}

}  // namespace

extern "C" int luce_gated_rmsnorm(const luce_gated_rmsnorm_params *p, void *stream) {
    return launch_gated_rmsnorm(*p, (cudaStream_t)stream);
}
