// f16 tensor-core pieces of the prompt-row attention (cuda/attention_prefill_f16.cuh): one warp
// computes C[16 x 8] += A[16 x 16] B[16 x 8] with f16 operands and f32 accumulation
// (mma.sync m16n8k16), fragments come from shared memory through ldmatrix, and f32 values
// become f16 with round to nearest even. Reference of the roundings: luce/ref/attention_prefill.py.
//
// Lane = 4 * g + t (g 0..7, t 0..3); a register holds two f16 (low half: the lower index).
// The PTX m16n8k16 .row.col f16 fragment layouts:
//   A: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   B: b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]
//   C: c[0] = C[g][2t], c[1] = C[g][2t + 1], c[2] = C[g + 8][2t], c[3] = C[g + 8][2t + 1]
// ldmatrix .x4: lanes 8i..8i+7 name the 8 rows (16 bytes each) of 8 x 8 matrix i; register i
// of lane 4g + t gets row g, columns 2t, 2t+1 of matrix i (.trans: rows 2t, 2t+1 of column g).
// NVIDIA sm_80+ runs the instructions; elsewhere (HIP, the host emulator tests/kernels/emu)
// shuffle forms move the same values and the product is an fmaf chain over k = 0..15, C first
// (an f16 x f16 product is exact in f32). Both are fixed functions of the operands, so a row's
// bits never depend on what else shares the warp's other rows.
#pragma once

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIPCC__)
#define LUCE_MMA_F16_NATIVE 1
#endif

namespace tc {

// f32 -> f16 bits, round to nearest even, overflow to inf (as PTX cvt.rn.f16.f32).
__device__ __forceinline__ uint32_t f16_bits_rn(float f) {
    const uint32_t x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;                      // NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00u;                     // >= 65520: inf
    if (ax >= 0x38800000u) {                                          // normal f16 (>= 2^-14)
        const uint32_t r = ax - 0x38000000u, h = r >> 13, rem = r & 0x1fffu;
        return sign | (h + (rem > 0x1000u || (rem == 0x1000u && (h & 1u))));
    }
    if (ax < 0x33000000u) return sign;                                // < 2^-25: zero
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - (ax >> 23);  // subnormal
    const uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return sign | (h + (rem > half || (rem == half && (h & 1u))));
}

__device__ __forceinline__ float f16_bits_to_float(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 5.9604644775390625e-8f));  // m 2^-24
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

// Two f32 -> one register of two f16 (lo in the low half), each rounded to nearest even.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return f16_bits_rn(lo) | (f16_bits_rn(hi) << 16);
#endif
}

// 2^x for the online softmax (x <= 0 or -inf): the MUFU approximation on NVIDIA, exp2f elsewhere.
__device__ __forceinline__ float exp2_softmax(float x) {
#ifdef LUCE_MMA_F16_NATIVE
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// Four 8 x 8 f16 matrices from shared memory: this lane names row (lane % 8) of matrix
// lane / 8 at base + row_off (halves; 16-byte aligned); base is the same in every lane.
__device__ __forceinline__ void ldmatrix_x4(const uint16_t *base, int32_t row_off, uint32_t r[4]) {
#ifdef LUCE_MMA_F16_NATIVE
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(base + row_off);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#else
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int32_t row = warp_shfl(row_off, 8 * i + g);
        r[i] = *reinterpret_cast<const uint32_t *>(base + row + 2 * t);
    }
#endif
}

// As ldmatrix_x4, each matrix transposed: register i gets rows 2t, 2t + 1 of column g.
__device__ __forceinline__ void ldmatrix_x4_trans(const uint16_t *base, int32_t row_off, uint32_t r[4]) {
#ifdef LUCE_MMA_F16_NATIVE
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(base + row_off);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#else
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int32_t row0 = warp_shfl(row_off, 8 * i + 2 * t), row1 = warp_shfl(row_off, 8 * i + 2 * t + 1);
        r[i] = (uint32_t)base[row0 + g] | ((uint32_t)base[row1 + g] << 16);
    }
#endif
}

__device__ __forceinline__ void mma_f16_16x8x16(float *c, const uint32_t *a, const uint32_t *b) {
#ifdef LUCE_MMA_F16_NATIVE
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    static_assert(WARP_SIZE == 32, "the m16n8k16 fragments are 32 lanes");
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    uint32_t ar[2][8], bc[2][8];  // A rows g, g + 8 and B columns 2t, 2t + 1: k pairs 2u, 2u + 1 (u 0..7)
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int la = 4 * g + u, lb0 = 4 * (2 * t) + u, lb1 = lb0 + 4;
        ar[0][u] = warp_shfl(a[0], la);
        ar[1][u] = warp_shfl(a[1], la);
        ar[0][u + 4] = warp_shfl(a[2], la);
        ar[1][u + 4] = warp_shfl(a[3], la);
        bc[0][u] = warp_shfl(b[0], lb0);
        bc[0][u + 4] = warp_shfl(b[1], lb0);
        bc[1][u] = warp_shfl(b[0], lb1);
        bc[1][u + 4] = warp_shfl(b[1], lb1);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float d = c[i];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const uint32_t x = ar[i >> 1][u], y = bc[i & 1][u];
            d = fmaf(f16_bits_to_float(x & 0xffffu), f16_bits_to_float(y & 0xffffu), d);
            d = fmaf(f16_bits_to_float(x >> 16), f16_bits_to_float(y >> 16), d);
        }
        c[i] = d;
    }
#endif
}

}  // namespace tc
