// 8-bit activation quantization for the prompt-row GEMM (cuda/matmul_prefill.cu), ggml's
// q8_1 arithmetic: per row t and 32-value group g of x [rows, k] f32,
//   amax = max |x|, d = amax / 127, q = rint(x * (127 / amax)) (|q| <= 127, 0 if amax = 0),
//   xs = d * sum(q)  (the offset term of types with mins: sum(x) as the kernel sees x).
// A group holding inf or NaN gets d = xs = NaN (its row's outputs become NaN).
// Reference: luce/ref/matmul_prefill.py (quantize_x8), bit for bit.
#pragma once

#include "matmul_mma.cuh"
#include "pdl.cuh"

namespace mmp {

constexpr int kTokTile = 64;      // tokens per block tile; rows are padded to a multiple
constexpr int kChunk = 256;       // values per k step
constexpr int kChunkGroups = 8;   // 32-value groups per k step

// Workspace layout, rows padded to tp (pad rows and groups past k hold zeros):
//   xq [tp][kp] int8, kp = chunks * 256; group g of a row at 32 g, its values stored in mma
//     B order: 8 bytes per quad q = {values 4q..4q+3, 16+4q..16+4q+3} at 8 q.
//   xd [chunks * 8][tp] float2 {d, xs}.
struct X8Layout {
    int8_t *xq;
    float2 *xd;
    int64_t tp, kp, groups, chunks;
};

inline int64_t x8_padded_rows(int64_t rows) { return (rows + kTokTile - 1) / kTokTile * kTokTile; }

inline int64_t x8_bytes(int64_t rows, int64_t k) {
    const int64_t tp = x8_padded_rows(rows), chunks = (k + kChunk - 1) / kChunk;
    return tp * chunks * (kChunk + kChunkGroups * 8);
}

inline X8Layout x8_layout(void *ws, int64_t rows, int64_t k) {
    X8Layout l;
    l.tp = x8_padded_rows(rows);
    l.groups = k / 32;
    l.chunks = (k + kChunk - 1) / kChunk;
    l.kp = l.chunks * kChunk;
    l.xq = static_cast<int8_t *>(ws);
    l.xd = reinterpret_cast<float2 *>(static_cast<uint8_t *>(ws) + l.tp * l.kp);
    return l;
}

// One warp per (padded row, 256-value chunk): lane 4 j + quad holds values 4 quad..+3 and
// 16 + 4 quad..+3 of group j.
__global__ void __launch_bounds__(256) quantize_x8_kernel(const float *x, int64_t rows, int64_t k, X8Layout l) {
    let_dependents_start();  // the GEMM may launch now; it waits for this kernel before reading x
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3, j = lane >> 2;
    const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    if (item >= l.tp * l.chunks) return;  // whole warps
    const int64_t t = item / l.chunks, ch = item % l.chunks, g = ch * kChunkGroups + j;
    float v[8] = {};
    if (t < rows && g < l.groups) {
        const float *src = x + t * k + 32 * g;
        const float4 a = __ldg(reinterpret_cast<const float4 *>(src + 4 * quad));
        const float4 b = __ldg(reinterpret_cast<const float4 *>(src + 16 + 4 * quad));
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
    float amax = 0.0f, bad = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float m = fabsf(v[i]);
        amax = fmaxf(amax, m);
        if (!(m <= 3.0e38f)) bad = 1.0f;
    }
#pragma unroll
    for (int m = 1; m <= 2; m <<= 1) {  // the group's 4 lanes
        amax = fmaxf(amax, warp_shfl_xor(amax, m));
        bad = fmaxf(bad, warp_shfl_xor(bad, m));
    }
    const float inv = (bad == 0.0f && amax > 0.0f) ? __fdiv_rn(127.0f, amax) : 0.0f;
    uint32_t word[2] = {0, 0};
    int qsum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int q = (int)rintf(__fmul_rn(v[i], inv));
        q = q > 127 ? 127 : (q < -127 ? -127 : q);
        qsum += q;
        word[i >> 2] |= (uint32_t)(q & 0xFF) << (8 * (i & 3));
    }
    qsum += warp_shfl_xor(qsum, 1);
    qsum += warp_shfl_xor(qsum, 2);
    *reinterpret_cast<uint2 *>(l.xq + t * l.kp + 32 * g + 8 * quad) = make_uint2(word[0], word[1]);
    if (quad == 0) {
        const float d = __fdiv_rn(amax, 127.0f);
        const float nan = __int_as_float(0x7FC00000);
        l.xd[g * l.tp + t] = bad != 0.0f ? make_float2(nan, nan) : make_float2(d, __fmul_rn(d, (float)qsum));
    }
}

}  // namespace mmp
