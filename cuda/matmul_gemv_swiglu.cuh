// The SwiGLU tail of the one-row matmul (cuda/matmul_swiglu_launch.cuh): a gate|up projection of
// one decode row (y [2F]: gate = y[0, F), up = y[F, 2F), F a multiple of 256) also forms the act
// silu(gate) * up [F] and its quantization for the down projection, so swiglu_quant's launch goes.
// Each batch's last warp (matmul_gemv.cuh), once its R rows are stored, adds R to the count of
// their 256-row act chunk; the warp that brings a chunk to 512 (its gate rows and its up rows) runs
// swiglu_quant_kernel's warp on that chunk: the same unit code (swiglu_unit.cuh) and
// quantize_x_values, so the act and its workspace are bitwise the two launches'. It writes the
// workspace's padding rows' zeros of the chunk too (zero_x_padding), and sets the count back to 0
// for the next launch (launches are stream-ordered: a later one's counting starts after this one
// ends).
#pragma once

#include "matmul_x.cuh"
#include "swiglu_unit.cuh"

namespace mm {

constexpr int kSwigluTailChunk = 256;  // act values a count covers: one quantization chunk

struct SwigluTail {
    float *act;         // [F] f32 (swiglu_quant's out)
    XLayout xl;         // the act's quantized layout (rows 1, k = F)
    unsigned *counts;   // [F / 256], zero before the launch and after it
    int64_t F;
};

// Called by the whole warp that stored rows row0 .. row0 + R - 1 of y (R divides 256).
template <int R>
__device__ __forceinline__ void swiglu_tail_after_batch(const SwigluTail &t, const float *y, int64_t row0) {
    static_assert(kSwigluTailChunk % R == 0, "a batch's rows stay in one act chunk");
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3, j = lane >> 2;
    __threadfence();  // the rows this lane stored, before their count
    __syncwarp();
    const int64_t ch = (row0 % t.F) / kSwigluTailChunk;
    unsigned before = 0;
    if (lane == 0) before = atomicAdd(t.counts + ch, (unsigned)R);
    before = warp_shfl(before, 0);
    if (before + R != 2 * kSwigluTailChunk) return;
    __threadfence();  // every other warp's rows of the chunk are visible from here
    if (lane == 0) t.counts[ch] = 0;
    const int64_t g = ch * kGroups + j;
    float v[8];
    swiglu_unit<true>(y + 32 * g, y + t.F + 32 * g, quad, v);
    store_unit(t.act + 32 * g, quad, v);
    quantize_x_values(v, t.xl, 0, ch);
    zero_x_padding(t.xl, ch);
}

}  // namespace mm
