// RMSNorm over rows: out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight.
// Shapes: x, out [rows, cols] f32 row-major; weight [cols] f32. Reference: luce/ref/rmsnorm.py.
// One block per row with a fixed block size, so a row's reduction order depends only on cols:
// batch-invariant by construction (DESIGN 5).
#include "common.cuh"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(luce_rmsnorm_params p) {
    __shared__ float scratch[32];
    const int64_t row = blockIdx.x;
    const float *x = p.x + row * p.cols;
    float *out = p.out + row * p.cols;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) ss += x[c] * x[c];
    const float total = block_sum(ss, scratch);
    const float scale = rsqrtf(total / (float)p.cols + p.eps);
    for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) out[c] = x[c] * scale * p.weight[c];
}

}  // namespace

extern "C" int luce_rmsnorm(const luce_rmsnorm_params *p, void *stream) {
    if (p->rows == 0) return 0;
    if (p->rows < 0 || p->cols <= 0 || p->rows > 0x7fffffff) return (int)cudaErrorInvalidValue;
    rmsnorm_kernel<<<(unsigned)p->rows, kThreads, 0, (cudaStream_t)stream>>>(*p);
    return luce_status(cudaGetLastError());
}
