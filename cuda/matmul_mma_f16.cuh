// f16 tensor-core product and f16-pair arithmetic of the f16 prompt-row GEMM
// (cuda/matmul_prefill_f16.cu; the prompt attention has its own pieces in cuda/mma_f16.cuh): one warp computes C[16 x 8] += A[16 x 16] B[16 x 8] with f16
// operands and f32 accumulation (mma.sync m16n8k16). Reference of the arithmetic:
// luce/ref/matmul_prefill.py (matmul_prefill_f16).
//
// Lane = 4 * g + t (g 0..7, t 0..3); an f16 pair is one 32-bit word, element 0 in the low half.
// PTX m16n8k16 .row.col fragments:
//   A: a[0] = A[g][2t..2t+1], a[1] = A[g + 8][2t..2t+1], a[2] = A[g][2t+8..2t+9], a[3] = A[g + 8][2t+8..2t+9]
//   B: b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
//   C: c[0] = C[g][2t], c[1] = C[g][2t + 1], c[2] = C[g + 8][2t], c[3] = C[g + 8][2t + 1]
// NVIDIA sm_80+ runs mma.sync and ldmatrix; elsewhere (the host emulator tests/kernels/emu)
// a shuffle form computes the same fragment semantics with an fmaf chain over k = 0..15, C
// first, and plain 4-byte shared loads replace ldmatrix (the host emulator passes the words
// through a per-warp exchange instead of shuffles: the same arithmetic, fewer barriers). Both are fixed functions of the
// operands: an output's bits never depend on the other rows and columns of the warp's tile.
// The pair arithmetic (h2_*) is IEEE f16 with one rounding to nearest even per operation on
// every target (PTX .rn; the host form rounds the exact double result).
#pragma once

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIPCC__)
#define LUCE_MMA_F16_NATIVE 1
#elif defined(__HIPCC__)
#define LUCE_MMA_F16_HIP 1   // AMD: native f16 pair arithmetic, shuffle form of the mma
#elif !defined(__CUDACC__)
#define LUCE_MMA_F16_HOST 1  // the host emulator: fragments meet in a per-warp scratch, not shuffles
#endif

namespace hc {

#ifdef LUCE_MMA_F16_HOST
// Per-warp exchange of the host emulator (its threads share statics; a block's warps run at once):
// lane l's fragment words at [warp][l][0..5], its ldmatrix row address at [warp][l][6..7]. Two
// warp barriers an operation instead of two per shuffled word; the arithmetic is the shuffle form's.
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
__device__ __forceinline__ uint32_t h2_dup(float v) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(v));
    return r;
#elif defined(LUCE_MMA_F16_HIP)
    return as_word(half_pair{(_Float16)v, (_Float16)v});
#else
    return h2_pack(v, v);
#endif
}

// The f16 pair {lo, hi} of two f32.
__device__ __forceinline__ uint32_t h2_of(float lo, float hi) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#elif defined(LUCE_MMA_F16_HIP)
    return as_word(half_pair{(_Float16)lo, (_Float16)hi});
#else
    return h2_pack(lo, hi);
#endif
}

// a - b, a * b, a * b + c per half.
__device__ __forceinline__ uint32_t h2_sub(uint32_t a, uint32_t b) {
#ifdef LUCE_MMA_F16_NATIVE
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#elif defined(LUCE_MMA_F16_HIP)
    return as_word(as_pair(a) - as_pair(b));
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
    return as_word(as_pair(a) * as_pair(b));
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
    return as_word(__builtin_elementwise_fma(as_pair(a), as_pair(b), as_pair(c)));
#else  // products of f16 are exact in double; the sums here (weights) stay within its 53 bits
    return h2_pack(f16_value(a & 0xFFFF) * f16_value(b & 0xFFFF) + f16_value(c & 0xFFFF),
                   f16_value(a >> 16) * f16_value(b >> 16) + f16_value(c >> 16));
#endif
}

// Four 8 x 8 f16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8; r[i] receives matrix i's elements (row g, columns 2t, 2t + 1) of lane 4 g + t.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint8_t *row_addr) {
#ifdef LUCE_MMA_F16_NATIVE
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(row_addr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
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
#ifdef LUCE_MMA_F16_HIP
    auto f16_value = [](uint32_t bits) { return (float)__builtin_bit_cast(_Float16, (unsigned short)bits); };
#endif
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
        ar[0][2 * q] = (float)f16_value(a0 & 0xFFFF), ar[0][2 * q + 1] = (float)f16_value(a0 >> 16);
        ar[1][2 * q] = (float)f16_value(a1 & 0xFFFF), ar[1][2 * q + 1] = (float)f16_value(a1 >> 16);
        ar[0][8 + 2 * q] = (float)f16_value(a2 & 0xFFFF), ar[0][9 + 2 * q] = (float)f16_value(a2 >> 16);
        ar[1][8 + 2 * q] = (float)f16_value(a3 & 0xFFFF), ar[1][9 + 2 * q] = (float)f16_value(a3 >> 16);
#pragma unroll
        for (int col = 0; col < 2; ++col) {
            const int src = 4 * (2 * t + col) + q;
            const uint32_t x0 = lane_word(b0, src, 4), x1 = lane_word(b1, src, 5);
            bc[col][2 * q] = (float)f16_value(x0 & 0xFFFF), bc[col][2 * q + 1] = (float)f16_value(x0 >> 16);
            bc[col][8 + 2 * q] = (float)f16_value(x1 & 0xFFFF), bc[col][9 + 2 * q] = (float)f16_value(x1 >> 16);
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

}  // namespace hc
