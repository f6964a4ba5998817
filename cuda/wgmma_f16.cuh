// Hopper warpgroup MMA (sm_90a only: wgmma.mma_async) for the f16 prompt-row GEMM
// (cuda/matmul_prefill_wgmma.cuh) and the warpgroup form of the f16 prompt attention
// (cuda/attention_prefill_f16_wg.cuh). A warpgroup (4 consecutive warps, 128 threads) computes
// D[64 x N] += A[64 x 16] B[16 x N] (N = 128, 80, 64 or 48), f16 operands, f32 accumulation, asynchronously:
//   A from registers, warp w of the group holding rows 16w..16w+15 in the m16n8k16 A layout of
//     cuda/mma_f16.cuh (a[0] = A[g][2t, 2t+1], a[1] = A[g+8][..], a[2] = A[g][2t+8, ..], a[3]);
//   B from shared memory, K-major (B^T row n = 16 values of token n, 32 bytes), 128-byte swizzle:
//     rows of 128 bytes (64 k values), 16-byte unit u of row n stored at unit u ^ (n % 8), 8-row
//     groups 1,024 bytes apart; the tile base 1,024-byte aligned (swizzle_unit below);
//   D per warp as N/8 m16n8 C tiles of cuda/mma_f16.cuh: d[i][e] = C tile i (columns 8i..8i+7).
// Each output is the m16n8k16 mma.sync's for the same fragments (the H200 GPU test
// test_f16_wgmma_bits_are_the_mma_bits: the same bits).
// Order: fence() after other instructions wrote the A or D registers, then mma_64xNx16 calls,
// commit(); wait<N>() until at most N committed groups are in flight. LUCE_WGMMA is defined
// where the instructions exist (device code for sm_90a). In the host emulator (tests/kernels/emu,
// LUCE_WGMMA_HOST) each warp runs its 16 rows as N/8 emulated mma.sync calls, B read from the
// swizzled tile by the same address rule; the asynchrony is none. Elsewhere nothing here is compiled.
#pragma once

#include "common.cuh"
#include "mma_f16.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(__HIPCC__)
#define LUCE_WGMMA 1
#elif defined(LUCE_MMA_F16_HOST)
#define LUCE_WGMMA_HOST 1
#endif

namespace wg {

// The first 1,024-byte aligned byte at or after p in the shared window (the swizzle's period).
__device__ __forceinline__ uint8_t *align_1024(uint8_t *p) {
#ifdef LUCE_WGMMA
    const uint32_t at = (uint32_t)__cvta_generic_to_shared(p);
#else
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
#endif
    return p + (((at + 1023u) & ~(decltype(at))1023u) - at);
}

// Byte offset in a 128-byte-swizzled tile of 16-byte unit u (0..7) of row n.
__host__ __device__ constexpr int swizzle_unit(int n, int u) { return n * 128 + ((u ^ (n & 7)) << 4); }

#ifdef LUCE_WGMMA
// Shared-memory matrix descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4
// (16-29; unused by K-major swizzled tiles: 1), stride byte offset >> 4 (32-45: 1,024 bytes
// between 8-row groups), swizzle mode (62-63: 1 = 128 bytes). A k16 step inside a 128-byte row
// starts 32 bytes further on (the swizzle applies to the address bits).
__device__ __forceinline__ uint64_t desc_sw128(const void *smem) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Shared memory this thread wrote (cp.async, stores) is visible to the MMAs' operand reads (the
// async proxy) once every writer has run this and a barrier follows.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Pins the accumulators around asynchronous MMAs (the compiler must not move them meanwhile).
template <int NT>
__device__ __forceinline__ void fence_operands(float (&d)[NT][4]) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// d += A B: m64nNk16 (N = 128, 80, 64, 48), A = a (registers), B at descriptor b. The operand
// lists differ only in width: d[i][0..3] are N / 8 accumulator tiles.
#define LUCE_WG_D(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define LUCE_WG_SCALE_D ".reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"  // scale-d: D += A B
__device__ __forceinline__ void mma_64x128x16(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n" LUCE_WG_SCALE_D "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : LUCE_WG_D(0), LUCE_WG_D(1), LUCE_WG_D(2), LUCE_WG_D(3),
                   LUCE_WG_D(4), LUCE_WG_D(5), LUCE_WG_D(6), LUCE_WG_D(7),
                   LUCE_WG_D(8), LUCE_WG_D(9), LUCE_WG_D(10), LUCE_WG_D(11),
                   LUCE_WG_D(12), LUCE_WG_D(13), LUCE_WG_D(14), LUCE_WG_D(15)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void mma_64x80x16(float (&d)[10][4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n" LUCE_WG_SCALE_D "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
                 "{%40, %41, %42, %43}, %44, p, 1, 1, 0;\n}\n"
                 : LUCE_WG_D(0), LUCE_WG_D(1), LUCE_WG_D(2), LUCE_WG_D(3),
                   LUCE_WG_D(4), LUCE_WG_D(5), LUCE_WG_D(6), LUCE_WG_D(7),
                   LUCE_WG_D(8), LUCE_WG_D(9)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void mma_64x64x16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n" LUCE_WG_SCALE_D "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : LUCE_WG_D(0), LUCE_WG_D(1), LUCE_WG_D(2), LUCE_WG_D(3),
                   LUCE_WG_D(4), LUCE_WG_D(5), LUCE_WG_D(6), LUCE_WG_D(7)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void mma_64x48x16(float (&d)[6][4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n" LUCE_WG_SCALE_D "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, "
                 "{%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n"
                 : LUCE_WG_D(0), LUCE_WG_D(1), LUCE_WG_D(2), LUCE_WG_D(3),
                   LUCE_WG_D(4), LUCE_WG_D(5)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#undef LUCE_WG_D
#undef LUCE_WG_SCALE_D

// d += A B over N = 8 NT tokens: the instruction of that width (NT 16, 10, 8 or 6).
template <int NT>
__device__ __forceinline__ void mma_64xnx16(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t b) {
    static_assert(NT == 16 || NT == 10 || NT == 8 || NT == 6, "wgmma widths here: n128, n80, n64, n48");
    if constexpr (NT == 16) mma_64x128x16(d, a, b);
    if constexpr (NT == 10) mma_64x80x16(d, a, b);
    if constexpr (NT == 8) mma_64x64x16(d, a, b);
    if constexpr (NT == 6) mma_64x48x16(d, a, b);
}

#elif defined(LUCE_WGMMA_HOST)
// The descriptor is the start address itself (the tile's base 1,024-byte aligned in the host
// address, as on the device in the shared window).
inline uint64_t desc_sw128(const void *smem) { return (uint64_t)reinterpret_cast<uintptr_t>(smem); }
inline void fence() {}
inline void fence_proxy_async() {}
inline void commit() {}
template <int N>
inline void wait() {}
template <int NT>
inline void fence_operands(float (&)[NT][4]) {}

// The 32-bit word of B^T row n, values k, k + 1 (k even, 0..15) of the k16 step starting at
// descriptor b: byte L = b + 128 n + 2 k of the unswizzled tile, stored at L with its 16-byte
// unit bits (4-6) XORed by its row-in-group bits (7-9).
inline uint32_t b_word(uint64_t b, int n, int k) {
    const uint64_t L = b + 128u * (uint64_t)n + 2u * (uint64_t)k;
    return *reinterpret_cast<const uint32_t *>((uintptr_t)(L ^ (((L >> 7) & 7u) << 4)));
}

template <int NT>
inline void mma_64xnx16(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t b) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < NT; ++i)
        tc::mma_f16_16x8x16(d[i], a, b_word(b, 8 * i + g, 2 * t), b_word(b, 8 * i + g, 2 * t + 8));
}
inline void mma_64x128x16(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) { mma_64xnx16<16>(d, a, b); }
inline void mma_64x64x16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) { mma_64xnx16<8>(d, a, b); }
#endif

}  // namespace wg
