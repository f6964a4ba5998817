// RMSNorm over rows (reference: luce/ref/rmsnorm.py rmsnorm).
//   luce_rmsnorm: out = x * rsqrt(mean(x^2) + eps) * weight
// Shapes: x, out [rows, cols] f32 row-major; weight [cols] f32.
// Rows of up to kWarpRowMaxCols columns (q/k norms over a head) take one warp each, longer
// rows (the hidden state) one block of kThreads. The choice depends only on cols, and a
// thread always owns whole chunks of 4 (common.cuh), so a row's reduction order depends only
// on cols: batch-invariant by construction (DESIGN 5).
#include "common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarpRowMaxCols = 1024;
constexpr int kWarpRowsPerBlock = kThreads / WARP_SIZE;

struct Row {
    const float *x, *weight;
    float *out;
    int64_t cols;
    float eps;
};

// Rows of up to kRegChunks chunks per thread can stay in registers (one pass over memory,
// the weight loaded alongside x): the decode path, where latency is the cost. Long launches
// of block rows take the two-pass path instead (86 registers a thread cost occupancy). Both
// paths sum the same chunks in the same order and scale the same values, so they produce
// bitwise the same row: switching on the row count cannot break batch invariance.
constexpr int kRegChunks = 8;
constexpr int64_t kRegisterBlockRowsMax = 512;

template <typename Reduce>
__device__ __forceinline__ void norm_row_in_registers(const Row &r, int64_t base, int t, int width,
                                                      Reduce reduce) {
    const int64_t chunks = (r.cols + 3) / 4;
    float v[kRegChunks][4], w[kRegChunks][4];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < kRegChunks; ++c) {
        const int64_t j = t + (int64_t)c * width;
        if (j >= chunks) break;
        load_chunk4(r.x + base, j, r.cols, v[c]);
        load_chunk4(r.weight, j, r.cols, w[c]);
#pragma unroll
        for (int i = 0; i < 4; ++i) ss = fmaf(v[c][i], v[c][i], ss);
    }
    const float scale = rsqrtf(reduce(ss) / (float)r.cols + r.eps);
#pragma unroll
    for (int c = 0; c < kRegChunks; ++c) {
        const int64_t j = t + (int64_t)c * width;
        if (j >= chunks) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[c][i] = v[c][i] * scale * w[c][i];
        store_chunk4(r.out + base, j, r.cols, v[c]);
    }
}

// One row by a group of `width` threads (this thread is `t`); `reduce` sums over the group.
template <bool kRegisters, typename Reduce>
__device__ __forceinline__ void norm_row(const Row &r, int64_t base, int t, int width, Reduce reduce) {
    const int64_t chunks = (r.cols + 3) / 4;
    if (kRegisters && chunks <= (int64_t)kRegChunks * width) {
        norm_row_in_registers(r, base, t, width, reduce);
        return;
    }
    float ss = 0.0f;
    for (int64_t j = t; j < chunks; j += width) {
        float v[4];
        load_chunk4(r.x + base, j, r.cols, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) ss = fmaf(v[i], v[i], ss);
    }
    const float scale = rsqrtf(reduce(ss) / (float)r.cols + r.eps);
    const float *src = r.x + base;
    for (int64_t j = t; j < chunks; j += width) {
        float v[4], w[4];
        load_chunk4(src, j, r.cols, v);
        load_chunk4(r.weight, j, r.cols, w);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] * scale * w[i];
        store_chunk4(r.out + base, j, r.cols, v);
    }
}

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

int launch_rmsnorm(const Row &r, int64_t rows, cudaStream_t stream) {
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

}  // namespace

extern "C" int luce_rmsnorm(const luce_rmsnorm_params *p, void *stream) {
    const Row r{p->x, p->weight, p->out, p->cols, p->eps};
    return launch_rmsnorm(r, p->rows, (cudaStream_t)stream);
}
