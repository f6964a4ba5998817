// The attention output quantized for the matmul that reads it (o @ wo): with
// luce_attention_params.x_workspace set, luce_attention (cuda/attention.cu) also fills that
// luce_matmul workspace exactly as quantize_x_kernel (cuda/matmul_x.cuh) would quantize `out`
// viewed as [n_rows, Hq * D], so luce_matmul with LUCE_MATMUL_REUSE_X then gives bitwise the
// matmul of `out`, one launch (quantize_x) fewer. Reference: luce/ref/norm_quant.py
// attention_matmul (the composition).
// In the partition kernel's in-kernel merge (no combine launch) the block that finalizes the
// last head group of a row (the last of the row's head-group finishers: one atomic count per
// row, after the group counters) reads the row's outputs back from L2 and quantizes them, a
// warp a 256-value chunk, by mm::quantize_x_values on the values quantize_x_kernel would load
// (the same f32 bits: the row's final outputs), so the bytes and scales are the same. Padding
// rows of the workspace (n_rows..tp-1) are zeros, written by the finishers of rows
// (t - n_rows) % n_rows. Launches that merge in a combine kernel (prompt rows, too few
// counters) quantize after it with quantize_x_kernel itself.
#pragma once

#include "attention_common.cuh"
#include "matmul_x.cuh"

namespace luce_attn {

// Warp `warp` of `warps` quantizes chunks warp, warp + warps, ... of row t (f32 values from
// out, coherent loads: other blocks of this launch wrote them; t >= n_rows: zeros).
__device__ __forceinline__ void quantize_out_row(const luce_attention_params &p, const mm::XLayout &l, int64_t t,
                                                 int warp, int warps) {
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3, j = lane >> 2;
    const int64_t k = (int64_t)p.n_heads_q * p.head_dim;
    for (int64_t ch = warp; ch < l.chunks; ch += warps) {
        const int64_t g = ch * mm::kGroups + j;
        float v[8] = {};
        if (t < p.n_rows && g < l.groups) {
            const float *src = p.out + t * k + 32 * g;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                v[i] = load_coherent(src + 4 * quad + i);
                v[4 + i] = load_coherent(src + 16 + 4 * quad + i);
            }
        }
        mm::quantize_x_values(v, l, t, ch);  // whole warp
    }
}

// Called by every thread of a block that has just written the final outputs of its head group
// of row `row` (or found the row has nothing to write: padding). The last of the row's
// `groups` finishers quantizes the row (and its share of the workspace's padding rows).
__device__ __forceinline__ void finish_row_quant(const luce_attention_params &p, const mm::XLayout &l, int32_t row,
                                                 int32_t groups) {
    __shared__ int last_of_row;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *count = p.counters + (int64_t)p.n_rows * groups + row;
        last_of_row = atomicAdd(count, 1) == groups - 1;
        if (last_of_row) *count = 0;  // zero again for the next launch
    }
    __syncthreads();
    if (!last_of_row) return;
    __threadfence();
    const int warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    quantize_out_row(p, l, row, warp, warps);
    for (int64_t t = (int64_t)p.n_rows + row; t < l.tp; t += p.n_rows) quantize_out_row(p, l, t, warp, warps);
}

}  // namespace luce_attn

namespace {

// The workspace must hold x_bytes(n_rows, Hq * D) and be 16-byte aligned (as luce_matmul's).
inline bool quant_workspace_ok(const luce_attention_params &p) {
    const int64_t k = (int64_t)p.n_heads_q * p.head_dim;
    return p.x_workspace == nullptr ||
           ((uintptr_t)p.x_workspace % 16 == 0 && k % 32 == 0 && p.x_workspace_bytes >= mm::x_bytes(p.n_rows, k));
}

// The workspace layout the kernels get (mm::x_layout of out as [n_rows, Hq * D]; zeros: none).
inline mm::XLayout quant_layout_of(const luce_attention_params &p) {
    return p.x_workspace == nullptr ? mm::XLayout{}
                                    : mm::x_layout(p.x_workspace, p.n_rows, (int64_t)p.n_heads_q * p.head_dim);
}

// After a combine launch: quantize_x_kernel on out, as luce_matmul would launch it.
inline int launch_quantize_out(const luce_attention_params &p, cudaStream_t s) {
    const int64_t k = (int64_t)p.n_heads_q * p.head_dim;
    const mm::XLayout l = quant_layout_of(p);
    const int64_t warps = l.tp * l.chunks, per_block = 256 / WARP_SIZE;
    mm::quantize_x_kernel<<<(unsigned)((warps + per_block - 1) / per_block), 256, 0, s>>>(p.out, p.n_rows, k, l);
    return luce_status(cudaGetLastError());
}

}  // namespace
