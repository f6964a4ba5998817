// Activation quantization for the quantized matmul (cuda/matmul.cu): x [rows, k] f32 to
// 16-bit integers per row and 256-value chunk, in the mma B layout (matmul_mma.cuh), plus
// the float and integer sums the offset terms of the weight types need.
#pragma once

#include "matmul_mma.cuh"
#include "pdl.cuh"

namespace mm {

constexpr int kGroups = 8;  // 32-value groups per 256-value chunk

// Groups of chunk c of a row of `groups` 32-value groups: kGroups but in a last partial chunk (Q8_0,
// Q5_0 at k not a multiple of 256). I: int or int64_t, as the caller counts.
template <class I>
__host__ __device__ __forceinline__ I groups_in_chunk(I groups, I c) {
    return groups - c * kGroups < kGroups ? groups - c * kGroups : (I)kGroups;
}
constexpr float kQMax = 32767.0f;

// Quantized x in the workspace, rows padded to tp (a multiple of 8; pad rows are zero).
struct XLayout {
    uint4 *xq;     // [tp][groups][4 quads]: {high bytes of values 4q.., of 16+4q.., low bytes ..}
    float *xd;     // [chunks][tp]: scale of the chunk's integers
    float4 *xs;    // [groups][tp / 2]: {S0[t], S0[t+1], S1[t], S1[t+1]}, sums of values 0..15, 16..31
    uint4 *xqp;    // [chunks][tp][2]: byte planes of the 8 group sums of integers (x_planes)
    int64_t tp, groups, chunks;
};

// A token's 8 group sums s_j of a chunk (|s_j| <= 32 * 32767 < 2^20) as byte planes, so
// that sum_j m_j * s_j of unsigned bytes m_j is 6 four-way byte dot products:
//   words {P0 j0..3, P0 j4..7, P1 .., P1 .., P2 .., P2 .., 0, 0}; byte j & 3 of the words
//   j >> 2: P0 = s_j & 255, P1 = (s_j >> 8) & 255 (unsigned), P2 = s_j >> 16 (signed),
//   s_j = 65536 * P2 + 256 * P1 + P0.

inline int64_t padded_rows(int64_t rows) { return (rows + 7) / 8 * 8; }

inline int64_t x_bytes(int64_t rows, int64_t k) {
    const int64_t tp = padded_rows(rows), groups = (k + 31) / 32, chunks = (k + 255) / 256;
    return tp * (64 * groups + 4 * chunks + 8 * groups + 32 * chunks);  // xq, xd, xs, xqp
}

inline XLayout x_layout(void *ws, int64_t rows, int64_t k) {
    XLayout l;
    l.tp = padded_rows(rows);
    l.groups = k / 32;
    l.chunks = (k + 255) / 256;
    uint8_t *p = static_cast<uint8_t *>(ws);
    l.xq = reinterpret_cast<uint4 *>(p);
    p += l.tp * l.groups * 64;
    l.xd = reinterpret_cast<float *>(p);
    p += l.chunks * l.tp * 4;
    l.xs = reinterpret_cast<float4 *>(p);
    p += l.groups * l.tp * 8;
    l.xqp = reinterpret_cast<uint4 *>(p);
    return l;
}

// The factor quantize_x_values multiplies a chunk's values by: kQMax / amax, 0 for a chunk of
// zeros or one holding inf or NaN (`bad`).
__device__ __forceinline__ float x_quant_factor(float amax, bool bad) {
    return (!bad && amax > 0.0f) ? kQMax / amax : 0.0f;
}

// The chunk's scale (xd): amax / kQMax, NaN for a chunk holding inf or NaN (its outputs NaN).
__device__ __forceinline__ float x_chunk_scale(float amax, bool bad) {
    return bad ? __int_as_float(0x7FC00000) : amax / kQMax;
}

// One unit of 8 values (values 4q..4q+3 and 16+4q..16+4q+3 of a group: quad q) as its word of
// xq, {high bytes of v[0..3], of v[4..7], low bytes of v[0..3], of v[4..7]}; qsum += their
// integers. The one rounding of x: rintf(v * inv) clamped to +-32767.
__device__ __forceinline__ uint4 x_unit_word(const float v[8], float inv, int &qsum) {
    uint32_t hi[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int q = (int)rintf(__fmul_rn(v[i], inv));
        q = q > 32767 ? 32767 : (q < -32767 ? -32767 : q);
        qsum += q;
        hi[i >> 2] |= (uint32_t)((q >> 8) & 0xFF) << (8 * (i & 3));
        lo[i >> 2] |= (uint32_t)(q & 0xFF) << (8 * (i & 3));
    }
    return make_uint4(hi[0], hi[1], lo[0], lo[1]);
}

// A unit's two float partial sums: (v0 + v1) + (v2 + v3) (of values 4q..) and (v4 + v5) +
// (v6 + v7) (of 16 + 4q..); a group's S0 / S1 are ((p0 + p1) + (p2 + p3)) over its quads.
__device__ __forceinline__ float x_unit_sum0(const float v[8]) { return (v[0] + v[1]) + (v[2] + v[3]); }
__device__ __forceinline__ float x_unit_sum1(const float v[8]) { return (v[4] + v[5]) + (v[6] + v[7]); }

// Quantizes values v[8] of token t, chunk ch (lane = 4 * group + quad holds values 4q..4q+3
// and 16+4q..16+4q+3 of group ch * 8 + group; zeros past the row or on padding rows) into l.
// Called by one whole warp. Shared by quantize_x_kernel and the fused producers of the
// matmul's input (cuda/norm_quant.cu), which therefore quantize bitwise alike.
__device__ __forceinline__ void quantize_x_values(float v[8], const XLayout &l, int64_t t, int64_t ch) {
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3, j = lane >> 2;
    const int64_t g = ch * kGroups + j;
    float amax = 0.0f, bad = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float m = fabsf(v[i]);
        amax = fmaxf(amax, m);
        if (!(m <= 3.0e38f)) bad = 1.0f;  // inf or NaN: the chunk's outputs become NaN
    }
    amax = warp_max(amax);
    bad = warp_max(bad);
    const float inv = x_quant_factor(amax, bad != 0.0f);
    int qsum = 0;
    const uint4 word = x_unit_word(v, inv, qsum);
    float s0 = x_unit_sum0(v), s1 = x_unit_sum1(v);
    s0 = s0 + warp_shfl_xor(s0, 1);
    s0 = s0 + warp_shfl_xor(s0, 2);
    s1 = s1 + warp_shfl_xor(s1, 1);
    s1 = s1 + warp_shfl_xor(s1, 2);
    qsum += warp_shfl_xor(qsum, 1);
    qsum += warp_shfl_xor(qsum, 2);
    if (g >= l.groups) qsum = 0;
    const int at = 8 * (j & 3);  // byte of group j in its plane words
    uint32_t p0 = (uint32_t)(qsum & 0xFF) << at, p1 = (uint32_t)((qsum >> 8) & 0xFF) << at,
             p2 = (uint32_t)((qsum >> 16) & 0xFF) << at;
#pragma unroll
    for (int m = 4; m <= 8; m <<= 1) {  // lanes of groups 0..3 and of 4..7 (lane bits 2, 3)
        p0 |= warp_shfl_xor(p0, m);
        p1 |= warp_shfl_xor(p1, m);
        p2 |= warp_shfl_xor(p2, m);
    }
    if (g < l.groups) {
        l.xq[(t * l.groups + g) * 4 + quad] = word;
        if (quad == 0) {
            float *s = reinterpret_cast<float *>(l.xs + g * (l.tp / 2) + t / 2);
            s[t & 1] = s0;
            s[2 + (t & 1)] = s1;
        }
    }
    if (lane == 0) l.xd[ch * l.tp + t] = x_chunk_scale(amax, bad != 0.0f);
    if (quad == 0 && (j & 3) == 0) {  // groups 0..3 / 4..7: words 0, 2, 4 / 1, 3, 5
        uint32_t *w = reinterpret_cast<uint32_t *>(l.xqp + (ch * l.tp + t) * 2) + (j >> 2);
        w[0] = p0;
        w[2] = p1;
        w[4] = p2;
        w[6] = 0;
    }
}

// A whole warp quantizes chunk ch of token t from its f32 row x_row (16-byte aligned; live false:
// a padding row, zeros) into l; lane = 4 * group + quad loads values 4q..4q+3 and 16+4q..16+4q+3.
// kCoherent: the row was written by other blocks of this launch (load_coherent), else read-only.
template <bool kCoherent>
__device__ __forceinline__ void quantize_x_row_chunk(const float *x_row, bool live, const XLayout &l, int64_t t,
                                                     int64_t ch) {
    const int quad = threadIdx.x % 4, j = (threadIdx.x % WARP_SIZE) >> 2;
    const int64_t g = ch * kGroups + j;
    float v[8] = {};
    if (live && g < l.groups) {
        const float *src = x_row + 32 * g + 4 * quad;
        if constexpr (kCoherent) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                v[i] = load_coherent(src + i);
                v[4 + i] = load_coherent(src + 16 + i);
            }
        } else {
            const float4 a = __ldg(reinterpret_cast<const float4 *>(src));
            const float4 b = __ldg(reinterpret_cast<const float4 *>(src + 16));
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        }
    }
    quantize_x_values(v, l, t, ch);
}

// One warp per (row, chunk).
static __global__ void __launch_bounds__(256) quantize_x_kernel(const float *x, int64_t rows, int64_t k,
                                                                XLayout l) {
    wait_for_prior_kernels();  // x comes from the kernel ahead
    let_dependents_start();    // the matmul may launch now; it waits for this kernel before reading x
    const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    if (item >= l.tp * l.chunks) return;  // whole warps
    const int64_t t = item / l.chunks, ch = item % l.chunks;
    quantize_x_row_chunk<false>(x + t * k, t < rows, l, t, ch);
}

}  // namespace mm
