// f16 tensor-core product of the f16 prompt-row kernels: one warp computes C[16 x 8] +=
// A[16 x 16] B[16 x 8] with f16 operands and f32 accumulation (mma.sync m16n8k16), its
// fragments from shared memory through ldmatrix, and f32 -> f16 rounding to nearest even.
// Users: the f16 prompt-row attention (cuda/attention_prefill_f16.cuh: ldmatrix_x4 and
// ldmatrix_x4_trans, mma_f16_16x8x16, pack_f16x2) and the f16 prompt-row GEMM
// (cuda/matmul_prefill_f16.cu: ldmatrix_x4, mma_f16_16x8x16; cuda/matmul_prefill_xh.cuh:
// pack_f16x2; its f16 pair arithmetic h2_* sits in cuda/matmul_prefill_f16_decode.cuh).
// References of the roundings: luce/ref/attention_prefill.py, luce/ref/matmul_prefill.py.
//
// Lane = 4 * g + t (g 0..7, t 0..3); a register holds two f16 (low half: the lower index).
// The PTX m16n8k16 .row.col f16 fragment layouts:
//   A: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   B: b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C: c[0] = C[g][2t], c[1] = C[g][2t + 1], c[2] = C[g + 8][2t], c[3] = C[g + 8][2t + 1]
// ldmatrix .x4: lanes 8i..8i+7 name the 8 rows (16 bytes each) of 8 x 8 matrix i; register i
// of lane 4g + t gets row g, columns 2t, 2t+1 of matrix i (.trans: rows 2t, 2t+1 of column g).
// NVIDIA sm_80+ runs the instructions; elsewhere the same values move by shuffles (HIP) or
// through a per-warp exchange in memory (the host emulator tests/kernels/emu: the same
// arithmetic, two warp barriers an operation instead of two per shuffled word), and the
// product is an fmaf chain over k = 0..15, C first (an f16 x f16 product is exact in f32).
// Both are fixed functions of the operands, so an output's bits never depend on the other
// rows and columns of the warp's tile.
#pragma once

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIPCC__)
#define LUCE_MMA_F16_NATIVE 1
#elif defined(__HIPCC__)
#define LUCE_MMA_F16_HIP 1   // AMD: native f16 conversions, shuffle forms of ldmatrix and the mma
#elif !defined(__CUDACC__)
#define LUCE_MMA_F16_HOST 1  // the host emulator: fragments meet in a per-warp exchange, not shuffles
#endif

namespace tc {

#ifdef LUCE_MMA_F16_HOST
// Per-warp exchange of the host emulator (its threads share statics; a block's warps run at once
// on one host thread): lane l's fragment words at [warp][l][0..5], its ldmatrix row address at
// [warp][l][6..7].
inline uint32_t (&host_exchange())[1024 / WARP_SIZE][WARP_SIZE][8] {
    static uint32_t words[1024 / WARP_SIZE][WARP_SIZE][8];
    return words;
}
#endif

#ifdef LUCE_MMA_F16_HIP
typedef _Float16 half_pair __attribute__((ext_vector_type(2)));
__device__ __forceinline__ half_pair as_pair(uint32_t v) { return __builtin_bit_cast(half_pair, v); }
__device__ __forceinline__ uint32_t as_word(half_pair v) { return __builtin_bit_cast(uint32_t, v); }
#endif

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

// f16 bits -> f32 (exact).
__device__ __forceinline__ float f16_bits_to_float(uint32_t h) {
#ifdef LUCE_MMA_F16_HIP
    return (float)__builtin_bit_cast(_Float16, (unsigned short)h);
#else
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 5.9604644775390625e-8f));  // m 2^-24
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

// Two f32 -> one register of two f16 (lo in the low half), each rounded to nearest even.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#elif defined(LUCE_MMA_F16_HIP)
    return as_word(half_pair{(_Float16)lo, (_Float16)hi});
#else
    return f16_bits_rn(lo) | (f16_bits_rn(hi) << 16);
#endif
}

// Four 8 x 8 f16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 (16-byte aligned); r[i] receives matrix i's elements (row g, columns 2t, 2t + 1) of lane 4 g + t.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *row_addr) {
#ifdef LUCE_MMA_F16_NATIVE
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(row_addr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#elif defined(LUCE_MMA_F16_HOST)
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    uint32_t (&x)[WARP_SIZE][8] = host_exchange()[threadIdx.x / WARP_SIZE];
    const uint64_t mine = (uint64_t)reinterpret_cast<uintptr_t>(row_addr);
    x[lane][6] = (uint32_t)mine, x[lane][7] = (uint32_t)(mine >> 32);
    __syncwarp();
    for (int i = 0; i < 4; ++i) {
        const uint64_t at = ((uint64_t)x[8 * i + g][7] << 32) | x[8 * i + g][6];
        r[i] = *reinterpret_cast<const uint32_t *>(reinterpret_cast<const uint8_t *>((uintptr_t)at) + 4 * t);
    }
    __syncwarp();
#else  // every lane's row address, then each lane reads its own 4 bytes of each matrix
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    const uint64_t mine = (uint64_t)reinterpret_cast<uintptr_t>(row_addr);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t lo = warp_shfl((uint32_t)mine, 8 * i + g), hi = warp_shfl((uint32_t)(mine >> 32), 8 * i + g);
        const uint8_t *row = reinterpret_cast<const uint8_t *>((uintptr_t)(((uint64_t)hi << 32) | lo));
        r[i] = *reinterpret_cast<const uint32_t *>(row + 4 * t);
    }
#endif
}

// As ldmatrix_x4, each matrix transposed: register i gets rows 2t, 2t + 1 of column g.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *row_addr) {
#ifdef LUCE_MMA_F16_NATIVE
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(row_addr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#else
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#ifdef LUCE_MMA_F16_HOST
    uint32_t (&x)[WARP_SIZE][8] = host_exchange()[threadIdx.x / WARP_SIZE];
    const uint64_t mine = (uint64_t)reinterpret_cast<uintptr_t>(row_addr);
    x[lane][6] = (uint32_t)mine, x[lane][7] = (uint32_t)(mine >> 32);
    __syncwarp();
    auto row = [&](int src) {
        return reinterpret_cast<const uint16_t *>((uintptr_t)(((uint64_t)x[src][7] << 32) | x[src][6]));
    };
#else
    const uint64_t mine = (uint64_t)reinterpret_cast<uintptr_t>(row_addr);
    auto row = [&](int src) {
        const uint32_t lo = warp_shfl((uint32_t)mine, src), hi = warp_shfl((uint32_t)(mine >> 32), src);
        return reinterpret_cast<const uint16_t *>((uintptr_t)(((uint64_t)hi << 32) | lo));
    };
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint16_t *row0 = row(8 * i + 2 * t), *row1 = row(8 * i + 2 * t + 1);
        r[i] = (uint32_t)row0[g] | ((uint32_t)row1[g] << 16);
    }
#ifdef LUCE_MMA_F16_HOST
    __syncwarp();
#endif
#endif
}

// c += A B (fragments as in the header).
__device__ __forceinline__ void mma_f16_16x8x16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#ifdef LUCE_MMA_F16_NATIVE
    asm(  // a pure function of its registers: not volatile, so the compiler may schedule it
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    static_assert(WARP_SIZE == 32, "the m16n8k16 fragments are 32 lanes");
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    float ar[2][16], bc[2][16];  // A rows g, g + 8 and B columns 2t, 2t + 1 over k = 0..15
#ifdef LUCE_MMA_F16_HOST
    uint32_t (&x)[WARP_SIZE][8] = host_exchange()[threadIdx.x / WARP_SIZE];
    for (int i = 0; i < 4; ++i) x[lane][i] = a[i];
    x[lane][4] = b0, x[lane][5] = b1;
    __syncwarp();
    auto lane_word = [&](uint32_t, int src, int slot) { return x[src][slot]; };
#else
    auto lane_word = [](uint32_t v, int src, int) { return warp_shfl(v, src); };
#endif
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint32_t a0 = lane_word(a[0], 4 * g + q, 0), a1 = lane_word(a[1], 4 * g + q, 1);
        const uint32_t a2 = lane_word(a[2], 4 * g + q, 2), a3 = lane_word(a[3], 4 * g + q, 3);
        ar[0][2 * q] = f16_bits_to_float(a0 & 0xFFFF), ar[0][2 * q + 1] = f16_bits_to_float(a0 >> 16);
        ar[1][2 * q] = f16_bits_to_float(a1 & 0xFFFF), ar[1][2 * q + 1] = f16_bits_to_float(a1 >> 16);
        ar[0][8 + 2 * q] = f16_bits_to_float(a2 & 0xFFFF), ar[0][9 + 2 * q] = f16_bits_to_float(a2 >> 16);
        ar[1][8 + 2 * q] = f16_bits_to_float(a3 & 0xFFFF), ar[1][9 + 2 * q] = f16_bits_to_float(a3 >> 16);
#pragma unroll
        for (int col = 0; col < 2; ++col) {
            const int src = 4 * (2 * t + col) + q;
            const uint32_t x0 = lane_word(b0, src, 4), x1 = lane_word(b1, src, 5);
            bc[col][2 * q] = f16_bits_to_float(x0 & 0xFFFF), bc[col][2 * q + 1] = f16_bits_to_float(x0 >> 16);
            bc[col][8 + 2 * q] = f16_bits_to_float(x1 & 0xFFFF), bc[col][9 + 2 * q] = f16_bits_to_float(x1 >> 16);
        }
    }
#ifdef LUCE_MMA_F16_HOST
    __syncwarp();  // every lane has read the exchange before the next operation writes it
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float d = c[i];
#pragma unroll
        for (int k = 0; k < 16; ++k) d = fmaf(ar[i >> 1][k], bc[i & 1][k], d);
        c[i] = d;
    }
#endif
}

}  // namespace tc
