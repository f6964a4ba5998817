// f16 activations of the f16 prompt-row GEMM (cuda/matmul_prefill_f16.cu). Per row t of
// x [rows, k] f32:
//   amax = max |x[t, :]|, E with amax in [2^(E-1), 2^E), e = clamp(15 - E, -100, 100) (e = 0
//   when amax = 0): xh[t, :] = f16_rn(x[t, :] * 2^e) (|xh| <= 2^15, inside f16's 65,504, and
//   the row keeps f16's 11 bits whatever its scale), out_scale[t] = 2^-e (exact: the GEMM's
//   f32 output times it is the output of x itself). A row holding inf or NaN gets xh = 0 and
//   out_scale = NaN: its outputs become NaN, the other rows never see it.
// Values are stored per 32-value group in the mma's k order (the weight decode of
// matmul_prefill_f16.cu reads a group's values 4q..4q+3 and 16+4q..16+4q+3 in lane quad q):
// group position 16 s + p holds value 16 s + v(p), v(2q) = 4q, v(2q+1) = 4q+2,
// v(2q+8) = 4q+1, v(2q+9) = 4q+3 (q = 0..3, s = 0..1). Any fixed k order gives the same sum
// in exact arithmetic; this one lets the weight decode keep each byte word whole.
// Reference: luce/ref/matmul_prefill.py (scale_x_f16), bit for bit.
#pragma once

#include "common.cuh"
#include "mma_f16.cuh"
#include "pdl.cuh"

namespace mmh {

constexpr int kRowPad = 128;  // rows padded to a multiple of the largest token tile (tune 16)
constexpr int kChunk = 256;   // values per k step (a K-quant super-block)
constexpr int kExpLimit = 100;

// Workspace: xh [tp][kp] f16 (pad rows and values past k zero), then out_scale [tp] f32.
struct XhLayout {
    uint16_t *xh;
    float *out_scale;
    int64_t tp, kp, groups, chunks;
};

inline int64_t xh_padded_rows(int64_t rows) { return (rows + kRowPad - 1) / kRowPad * kRowPad; }

inline int64_t xh_bytes(int64_t rows, int64_t k) {
    const int64_t tp = xh_padded_rows(rows), kp = (k + kChunk - 1) / kChunk * kChunk;
    return tp * kp * 2 + tp * 4;
}

inline XhLayout xh_layout(void *ws, int64_t rows, int64_t k) {
    XhLayout l;
    l.tp = xh_padded_rows(rows);
    l.groups = k / 32;
    l.chunks = (k + kChunk - 1) / kChunk;
    l.kp = l.chunks * kChunk;
    l.xh = static_cast<uint16_t *>(ws);
    l.out_scale = reinterpret_cast<float *>(static_cast<uint8_t *>(ws) + l.tp * l.kp * 2);
    return l;
}

constexpr int kXhThreads = 128;

// One block per padded row: the row's amax (block reduction), then 16-value items (group g,
// half s) converted and stored as two 16-byte words.
__global__ void __launch_bounds__(kXhThreads) scale_x_f16_kernel(const float *x, int64_t rows, int64_t k, XhLayout l) {
    let_dependents_start();  // the GEMM may launch now; it waits for this kernel before reading xh
    __shared__ float partial[2][kXhThreads / WARP_SIZE];
    const int64_t t = blockIdx.x;
    uint16_t *dst = l.xh + t * l.kp;
    const int items = (int)(l.kp / 16);
    if (t >= rows) {
        for (int i = threadIdx.x; i < items; i += kXhThreads) {
            uint4 *w = reinterpret_cast<uint4 *>(dst + 16 * i);
            w[0] = make_uint4(0, 0, 0, 0);
            w[1] = make_uint4(0, 0, 0, 0);
        }
        if (threadIdx.x == 0) l.out_scale[t] = 0.0f;
        return;
    }
    const float *src = x + t * k;
    float amax = 0.0f, bad = 0.0f;
    for (int64_t i = threadIdx.x; i < k / 4; i += kXhThreads) {
        const float4 v = reinterpret_cast<const float4 *>(src)[i];
        const float m[4] = {fabsf(v.x), fabsf(v.y), fabsf(v.z), fabsf(v.w)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            amax = fmaxf(amax, m[j]);
            if (!(m[j] <= 3.0e38f)) bad = 1.0f;
        }
    }
    amax = warp_max(amax);
    bad = warp_max(bad);
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) partial[0][warp] = amax, partial[1][warp] = bad;
    __syncthreads();
    amax = 0.0f, bad = 0.0f;
    for (int w = 0; w < kXhThreads / WARP_SIZE; ++w) amax = fmaxf(amax, partial[0][w]), bad = fmaxf(bad, partial[1][w]);
    int e = 0;
    if (amax > 0.0f && bad == 0.0f) {
        const int E = (int)((__float_as_uint(amax) >> 23) & 0xFF) - 126;  // amax in [2^(E-1), 2^E) (normal)
        e = 15 - E;
        e = e > kExpLimit ? kExpLimit : (e < -kExpLimit ? -kExpLimit : e);
    }
    const float up = __uint_as_float((uint32_t)(e + 127) << 23);  // 2^e
    if (threadIdx.x == 0) l.out_scale[t] = bad != 0.0f ? __uint_as_float(0x7FC00000u) : __uint_as_float((uint32_t)(127 - e) << 23);
    for (int i = threadIdx.x; i < items; i += kXhThreads) {
        uint32_t word[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (i / 2 < l.groups && bad == 0.0f) {
            const float4 *p = reinterpret_cast<const float4 *>(src + 16 * (int64_t)i);
            float v[16];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 f = p[q];
                v[4 * q] = __fmul_rn(f.x, up), v[4 * q + 1] = __fmul_rn(f.y, up);
                v[4 * q + 2] = __fmul_rn(f.z, up), v[4 * q + 3] = __fmul_rn(f.w, up);
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                word[q] = tc::pack_f16x2(v[4 * q], v[4 * q + 2]);          // positions 2q, 2q + 1
                word[4 + q] = tc::pack_f16x2(v[4 * q + 1], v[4 * q + 3]);  // positions 2q + 8, 2q + 9
            }
        }
        uint4 *w = reinterpret_cast<uint4 *>(dst + 16 * i);
        w[0] = make_uint4(word[0], word[1], word[2], word[3]);
        w[1] = make_uint4(word[4], word[5], word[6], word[7]);
    }
}

// One accumulator of a warp's m16n8 C tile nt of m tile m (row row0 + grp (+ 8 for e >= 2), token
// t0 + 8 nt + 2 quad (+ 1 for odd e)) to y [rows, n]: y = acc * out_scale[token] (+ bias[row]),
// inside rows and n.
template <class Args>
__device__ __forceinline__ void store_element(float acc, const Args &a, int64_t row0, int64_t t0, int grp, int quad,
                                              int nt, int e) {
    const int64_t tok = t0 + 8 * nt + 2 * quad + (e & 1), row = row0 + grp + 8 * (e >> 1);
    if (tok >= a.rows || row >= a.n) return;
    float v = __fmul_rn(acc, a.x.out_scale[tok]);
    if (a.bias) v = v + a.bias[row];
    a.y[tok * a.n + row] = v;
}

// A warp's accumulators acc[m][nt] (m16n8 C tiles: rows row0[m] + grp (+ 8), tokens t0 + 8 nt
// + 2 quad (+ 1)) to y [rows, n] (store_element).
template <int kMT, int kNT, class Args>
__device__ __forceinline__ void store_tiles(const float (&acc)[kMT][kNT][4], const Args &a, const int64_t (&row0)[kMT],
                                            int64_t t0, int grp, int quad) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int m = 0; m < kMT; ++m) store_element(acc[m][nt][e], a, row0[m], t0, grp, quad, nt, e);
}

}  // namespace mmh
