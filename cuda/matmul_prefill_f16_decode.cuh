// Weight decode of the f16 prompt-row GEMM (cuda/matmul_prefill_f16.cu): one 32-value group
// of a warp's 16 weight rows (the readers of matmul_kquants.cuh / matmul_blocks.cuh) to the
// A fragments of two m16n8k16 products, as f16. Per value, with the group's (or Q6_K's
// 16-value half's) f32 scale and offset of the reader:
//   s = f16_rn(scale), o = f16_rn(offset)         (scale = d * sc, offset = -dmin * m: exact in f32)
//   w = f16_rn(q * s + o)                         (one rounding; w = f16_rn(q * s) without offset)
// q the reader's small integer (unsigned with an offset: Q4_K, Q5_K, Q5_0; signed: Q6_K,
// IQ4_XS, Q8_0). Q8_0 / Q5_0 scales are f16 already (s = d exactly, o = -16 d).
// Reference: luce/ref/matmul_prefill.py (decode_f16), bit for bit.
//
// Lane quad q holds the group's values 4q..4q+3 (byte word a[r]) and 16+4q..16+4q+3 (a[2+r])
// of rows grp (r = 0) and grp + 8 (r = 1). Product s = 0 takes values 0..15, s = 1 16..31,
// in the k order of matmul_prefill_xh.cuh: fragment word a0 (positions 2q, 2q+1) = values
// (4q, 4q+2), a2 (positions 2q+8, 2q+9) = (4q+1, 4q+3): bytes 0, 2 and 1, 3 of one word.
// Cost per byte word (4 values): 2 byte permutes into f16 1024 + byte, 2 exact subtractions,
// 2 multiplies or fmas (pairs), plus an xor for signed bytes.
#pragma once

#include "matmul_kquants.cuh"
#include "matmul_blocks.cuh"
#include "matmul_stage.cuh"
#include "mma_f16.cuh"

namespace mmh {

using namespace mm;

// f16 pair arithmetic of the weight decode (an f16 pair is one 32-bit word, element 0 in the
// low half): IEEE f16 with one rounding to nearest even per operation on every target (PTX
// .rn; HIP's _Float16 pairs; the host form rounds the exact double result).
#if !defined(LUCE_MMA_F16_NATIVE) && !defined(LUCE_MMA_F16_HIP)
// f16 bits of a double, round to nearest even (inf past the range, NaN stays NaN).
__host__ __device__ inline uint32_t f16_bits(double v) {
    if (v != v) return 0x7E00u;
    const uint32_t sign = v < 0 ? 0x8000u : 0u;
    const double a = v < 0 ? -v : v;
    if (a == 0.0) return sign;
    if (a >= 65520.0) return sign | 0x7C00u;
    int e = 0;
    frexp(a, &e);                                      // a in [2^(e-1), 2^e)
    int ulp = (e - 1 < -14 ? -14 : e - 1) - 10;        // the f16 step at a: 2^ulp
    double r = rint(ldexp(a, -ulp));                   // a in steps, to nearest even
    if (r < 1024.0) return sign | (uint32_t)r;         // subnormal (ulp = -24)
    if (r >= 2048.0) r *= 0.5, ++ulp;                  // rounded up into the next binade
    const int field = ulp + 25;
    if (field >= 31) return sign | 0x7C00u;
    return sign | ((uint32_t)field << 10) | ((uint32_t)r - 1024u);
}

__host__ __device__ inline double f16_value(uint32_t bits) {
    const uint32_t e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
    const double s = (bits & 0x8000u) ? -1.0 : 1.0;
    if (e == 0x1F) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp((double)m, -24);
    return s * ldexp((double)(m | 0x400u), (int)e - 25);
}

__host__ __device__ inline uint32_t h2_pack(double lo, double hi) { return f16_bits(lo) | (f16_bits(hi) << 16); }
#endif

// The f16 pair {v, v} of an f32 (round to nearest even).
__device__ __forceinline__ uint32_t h2_dup(float v) { return tc::pack_f16x2(v, v); }

// a - b, a * b, a * b + c per half.
__device__ __forceinline__ uint32_t h2_sub(uint32_t a, uint32_t b) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#elif defined(LUCE_MMA_F16_HIP)
    return tc::as_word(tc::as_pair(a) - tc::as_pair(b));
#else
    return h2_pack(f16_value(a & 0xFFFF) - f16_value(b & 0xFFFF), f16_value(a >> 16) - f16_value(b >> 16));
#endif
}

__device__ __forceinline__ uint32_t h2_mul(uint32_t a, uint32_t b) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#elif defined(LUCE_MMA_F16_HIP)
    return tc::as_word(tc::as_pair(a) * tc::as_pair(b));
#else
    return h2_pack(f16_value(a & 0xFFFF) * f16_value(b & 0xFFFF), f16_value(a >> 16) * f16_value(b >> 16));
#endif
}

__device__ __forceinline__ uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#elif defined(LUCE_MMA_F16_HIP)
    return tc::as_word(__builtin_elementwise_fma(tc::as_pair(a), tc::as_pair(b), tc::as_pair(c)));
#else  // products of f16 are exact in double; the sums here (weights) stay within its 53 bits
    return h2_pack(f16_value(a & 0xFFFF) * f16_value(b & 0xFFFF) + f16_value(c & 0xFFFF),
                   f16_value(a >> 16) * f16_value(b >> 16) + f16_value(c >> 16));
#endif
}

constexpr uint32_t kMagic1024 = 0x64006400u;  // f16 pair {1024, 1024}
constexpr uint32_t kMagic1152 = 0x64806480u;  // f16 pair {1152, 1152}: 1024 + 128 (signed bytes)

// Bytes (0, 2) and (1, 3) of a word of small integers -> f16 pairs of the integers.
template <bool kSigned>
__device__ __forceinline__ void bytes_to_h2(uint32_t w, uint32_t &even, uint32_t &odd) {
    if (kSigned) w ^= 0x80808080u;  // q + 128 in 0..255
    const uint32_t m02 = byte_perm(w, 0x64646464u, 0x4240), m13 = byte_perm(w, 0x64646464u, 0x4341);
    even = h2_sub(m02, kSigned ? kMagic1152 : kMagic1024);
    odd = h2_sub(m13, kSigned ? kMagic1152 : kMagic1024);
}

// Group j of reader rd -> a[s][0..3]: the A fragments of products s = 0, 1.
template <class Q>
__device__ __forceinline__ void decode_group_f16(const Q &rd, int j, int quad, uint32_t a[2][4]) {
    uint32_t q[4], s[2][2], o[2];
    if constexpr (Q::kIntScale) {
        rd.weights(j, quad, q);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            s[0][r] = h2_dup(__fmul_rn(rd.d[r], (float)rd.scale(j, 0, r)));
            s[1][r] = Q::kHalves ? h2_dup(__fmul_rn(rd.d[r], (float)rd.scale(j, 1, r))) : s[0][r];
            if constexpr (Q::kOffset) o[r] = h2_dup(__fmul_rn(rd.negmin[r], (float)ubyte(rd.mn[r][j >> 2], j & 3)));
            else o[r] = 0;
        }
    } else {
        GroupOperands op;
        rd.group(j, quad, op);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            q[r] = op.a[r];
            q[2 + r] = op.a[2 + r];
            s[0][r] = s[1][r] = h2_dup(op.scale[0][r]);
            o[r] = Q::kOffset ? h2_dup(op.offset[0][r]) : 0;
        }
    }
#pragma unroll
    for (int step = 0; step < 2; ++step)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            uint32_t even, odd;
            bytes_to_h2<!Q::kOffset>(q[2 * step + r], even, odd);
            if constexpr (Q::kOffset) {
                a[step][r] = h2_fma(even, s[step][r], o[r]);
                a[step][2 + r] = h2_fma(odd, s[step][r], o[r]);
            } else {
                a[step][r] = h2_mul(even, s[step][r]);
                a[step][2 + r] = h2_mul(odd, s[step][r]);
            }
        }
}

// The readers of chunk ch of a warp's kMT m tiles from their staged weights: stage(m) is m
// tile m's stage, wrow[m][r] its global rows grp and grp + 8. Returns the chunk's groups (8, or
// fewer in the last chunk of a 32-value type whose k is not whole chunks).
template <class Q, int kMT, class StageOf>
__device__ __forceinline__ int load_chunk(Q (&rd)[kMT], StageOf stage, const uint8_t *const (&wrow)[kMT][2],
                                          int64_t groups, int64_t ch, int grp, int quad) {
    const int ng = Q::kGroupBytes && groups - ch * 8 < 8 ? (int)(groups - ch * 8) : 8;
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
        const uint8_t *st = stage(m);
        rd[m].load(staged_row<Q>(st, grp, wrow[m][0] + ch * Q::kChunkBytes),
                   staged_row<Q>(st, grp + 8, wrow[m][1] + ch * Q::kChunkBytes), quad, ng);
    }
    return ng;
}

}  // namespace mmh
