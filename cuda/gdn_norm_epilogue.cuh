// The gated RMSNorm epilogue of the GDN kernels that write out [T, Hv, Dv] a head's Dv /
// WARP_SIZE blocks at a time (gdn_recurrent.cuh's NORM form, gdn_tree.cu's tree verify): each
// block counts itself in arrivals[seg * Hv + head] (zero before the launch); the last to arrive,
// once every block's out columns are visible, runs gated_rmsnorm_row over the head's rows
// r0..r1-1 (z rows z_stride elements apart; weight [Dv]) into normed, so normed is bitwise
// luce_gated_rmsnorm of out.
//
// With quant.xq set (the decode chain, cuda/gdn_decode.cu), normed's rows [T, Hv * Dv] are then
// quantized for the out projection (cuda/matmul_x.cuh: 256-value chunks, each spanning the heads
// whose columns it holds): a normed head counts itself in chunk_arrivals[seg * chunks + c] of
// each chunk c its columns touch (zero before the launch), and the last head of a chunk
// quantizes the segment's rows of it with quantize_x_kernel's bits, so luce_matmul with
// LUCE_MATMUL_REUSE_X on that workspace gives its result on normed: no separate quantize launch.
#pragma once

#include "gated_rmsnorm.cuh"
#include "gdn_common.cuh"
#include "matmul_x.cuh"

struct GdnNormEpilogue {
    const float *z;        // [T, Hv, Dv], rows z_stride elements apart
    int64_t z_stride;
    const float *weight;   // [Dv]
    float *normed;         // [T, Hv, Dv]
    int32_t *arrivals;     // [segments, Hv], zero before the launch
    float eps;
    mm::XLayout quant;          // normed quantized (xq null: not)
    int32_t *chunk_arrivals;    // [segments, quant.chunks], zero before the launch (with quant)
};

// The heads whose columns chunk c of normed [.., H * dv] holds (its first and last column's).
__device__ __forceinline__ int64_t gdn_chunk_heads(int64_t c, int64_t H, int64_t dv) {
    const int64_t last_col = 256 * c + 255 < H * dv ? 256 * c + 255 : H * dv - 1;
    return last_col / dv - 256 * c / dv + 1;
}

// The quantization after head `head`'s rows are normed (every thread of the block calls).
__device__ __forceinline__ void gdn_norm_quant(const GdnNormEpilogue &e, int64_t seg, int64_t r0, int64_t r1,
                                               int64_t H, int64_t head, int64_t dv) {
    __shared__ uint32_t mine;  // bit c - c0: chunk c is this block's to quantize
    const int64_t c0 = head * dv / 256, c1 = ((head + 1) * dv - 1) / 256, chunks = e.quant.chunks;
    __threadfence();  // this block's normed rows, before its head is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t m = 0;
        for (int64_t c = c0; c <= c1; ++c)
            if (atomicAdd(e.chunk_arrivals + seg * chunks + c, 1) == (int)gdn_chunk_heads(c, H, dv) - 1)
                m |= 1u << (c - c0);
        mine = m;
    }
    __syncthreads();
    if (mine == 0) return;
    __threadfence();  // the chunk's other heads are visible from here
    const int64_t cols = H * dv;
    for (int64_t c = c0; c <= c1; ++c) {
        if (!(mine >> (c - c0) & 1u)) continue;
        for (int64_t t = r0 + threadIdx.x / WARP_SIZE; t < r1; t += GDN_KGROUPS)
            mm::quantize_x_row_chunk<true>(e.normed + t * cols, true, e.quant, t, c);
    }
}

// Called by every thread of the block after its out columns are written.
__device__ __forceinline__ void gdn_norm_epilogue(const GdnNormEpilogue &e, const float *out, int64_t seg,
                                                  int64_t r0, int64_t r1, int64_t H, int64_t head, int64_t dv) {
    __shared__ int last;
    __threadfence();   // this block's out columns, before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(e.arrivals + seg * H + head, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();   // every other block's columns are visible from here
    for (int64_t t = r0 + threadIdx.x / WARP_SIZE; t < r1; t += GDN_KGROUPS) {
        const int64_t row = (t * H + head) * dv;
        gated_rmsnorm_row(out + row, e.z + t * e.z_stride + head * dv, e.weight, e.normed + row, dv, e.eps);
    }
    if (e.quant.xq != nullptr) gdn_norm_quant(e, seg, r0, r1, H, head, dv);
}
