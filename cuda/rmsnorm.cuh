// RMSNorm of one row by a group of threads, shared by cuda/rmsnorm.cu and the fused
// residual-add + RMSNorm (+ activation quantization) of cuda/norm_quant.cu, so both produce
// bitwise the same normed row (reference: luce/ref/rmsnorm.py).
// A thread owns whole chunks of 4 (common.cuh): a row's reduction order depends only on
// cols and the group width, never on the row count (DESIGN 5).
#pragma once

#include "common.cuh"

namespace rms {

constexpr int kThreads = 256;
constexpr int kWarpRowMaxCols = 1024;  // rows up to this many columns take one warp, longer one block
constexpr int kWarpRowsPerBlock = kThreads / WARP_SIZE;

// out = rmsnorm(x (+ residual)) * weight; with a residual, sum = x + residual is stored too.
struct Row {
    const float *x, *weight;
    float *out;
    int64_t cols;
    float eps;
    const float *residual = nullptr;
    float *sum = nullptr;
};

// Chunk j of the row at `base`: x (+ residual, stored into sum when `store_sum`).
__device__ __forceinline__ void load_input(const Row &r, int64_t base, int64_t j, bool store_sum, float v[4]) {
    load_chunk4(r.x + base, j, r.cols, v);
    if (r.residual) {
        float b[4];
        load_chunk4(r.residual + base, j, r.cols, b);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] + b[i];
        if (store_sum) store_chunk4(r.sum + base, j, r.cols, v);
    }
}
// Rows of up to kRegChunks chunks per thread can stay in registers (one pass over memory,
// the weight loaded alongside x): the decode path, where latency is the cost. Long launches
// of block rows take the two-pass path instead (86 registers a thread cost occupancy). Both
// paths sum the same chunks in the same order and scale the same values, so they produce
// bitwise the same row: switching on the row count cannot break batch invariance.
constexpr int kRegChunks = 8;
constexpr int64_t kRegisterBlockRowsMax = 512;

// Chunks j0, j0 + width, ... (kRegChunks of them, those inside the row) of x (+ residual) into
// v, every load issued before any add or store: with a residual, v = x + residual, stored into
// sum where store_sum. The stores of the sums may alias x for the compiler, so a loop of
// load-then-store was a dependent round trip a chunk; this is one a batch.
__device__ __forceinline__ void load_input_batch(const Row &r, int64_t base, int64_t j0, int width, bool store_sum,
                                                 float v[kRegChunks][4]) {
    const int64_t chunks = (r.cols + 3) / 4;
    float b[kRegChunks][4];
#pragma unroll
    for (int c = 0; c < kRegChunks; ++c) {
        const int64_t j = j0 + (int64_t)c * width;
        if (j < chunks) {
            load_chunk4(r.x + base, j, r.cols, v[c]);
            if (r.residual) load_chunk4(r.residual + base, j, r.cols, b[c]);
        }
    }
    if (!r.residual) return;
#pragma unroll
    for (int c = 0; c < kRegChunks; ++c) {
        const int64_t j = j0 + (int64_t)c * width;
        if (j >= chunks) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[c][i] = v[c][i] + b[c][i];
        if (store_sum) store_chunk4(r.sum + base, j, r.cols, v[c]);
    }
}

template <typename Reduce>
__device__ __forceinline__ void norm_row_in_registers(const Row &r, int64_t base, int t, int width,
                                                      Reduce reduce) {
    const int64_t chunks = (r.cols + 3) / 4;
    float v[kRegChunks][4], w[kRegChunks][4];
#pragma unroll
    for (int c = 0; c < kRegChunks; ++c) {
        const int64_t j = t + (int64_t)c * width;
        if (j >= chunks) break;
        load_chunk4(r.weight, j, r.cols, w[c]);
    }
    load_input_batch(r, base, t, width, true, v);
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < kRegChunks; ++c) {
        const int64_t j = t + (int64_t)c * width;
        if (j >= chunks) break;
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

// The row's scale 1 / rms, summed as norm_row sums it (thread t of `width` takes chunks t,
// t + width, ...): any group of threads computing it gets the bits norm_row uses. With
// store_sum, x + residual is stored too. The loads go kRegChunks chunks a batch
// (load_input_batch): a warp's row of 1,024 columns is one round trip.
template <typename Reduce>
__device__ __forceinline__ float norm_scale(const Row &r, int64_t base, int t, int width, bool store_sum,
                                            Reduce reduce) {
    const int64_t chunks = (r.cols + 3) / 4;
    float ss = 0.0f;
    for (int64_t j0 = t; j0 < chunks; j0 += (int64_t)kRegChunks * width) {
        float v[kRegChunks][4];
        load_input_batch(r, base, j0, width, store_sum, v);
#pragma unroll
        for (int c = 0; c < kRegChunks; ++c) {
            if (j0 + (int64_t)c * width >= chunks) break;
#pragma unroll
            for (int i = 0; i < 4; ++i) ss = fmaf(v[c][i], v[c][i], ss);
        }
    }
    return rsqrtf(reduce(ss) / (float)r.cols + r.eps);
}

// One row by a group of `width` threads (this thread is `t`); `reduce` sums over the group.
template <bool kRegisters, typename Reduce>
__device__ __forceinline__ void norm_row(const Row &r, int64_t base, int t, int width, Reduce reduce) {
    const int64_t chunks = (r.cols + 3) / 4;
    if (kRegisters && chunks <= (int64_t)kRegChunks * width) {
        norm_row_in_registers(r, base, t, width, reduce);
        return;
    }
    const float scale = norm_scale(r, base, t, width, true, reduce);
    for (int64_t j = t; j < chunks; j += width) {
        float v[4], w[4];
        // With a residual: the sum this thread stored in the first pass (x + residual, the same
        // floats), so a sum written over x or residual reads right.
        load_chunk4(r.residual ? r.sum + base : r.x + base, j, r.cols, v);
        load_chunk4(r.weight, j, r.cols, w);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = v[i] * scale * w[i];
        store_chunk4(r.out + base, j, r.cols, v);
    }
}

// Rows [0, rows) of r normed by cuda/rmsnorm.cu's kernels (a warp a row up to kWarpRowMaxCols
// columns, kWarpRowsPerBlock rows a block; longer rows a block each, in registers up to
// kRegisterBlockRowsMax rows): luce_rmsnorm, and luce_add_rmsnorm where it does not quantize
// (cuda/norm_quant.cu). Internal to the library (not exported beside the luce_* ABI).
__attribute__((visibility("hidden"))) int launch_rmsnorm(const Row &r, int64_t rows, cudaStream_t stream);

}  // namespace rms
