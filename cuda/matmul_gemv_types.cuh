// Group readers of the one-row matmul (cuda/matmul_gemv.cuh): straight from global memory,
// one lane per 32-value group j of a row's 256-value chunk (a chunk of the 32-value block types
// Q8_0 and Q5_0 is 8 blocks). A reader loads what group j needs
// (load, no arithmetic, so loads can run ahead) and turns it into the group's weights as int8
// words in the mma operand pairing of matmul_mma.cuh: lo[q] = values 4q..4q+3, hi[q] = values
// 16+4q..16+4q+3 (lo[q] meets the high/low x bytes .x/.z of quad q's x word, hi[q] .y/.w).
// The integers are those of the tensor-core readers (matmul_kquants.cuh, matmul_blocks.cuh):
// the same weights, scales and mins per group, so the exact integer sums are the same.
// kGroupScale: the group's scale is an f32 (scale(), and offset() of it where kOffset) that
// the kernel applies per group in f32 (the tile kernel's mmq_chunk_float); scales() then
// gives integer scales 1, so the kernel's integer sums are the group's plain sums. Else the
// integer scales and mins of scales() are summed per chunk and d() / negmin() apply per chunk.
// IQ4_XS has a reader of its own lane layout (kOwnLayout): cuda/matmul_gemv_iq4.cuh.
#pragma once

#include <type_traits>

#include "matmul_blocks.cuh"
#include "matmul_kquants.cuh"

namespace mm {

// c + sum of the 4 products of signed bytes of a with signed (kUnsignedB false) or unsigned
// bytes of b.
template <bool kUnsignedB>
__device__ __forceinline__ int dp4(uint32_t a, uint32_t b, int c) {
#ifdef LUCE_MM_PORTABLE  // HIP, the host emulator
    for (int i = 0; i < 4; ++i) {
        const int bv = kUnsignedB ? (int)((b >> (8 * i)) & 0xFF) : (int)(int8_t)(b >> (8 * i));
        c += (int)(int8_t)(a >> (8 * i)) * bv;
    }
    return c;
#else
    int d;
    if (kUnsignedB)
        asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else
        asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

// x operands of a lane of token 0, kept in registers for the whole launch: for the readers here
// group g's 4 quads' words and (the integer-scale types with mins) its integer sum
// (load_group_x, matmul_gemv_c.cuh); a reader with kOwnLayout fills it its own way (G::load_x).
struct GroupX {
    uint4 v[4];
    int s;
    uint32_t k[2];  // a reader's own lane constants (kOwnLayout)
};

struct GroupWords {
    uint32_t lo[4], hi[4];
};

// Weight loads stream past L1 (no allocation there: L1 keeps x, which every row reads).
__device__ __forceinline__ uint4 ldg16(const uint8_t *p) {
#if defined(LUCE_MM_PORTABLE) || __CUDA_ARCH__ < 800  // HIP, the host emulator, sm < 80
    return __ldg(reinterpret_cast<const uint4 *>(p));
#else
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#endif
}

__device__ __forceinline__ uint2 ldg8(const uint8_t *p) {
#if defined(LUCE_MM_PORTABLE) || __CUDA_ARCH__ < 800  // HIP, the host emulator, sm < 80
    return __ldg(reinterpret_cast<const uint2 *>(p));
#else
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#endif
}

__device__ __forceinline__ uint32_t ldg4(const uint32_t *p) {
#if defined(LUCE_MM_PORTABLE) || __CUDA_ARCH__ < 800  // HIP, the host emulator, sm < 80
    return __ldg(p);
#else
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#endif
}

// Where a reader's loads come from: global memory (the register form: past L1) or
// the staged form's shared memory (StagedKQuant, matmul_gemv_staged_readers.cuh). u32 / u16: 4 and
// 2 bytes at p (aligned so).
struct GlobalLoad {
    static __device__ __forceinline__ uint32_t u32(const uint32_t *p) { return ldg4(p); }
    static __device__ __forceinline__ uint32_t u16(const uint8_t *p) { return ld16(p); }
};
struct SharedLoad {
    static __device__ __forceinline__ uint32_t u32(const uint32_t *p) { return *p; }
    static __device__ __forceinline__ uint32_t u16(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }
};

// Words at p + 4i, i < N, of a 2-byte aligned p: N + 1 aligned loads, none at or past `end`.
// kKeepL1: loads that allocate in L1, for readers whose lanes' loads of one instruction touch
// the sectors the next instructions touch again (a 22- or 34-byte group read word by word).
// SharedLoad: no bound (a stage holds whole chunks; end is not read).
template <int N, bool kKeepL1 = false, class L = GlobalLoad>
__device__ __forceinline__ void load_words_a2(const uint8_t *p, const uint8_t *end, uint32_t w[N + 1]) {
    const uint32_t *base = reinterpret_cast<const uint32_t *>(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)3);
    if constexpr (std::is_same<L, SharedLoad>::value) {
#pragma unroll
        for (int i = 0; i <= N; ++i) w[i] = L::u32(base + i);
    } else {
        const uint32_t *last = reinterpret_cast<const uint32_t *>(reinterpret_cast<uintptr_t>(end - 1) & ~(uintptr_t)3);
#pragma unroll
        for (int i = 0; i <= N; ++i) w[i] = base + i <= last ? (kKeepL1 ? __ldg(base + i) : L::u32(base + i)) : 0u;
    }
}

// The N words at p from load_words_a2's N + 1 aligned words.
template <int N>
__device__ __forceinline__ void align_words_a2(const uint8_t *p, const uint32_t raw[N + 1], uint32_t w[N]) {
    const uint32_t sel = (reinterpret_cast<uintptr_t>(p) & 2) ? 0x5432u : 0x3210u;  // from byte 2 or 0
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = byte_perm(raw[i], raw[i + 1], sel);
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Q4_K (144 B, 16-byte aligned rows): header, then qs[32i + l] (i = j / 2) low / high nibble.
struct GemvQ4K {
    using Tensor = ReaderQ4K;
    static constexpr bool kHalves = false, kOffset = true, kGroupScale = false, kOwnLayout = false;
    static constexpr int kAlign = 16;  // of the weights: 16-byte loads
    static constexpr int kRows = 2;    // rows a lane loads at once (12 registers a row)
    static constexpr bool kDeepInLane = true;  // x quantized in lane also at twice the rows (matmul_gemv_x.cuh)
    struct Raw { uint4 h, qa, qb; };
    static __device__ __forceinline__ void load(Raw &r, const uint8_t *c, const uint8_t *, int j) {
        r.h = ldg16(c);
        r.qa = ldg16(c + 16 + 32 * (j >> 1));
        r.qb = ldg16(c + 32 + 32 * (j >> 1));
    }
    static __device__ __forceinline__ void words(const Raw &r, int j, GroupWords &g) {
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            g.lo[q] = (word_of(r.qa, q) >> sh) & 0x0F0F0F0Fu;
            g.hi[q] = (word_of(r.qb, q) >> sh) & 0x0F0F0F0Fu;
        }
    }
    static __device__ __forceinline__ void scales(const Raw &r, int j, int s[2], int &m) {
        uint32_t sc[2], mn[2];
        k_scales_mins(r.h, sc, mn);
        s[0] = s[1] = (int)byte_of(sc[j >> 2], j & 3);
        m = (int)byte_of(mn[j >> 2], j & 3);
    }
    static __device__ __forceinline__ float d(const Raw &r) { return f16_to_f32(r.h.x); }
    static __device__ __forceinline__ float negmin(const Raw &r) { return -f16_to_f32(r.h.x >> 16); }
    // d and the negated min of the chunk at c (StagedK45's writer, from the stage; Q5_K's header is Q4_K's)
    template <class L>
    static __device__ __forceinline__ float head_d(const uint8_t *c) { return f16_to_f32(L::u16(c)); }
    template <class L>
    static __device__ __forceinline__ float head_negmin(const uint8_t *c) { return -f16_to_f32(L::u16(c + 2)); }
};

// Q5_K (176 B, 16-byte aligned rows): as Q4_K with qh[32] after the header (bit j of qh[l]).
struct GemvQ5K {
    using Tensor = ReaderQ5K;
    static constexpr bool kHalves = false, kOffset = true, kGroupScale = false, kOwnLayout = false;
    static constexpr int kAlign = 16;
    static constexpr int kRows = 2;  // 20 registers a row
    static constexpr bool kDeepInLane = true;
    struct Raw { uint4 h, ha, hb, qa, qb; };
    static __device__ __forceinline__ void load(Raw &r, const uint8_t *c, const uint8_t *, int j) {
        r.h = ldg16(c);
        r.ha = ldg16(c + 16);
        r.hb = ldg16(c + 32);
        r.qa = ldg16(c + 48 + 32 * (j >> 1));
        r.qb = ldg16(c + 64 + 32 * (j >> 1));
    }
    static __device__ __forceinline__ void words(const Raw &r, int j, GroupWords &g) {
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            g.lo[q] = ((word_of(r.qa, q) >> sh) & 0x0F0F0F0Fu) | (((word_of(r.ha, q) >> j) & 0x01010101u) << 4);
            g.hi[q] = ((word_of(r.qb, q) >> sh) & 0x0F0F0F0Fu) | (((word_of(r.hb, q) >> j) & 0x01010101u) << 4);
        }
    }
    static __device__ __forceinline__ void scales(const Raw &r, int j, int s[2], int &m) { GemvQ4K::scales({r.h, r.qa, r.qb}, j, s, m); }
    static __device__ __forceinline__ float d(const Raw &r) { return f16_to_f32(r.h.x); }
    static __device__ __forceinline__ float negmin(const Raw &r) { return -f16_to_f32(r.h.x >> 16); }
};

// Q6_K (210 B, 2-byte aligned): group j = half h = j / 4, G = j % 4; ql 32 bytes at
// 64h + 32 (G & 1) (nibble G / 2), qh 32 bytes at 128 + 32h (bits 2G, 2G + 1); int8 scales
// 2j, 2j + 1 of the 16 at 192 (values 0..15, 16..31); f16 d at 208.
struct GemvQ6K {
    using Tensor = ReaderQ6K;
    static constexpr bool kHalves = true, kOffset = false, kGroupScale = false, kOwnLayout = false;
    static constexpr int kAlign = 2;  // words realigned from 4-byte loads
    static constexpr int kRows = 2;   // 21 registers a row
    static constexpr bool kDeepInLane = false;  // twice the rows (tune 6) and x in lane spill: x from the workspace
    struct Raw { uint32_t ql[9], qh[9], sd; const uint8_t *c; };
    template <class L = GlobalLoad>
    static __device__ __forceinline__ void load(Raw &r, const uint8_t *c, const uint8_t *end, int j) {
        const int h = j >> 2, G = j & 3;
        r.c = c;
        load_words_a2<8, false, L>(c + 64 * h + 32 * (G & 1), end, r.ql);
        load_words_a2<8, false, L>(c + 128 + 32 * h, end, r.qh);
        r.sd = L::u16(c + 192 + 2 * j) | (L::u16(c + 208) << 16);
    }
    static __device__ __forceinline__ void words(const Raw &r, int j, GroupWords &g) {
        const int h = j >> 2, G = j & 3;
        uint32_t ql[8], qh[8];
        align_words_a2<8>(r.c + 64 * h + 32 * (G & 1), r.ql, ql);
        align_words_a2<8>(r.c + 128 + 32 * h, r.qh, qh);
        const int nib = 4 * (G >> 1), bits = 2 * G;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            g.lo[q] = minus32_bytes(((ql[q] >> nib) & 0x0F0F0F0Fu) | (((qh[q] >> bits) & 0x03030303u) << 4));
            g.hi[q] = minus32_bytes(((ql[4 + q] >> nib) & 0x0F0F0F0Fu) | (((qh[4 + q] >> bits) & 0x03030303u) << 4));
        }
    }
    static __device__ __forceinline__ void scales(const Raw &r, int, int s[2], int &m) {
        s[0] = (int)(int8_t)(r.sd & 0xFF);
        s[1] = (int)(int8_t)((r.sd >> 8) & 0xFF);
        m = 0;
    }
    static __device__ __forceinline__ float d(const Raw &r) { return f16_to_f32(r.sd >> 16); }
    static __device__ __forceinline__ float negmin(const Raw &) { return 0.0f; }
    // d and the negated min of the chunk at c (the staged form's writer, from the stage)
    template <class L>
    static __device__ __forceinline__ float head_d(const uint8_t *c) { return f16_to_f32(L::u16(c + 208)); }
    template <class L>
    static __device__ __forceinline__ float head_negmin(const uint8_t *) { return 0.0f; }
};

// Q8_0 and Q5_0 (34 and 22 B blocks, 2-byte aligned): f16 d, then the block's bytes. A lane
// loads the aligned words covering block j (load_words_a2 from the block's start: 9 and 6
// words) and realigns the words after d: the selector takes bytes 2..5 of two words (block at
// 4i, sh 0) or the second word (block at 4i + 2, sh 16); d is word 0 >> sh.
__device__ __forceinline__ uint32_t block32_sel(uint32_t sh) { return sh ? 0x7654u : 0x5432u; }

// What Q8_0 and Q5_0 share: a block of kBytes (f16 d first) read as the kWords + 1 aligned words
// covering it, d from word 0, integer scales of 1 (the f16 d is applied per group in float).
template <int kBytes, int kWords>
struct GemvBlock32 {
    static constexpr bool kHalves = false, kGroupScale = true, kOwnLayout = false;
    static constexpr int kAlign = 2;  // 4-byte loads realigned
    static constexpr int kRows = 4;   // rows a lane loads at once (tune 6: 8)
    static constexpr bool kDeepInLane = false;  // twice the rows (tune 6) and x in lane spill: x from the workspace
    struct Raw { uint32_t w[kWords + 1], sh; };
    static __device__ __forceinline__ void load(Raw &r, const uint8_t *c, const uint8_t *end, int j) {
        const uint8_t *blk = c + kBytes * j;
        r.sh = (reinterpret_cast<uintptr_t>(blk) & 2) ? 16 : 0;
        load_words_a2<kWords, true>(blk, end, r.w);
    }
    static __device__ __forceinline__ void scales(const Raw &, int, int s[2], int &m) { s[0] = s[1] = 1; m = 0; }
    static __device__ __forceinline__ float scale(const Raw &r) { return f16_to_f32(r.w[0] >> r.sh); }
};

// Q8_0 (34 B): f16 d, int8 q[32]. Value = d * q.
struct GemvQ80 : GemvBlock32<34, 8> {
    using Tensor = ReaderQ80;
    static constexpr bool kOffset = false;
    static constexpr bool kWideChain = true;  // GroupFloatC::chain's four-chunk form with one chunk slot too
    static __device__ __forceinline__ void words(const Raw &r, int, GroupWords &g) {
        const uint32_t sel = block32_sel(r.sh);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            g.lo[q] = byte_perm(r.w[q], r.w[q + 1], sel);
            g.hi[q] = byte_perm(r.w[4 + q], r.w[5 + q], sel);
        }
    }
    static __device__ __forceinline__ float offset(float) { return 0.0f; }
};

// Q5_0 (22 B): f16 d, u32 qh, qs[16]; value l < 16: low nibble of qs[l] | bit l of qh << 4,
// value l + 16: high nibble | bit 16 + l << 4 (ReaderQ50). Value = d * q - 16 * d.
struct GemvQ50 : GemvBlock32<22, 5> {
    using Tensor = ReaderQ50;
    static constexpr bool kOffset = true;
    static constexpr bool kWideChain = false;  // see GroupFloatC::chain
    static __device__ __forceinline__ void words(const Raw &r, int, GroupWords &g) {
        const uint32_t sel = block32_sel(r.sh), qh = byte_perm(r.w[0], r.w[1], sel);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint32_t qs = byte_perm(r.w[1 + q], r.w[2 + q], sel);
            g.lo[q] = (qs & 0x0F0F0F0Fu) | spread_bit4((qh >> (4 * q)) & 15);
            g.hi[q] = ((qs >> 4) & 0x0F0F0F0Fu) | spread_bit4((qh >> (16 + 4 * q)) & 15);
        }
    }
    static __device__ __forceinline__ float offset(float d) { return q50_offset(d); }
};

}  // namespace mm
