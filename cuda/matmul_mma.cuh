// Integer tensor-core products and byte helpers for the quantized matmul (cuda/matmul.cu).
//
// Warp-level int8 products with int32 accumulation. Lane = 4 * grp + quad (grp 0..7, quad 0..3).
// Operands of one 32-value group (k = 32), "natural" order of the PTX fragment layouts:
//   A (weights, 16 rows x 32, s8): a[0] row grp, values 4*quad..+3; a[1] row grp + 8, same
//     values; a[2] row grp, values 16 + 4*quad..+3; a[3] row grp + 8, same.
//   B (activations, 32 x 8 tokens): b0 token grp, values 4*quad..+3; b1 values 16 + 4*quad..+3.
//   D (16 x 8, s32): d[0] (row grp, token 2*quad), d[1] (row grp, token 2*quad + 1),
//     d[2] (row grp + 8, token 2*quad), d[3] (row grp + 8, token 2*quad + 1).
// The k = 16 form takes a[0..1] / b0 for values 0..15 or a[2..3] / b1 for values 16..31.
// Integer sums are exact, so any summation order inside a product gives the same bits.
// HIP has no such instruction here: it gets a shuffle emulation (same results, slow).
#pragma once

#include "common.cuh"

// NVIDIA device code uses the byte-permute, dp4a and mma instructions; HIP and the host
// emulator (tests/kernels/emu, g++) take the portable forms below (same results).
#if defined(__HIPCC__) || !defined(__CUDA_ARCH__)
#define LUCE_MM_PORTABLE 1
#endif

// These layouts are a 32-lane warp's (grp = lane / 4 < 8): a 64-lane wave (GCN/CDNA,
// LUCE_WAVE64) would compute rows of the next tile. It needs its own hip/matmul.hip.
static_assert(WARP_SIZE == 32, "the quantized matmul's fragment layout is 32 lanes: a 64-lane wave "
                               "needs hip/matmul.hip (same ABI)");

namespace mm {

// Accumulator seed that makes an int32 sum v with |v| < 2^22 read as the float 1.5 * 2^23 + v.
constexpr int kMagicSeed = 0x4B400000;
constexpr float kMagicFloat = 12582912.0f;

__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef LUCE_MM_PORTABLE
    const uint64_t src = ((uint64_t)b << 32) | a;
    uint32_t out = 0;
    for (int i = 0; i < 4; ++i) out |= (uint32_t)((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return out;
#else
    return __byte_perm(a, b, sel);
#endif
}

// prmt.b32 of a selector whose nibbles 0..3 have bit 3 clear (no sign replication): bytes
// (sel >> 4i) & 7 of b:a, as byte_perm, without __byte_perm's masking of the selector.
__device__ __forceinline__ uint32_t prmt_clear(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef LUCE_MM_PORTABLE
    return byte_perm(a, b, sel);
#else
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
#endif
}

__device__ __forceinline__ uint32_t ld16(const uint8_t *p) {  // global, p 2-byte aligned
#ifdef LUCE_MM_PORTABLE
    return *reinterpret_cast<const unsigned short *>(p);
#else
    return __ldg(reinterpret_cast<const unsigned short *>(p));
#endif
}

// Loads from a shared-memory weight stage (cuda/matmul_stage.cuh).
__device__ __forceinline__ uint32_t lds32(const uint8_t *p) {  // p 4-byte aligned
    return *reinterpret_cast<const uint32_t *>(p);
}

__device__ __forceinline__ uint32_t lds16(const uint8_t *p) {  // p 2-byte aligned
    return *reinterpret_cast<const unsigned short *>(p);
}

__device__ __forceinline__ uint32_t lds32_a2(const uint8_t *p) {  // p 2-byte aligned
    return lds16(p) | (lds16(p + 2) << 16);
}

__device__ __forceinline__ float f16_to_f32(uint32_t bits) {
#if defined(__CUDACC__) || defined(__HIPCC__)
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xFFFF)));
#else  // the host emulator: exact (every f16 is an f32)
    const uint32_t e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
    const float s = (bits & 0x8000u) ? -1.0f : 1.0f;
    if (e == 0x1F) return m ? __uint_as_float(0x7FC00000u) : s * __uint_as_float(0x7F800000u);
    if (e == 0) return s * (float)m * __uint_as_float(0x33800000u);  // m 2^-24
    return s * __uint_as_float(((e + 112) << 23) | (m << 13));
#endif
}

// Exact float of 0 <= v < 2^23 without the (quarter-rate) integer-to-float unit.
__device__ __forceinline__ float small_uint_to_f32(uint32_t v) {
    return __int_as_float((int)(0x4B000000u | v)) - 8388608.0f;
}

// One thread's operands for one 32-value group of its two weight rows (r = 0: row grp,
// r = 1: row grp + 8). The group's contribution to y[row, t] is
//   sum over halves h of scale[h][r] * sum(q * x) + offset[h][r] * sum(x)
// where a type with 16-value sub-blocks (kHalves) has two halves, values 0..15 and 16..31.
struct GroupOperands {
    uint32_t a[4];
    float scale[2][2];
    float offset[2][2];
};

// Byte i of v.
__device__ __forceinline__ uint32_t byte_of(uint32_t v, int i) { return (v >> (8 * i)) & 0xFF; }

// Byte i (compile-time) of v in one instruction where there is a byte permute.
__device__ __forceinline__ uint32_t ubyte(uint32_t v, int i) {
#ifdef LUCE_MM_PORTABLE
    return byte_of(v, i);
#else
    return __byte_perm(v, 0, 0x4440 | i);
#endif
}

// Byte i (compile-time) of v as a signed int8.
__device__ __forceinline__ int sbyte(uint32_t v, int i) {
#ifdef LUCE_MM_PORTABLE
    return (int)(int8_t)byte_of(v, i);
#else
    int out;  // prmt: selector nibble bit 3 replicates the selected byte's sign
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(out) : "r"(v), "r"(i | ((8 | i) << 4) | ((8 | i) << 8) | ((8 | i) << 12)));
    return out;
#endif
}

// c + sum of the 4 byte products of a and b: unsigned bytes (dot4_u) or signed (dot4_s).
__device__ __forceinline__ int dot4_u(uint32_t a, uint32_t b, int c) {
#ifdef LUCE_MM_PORTABLE
    for (int i = 0; i < 4; ++i) c += (int)(byte_of(a, i) * byte_of(b, i));
    return c;
#else
    return (int)__dp4a(a, b, (unsigned)c);
#endif
}

__device__ __forceinline__ int dot4_s(uint32_t a, uint32_t b, int c) {
#ifdef LUCE_MM_PORTABLE
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)byte_of(a, i) * (int)(int8_t)byte_of(b, i);
    return c;
#else
    return __dp4a((int)a, (int)b, c);
#endif
}

// f32 of one group's exact dot product hi * 256 + lo (x = 256 * hi + lo): RN of the integer,
// the same bits whether the products were seeded with 0 (kMagic false) or kMagicSeed (true).
template <bool kMagic>
__device__ __forceinline__ float group_sum(int hi, int lo) {
    if (kMagic) {
        const float fh = __int_as_float(hi) - kMagicFloat, fl = __int_as_float(lo) - kMagicFloat;
        return fmaf(fh, 256.0f, fl);
    }
    return (float)(hi * 256 + lo);
}

#ifdef LUCE_MM_PORTABLE
template <bool kUnsignedB>
__device__ __forceinline__ int dot4(uint32_t a, uint32_t b) {
    int s = 0;
    for (int i = 0; i < 4; ++i) {
        const int av = (int)(int8_t)(a >> (8 * i));
        const int bv = kUnsignedB ? (int)((b >> (8 * i)) & 0xFF) : (int)(int8_t)(b >> (8 * i));
        s += av * bv;
    }
    return s;
}

__device__ __forceinline__ uint32_t lane_value(uint32_t v, int src) { return (uint32_t)warp_shfl((int)v, src); }

// d = A x B + seed over the values whose a/b registers are given (k = 16 uses one pair).
template <bool kUnsignedB, int kPairs>
__device__ __forceinline__ void mma_emulated(const uint32_t *a_lo, const uint32_t *a_hi,
                                             uint32_t b0, uint32_t b1, int seed, int d[4]) {
    const int lane = threadIdx.x % WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    for (int e = 0; e < 4; ++e) d[e] = seed;
    for (int q = 0; q < 4; ++q) {
        const uint32_t r0 = lane_value(a_lo[0], 4 * grp + q), r1 = lane_value(a_lo[1], 4 * grp + q);
        const uint32_t x0 = lane_value(b0, 8 * quad + q), x1 = lane_value(b0, 8 * quad + 4 + q);
        d[0] += dot4<kUnsignedB>(r0, x0); d[1] += dot4<kUnsignedB>(r0, x1);
        d[2] += dot4<kUnsignedB>(r1, x0); d[3] += dot4<kUnsignedB>(r1, x1);
        if (kPairs == 2) {
            const uint32_t s0 = lane_value(a_hi[0], 4 * grp + q), s1 = lane_value(a_hi[1], 4 * grp + q);
            const uint32_t y0 = lane_value(b1, 8 * quad + q), y1 = lane_value(b1, 8 * quad + 4 + q);
            d[0] += dot4<kUnsignedB>(s0, y0); d[1] += dot4<kUnsignedB>(s0, y1);
            d[2] += dot4<kUnsignedB>(s1, y0); d[3] += dot4<kUnsignedB>(s1, y1);
        }
    }
}
#endif

// k = 32: d = A x B + seed; B signed (kUnsignedB false: high bytes of x) or unsigned (low bytes).
template <bool kUnsignedB>
__device__ __forceinline__ void mma_k32(const uint32_t a[4], uint32_t b0, uint32_t b1, int seed,
                                        int d[4]) {
#ifdef LUCE_MM_PORTABLE
    const uint32_t lo[2] = {a[0], a[1]}, hi[2] = {a[2], a[3]};
    mma_emulated<kUnsignedB, 2>(lo, hi, b0, b1, seed, d);
#else
    if (kUnsignedB) {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(seed));
    } else {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(seed));
    }
#endif
}

// k = 32 onto an accumulator: d = A x B + c (element-wise; exact, as every integer sum here).
template <bool kUnsignedB>
__device__ __forceinline__ void mma_k32_acc(const uint32_t a[4], uint32_t b0, uint32_t b1, const int c[4],
                                            int d[4]) {
#ifdef LUCE_MM_PORTABLE
    int t[4];
    mma_k32<kUnsignedB>(a, b0, b1, 0, t);
    for (int e = 0; e < 4; ++e) d[e] = c[e] + t[e];
#else
    if (kUnsignedB) {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]),
                       "r"(c[2]), "r"(c[3]));
    } else {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]),
                       "r"(c[2]), "r"(c[3]));
    }
#endif
}

// k = 16 over a0 (row grp) / a1 (row grp + 8) and b (token grp), 4 values per lane.
template <bool kUnsignedB>
__device__ __forceinline__ void mma_k16(uint32_t a0, uint32_t a1, uint32_t b, int seed, int d[4]) {
#ifdef LUCE_MM_PORTABLE
    const uint32_t lo[2] = {a0, a1};
    mma_emulated<kUnsignedB, 1>(lo, lo, b, b, seed, d);
#else
    if (kUnsignedB) {
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, "
                     "{%4,%5}, {%6}, {%7,%7,%7,%7};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a0), "r"(a1), "r"(b), "r"(seed));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                     "{%4,%5}, {%6}, {%7,%7,%7,%7};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a0), "r"(a1), "r"(b), "r"(seed));
    }
#endif
}

}  // namespace mm
