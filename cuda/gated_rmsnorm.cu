// Gated RMSNorm, the Gated DeltaNet output norm (reference: luce/ref/gated_rmsnorm.py):
//   out = x * rsqrt(mean(x^2) + eps) * weight * silu(z)
// Shapes: x, z, out [rows, cols] f32 row-major (rows = tokens x value heads, cols = head dim);
// weight [cols] f32. One warp per row (kRowsPerBlock rows a block), each lane owning whole
// chunks of 4 (common.cuh): a row's reduction order depends only on cols, so the result is
// batch-invariant. out may alias x or z: each lane rewrites only the chunks it read.
#include "common.cuh"

namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kThreads = kRowsPerBlock * WARP_SIZE;

__global__ void __launch_bounds__(kThreads) gated_rmsnorm_kernel(luce_gated_rmsnorm_params p) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + threadIdx.x / WARP_SIZE;
    if (row >= p.rows) return;  // whole warps leave together: warp_sum below stays full
    const float *x = p.x + row * p.cols;
    const float *z = p.z + row * p.cols;
    float *out = p.out + row * p.cols;
    const int64_t chunks = (p.cols + 3) / 4;
    float ss = 0.0f;
    for (int64_t j = lane; j < chunks; j += WARP_SIZE) {
        float v[4];
        load_chunk4(x, j, p.cols, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) ss = fmaf(v[i], v[i], ss);
    }
    const float scale = rsqrtf(warp_sum(ss) / (float)p.cols + p.eps);
    for (int64_t j = lane; j < chunks; j += WARP_SIZE) {
        float v[4], g[4], w[4];
        load_chunk4(x, j, p.cols, v);
        load_chunk4(z, j, p.cols, g);
        load_chunk4(p.weight, j, p.cols, w);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] * scale * w[i] * silu_f32(g[i]);
        store_chunk4(out, j, p.cols, v);
    }
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
