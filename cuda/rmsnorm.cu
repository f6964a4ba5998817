// RMSNorm over rows, plain and fused with the residual add (references: luce/ref/rmsnorm.py
// rmsnorm, rmsnorm_residual).
//   luce_rmsnorm:          out = x * rsqrt(mean(x^2) + eps) * weight
//   luce_rmsnorm_residual: sum_out = x + residual; out = rmsnorm(sum_out) * weight
// Shapes: x, residual, sum_out, out [rows, cols] f32 row-major; weight [cols] f32.
// One block of kThreads per row, each thread owning whole chunks of 4 (common.cuh), so a
// row's reduction order depends only on cols: batch-invariant by construction (DESIGN 5).
#include "common.cuh"

namespace {

constexpr int kThreads = 256;

template <bool kResidual>
__global__ void __launch_bounds__(kThreads)
rmsnorm_kernel(const float *x, const float *residual, const float *weight, float *sum_out,
               float *out, int64_t cols, float eps) {
    __shared__ float scratch[32];
    const int64_t base = (int64_t)blockIdx.x * cols;
    const float *xr = x + base;
    const int64_t chunks = (cols + 3) / 4;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < chunks; j += kThreads) {
        float v[4];
        load_chunk4(xr, j, cols, v);
        if (kResidual) {
            float r[4];
            load_chunk4(residual + base, j, cols, r);
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] += r[i];
            store_chunk4(sum_out + base, j, cols, v);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) ss = fmaf(v[i], v[i], ss);
    }
    const float scale = rsqrtf(block_sum(ss, scratch) / (float)cols + eps);
    // Each thread re-reads the chunks it wrote itself, so sum_out may alias x or residual.
    const float *src = kResidual ? sum_out + base : xr;
    for (int64_t j = threadIdx.x; j < chunks; j += kThreads) {
        float v[4], w[4];
        load_chunk4(src, j, cols, v);
        load_chunk4(weight, j, cols, w);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] * scale * w[i];
        store_chunk4(out + base, j, cols, v);
    }
}

int check_shape(int64_t rows, int64_t cols) {
    if (rows < 0 || cols <= 0 || rows > 0x7fffffff) return (int)cudaErrorInvalidValue;
    return 0;
}

template <bool kResidual>
int launch_rmsnorm(const float *x, const float *residual, const float *weight, float *sum_out,
                   float *out, int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
    if (int err = check_shape(rows, cols)) return err;
    if (rows == 0) return 0;
    rmsnorm_kernel<kResidual><<<(unsigned)rows, kThreads, 0, stream>>>(x, residual, weight, sum_out,
                                                                       out, cols, eps);
    return luce_status(cudaGetLastError());
}

}  // namespace

extern "C" int luce_rmsnorm(const luce_rmsnorm_params *p, void *stream) {
    return launch_rmsnorm<false>(p->x, nullptr, p->weight, nullptr, p->out, p->rows, p->cols,
                                 p->eps, (cudaStream_t)stream);
}

extern "C" int luce_rmsnorm_residual(const luce_rmsnorm_residual_params *p, void *stream) {
    if (p->sum_out == p->out) return (int)cudaErrorInvalidValue;
    return launch_rmsnorm<true>(p->x, p->residual, p->weight, p->sum_out, p->out, p->rows,
                                p->cols, p->eps, (cudaStream_t)stream);
}
