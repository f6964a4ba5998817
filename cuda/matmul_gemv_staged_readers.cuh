// Readers of the staged one-row matmul (cuda/matmul_gemv_staged.cuh): a lane j takes group j of
// its chunk of each row of a batch from the stage in shared memory and returns the group's exact
// integer sums against x (sh, sl: the high and low x bytes, scaled by the group's integer scale;
// ms: its integer min times x's group sum, the types with mins), and the chunk header's d and
// negated min that the writer applies, c = d * fma(SH, 256, SL) (+ negmin * MS): matmul_gemv_c.cuh's
// ChunkIntC, so the bits are the register form's and the tile kernel's (DESIGN 5 rule 6).
//   StagedIQ4XS: its own lane layout (x words in the table lookup's order, kOwnLayout).
//   StagedKQuant<GemvQ4K | GemvQ5K | GemvQ6K>: the register form's reader on the stage's bytes.
#pragma once

#include "matmul_gemv_c.cuh"

namespace mm {

// prmt.b32 with the selector as given: nibble bit 3 replicates the selected byte's sign.
__device__ __forceinline__ uint32_t prmt_sign(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef LUCE_MM_PORTABLE
    const uint64_t src = ((uint64_t)b << 32) | a;
    uint32_t out = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t nib = (sel >> (4 * i)) & 15;
        uint32_t v = (uint32_t)(src >> (8 * (nib & 7))) & 0xFF;
        if (nib & 8) v = (v & 0x80) ? 0xFF : 0;
        out |= v << (8 * i);
    }
    return out;
#else
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
#endif
}

// T[8..15] + 1 (2, 14, 26, 39 | 54, 70, 90, 114): every entry positive.
constexpr uint32_t kIq4High1Lo = 0x271A0E02u, kIq4High1Hi = 0x725A4636u;
// Word 0 of the low half table (lanes 0, 1) and of T[8..15] + 1 (lanes 2, 3), loaded through a
// lane-dependent address (see kIq4TableA).
__device__ const uint32_t kIq4SplitA[4] = {kIq4Table0, kIq4Table0, kIq4High1Lo, kIq4High1Lo};

// IQ4_XS reader of the staged form: lane j takes group j of its chunk whole (qs bytes 16j..16j+15,
// one integer scale).
template <bool kSplit>
struct StagedIQ4XS {
    static constexpr int kChunkBytes = 136;
    static constexpr bool kOwnLayout = true, kOffset = false, kGroupScale = false;
    static constexpr int kMaxRegs = 56;  // at 4 rows a batch (matmul_gemv_staged.cuh LUCE_GEMV_STAGED_REGS)

    // Word i of lane j: quad i of group j (its unit of xq).
    static __device__ __forceinline__ void x_unit(int j, int i, int &group, int &quad) {
        group = j;
        quad = i;
    }

    // x of group j of chunk ch, quads 0..3 in the lookup's order (GemvIQ4XS::load_x's order).
    static __device__ __forceinline__ void load_x(const XLayout &x, int64_t ch, int j, GroupX &gx) {
        uint4 w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = __ldg(x.xq + (ch * kGroups + j) * 4 + q);
        set_x(w, 0, j, gx);
    }

    // gx from the lane's 4 xq words, from the workspace or quantized in lane (matmul_gemv_x.cuh).
    static __device__ __forceinline__ void set_x(const uint4 (&w)[4], int, int j, GroupX &gx) {
#pragma unroll
        for (int q = 0; q < 4; ++q)
            gx.v[q] = make_uint4(byte_perm(w[q].x, w[q].y, 0x5140), byte_perm(w[q].x, w[q].y, 0x7362),
                                 byte_perm(w[q].z, w[q].w, 0x5140), byte_perm(w[q].z, w[q].w, 0x7362));
        gx.s = 0;
        const int h = j & 1;
        if (kSplit) {
            gx.k[0] = __ldg(&kIq4SplitA[h]);
            gx.k[1] = __ldg(&kIq4SplitA[2 + h]);
        } else {
            gx.k[0] = __ldg(&kIq4TableA[h]);
            gx.k[1] = __ldg(&kIq4TableA[2 + h]);
        }
    }

    // One row's chunk at c (shared memory): the lane's integer sums sh, sl (its group's scale
    // applied); no mins (ms 0).
    static __device__ __forceinline__ void sums(const uint8_t *c, int j, const GroupX &gx, int &sh, int &sl, int &ms) {
        const uint2 h = *reinterpret_cast<const uint2 *>(c);
        const uint2 qa = *reinterpret_cast<const uint2 *>(c + 8 + 16 * j);
        const uint2 qb = *reinterpret_cast<const uint2 *>(c + 16 + 16 * j);
        const uint32_t w[4] = {qa.x, qa.y, qb.x, qb.y};
        int ph = 0, pl = 0;  // one chain each: a batch's rows give the instruction-level parallelism
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (kSplit) {
                const uint32_t f = w[q] ^ 0x88888888u;
                const uint32_t r1a = prmt_sign(gx.k[0], kIq4Table1, w[q]);
                const uint32_t r1b = prmt_sign(gx.k[0], kIq4Table1, w[q] >> 16);
                const uint32_t r2a = prmt_sign(gx.k[1], kIq4High1Hi, f);
                const uint32_t r2b = prmt_sign(gx.k[1], kIq4High1Hi, f >> 16);
                ph = dp4<false>(r1a, gx.v[q].x, ph);
                pl = dp4<true>(r1a, gx.v[q].z, pl);
                ph = dp4<false>(r1b, gx.v[q].y, ph);
                pl = dp4<true>(r1b, gx.v[q].w, pl);
                ph = dp4<false>(r2a, gx.v[q].x, ph);
                pl = dp4<true>(r2a, gx.v[q].z, pl);
                ph = dp4<false>(r2b, gx.v[q].y, ph);
                pl = dp4<true>(r2b, gx.v[q].w, pl);
            } else {
                uint32_t v01, v23;
                iq4_pairs(w[q], gx.k[0], gx.k[1], v01, v23);
                ph = dp4<false>(v01, gx.v[q].x, ph);
                pl = dp4<true>(v01, gx.v[q].z, pl);
                ph = dp4<false>(v23, gx.v[q].y, ph);
                pl = dp4<true>(v23, gx.v[q].w, pl);
            }
        }
        // ls_j = scales_l bits 4j..4j+3 | scales_h bits 2j, 2j + 1 (head.x bits 16 + 2j) << 4
        const int s = (int)(((h.y >> (4 * j)) & 15u) | ((h.x >> (12 + 2 * j)) & 0x30u)) - 32;
        sh = s * ph;
        sl = s * pl;
        ms = 0;
    }
    static __device__ __forceinline__ float d(const uint8_t *c) { return f16_to_f32(*reinterpret_cast<const unsigned short *>(c)); }
    static __device__ __forceinline__ float negmin(const uint8_t *) { return 0.0f; }
};

// Q4_K, Q5_K and Q6_K: the register form's reader (G = GemvQ4K, GemvQ5K, GemvQ6K;
// matmul_gemv_types.cuh) loading a row's chunk from the stage (SharedLoad) at the offsets it reads
// global memory at; the default x layout (group j's quads and, with mins, its integer sum).
template <class G>
struct StagedKQuant {
    static constexpr int kChunkBytes = G::Tensor::kChunkBytes;
    static constexpr bool kOwnLayout = false, kOffset = G::kOffset, kGroupScale = false;
    static constexpr int kMaxRegs = 64;  // 56 spilled (sm_90a: 8-36 bytes)

    static __device__ __forceinline__ void sums(const uint8_t *c, int j, const GroupX &gx, int &sh, int &sl, int &ms) {
        typename G::Raw raw;
        G::template load<SharedLoad>(raw, c, nullptr, j);
        group_sums<G>(raw, j, gx, sh, sl, ms);
    }
    static __device__ __forceinline__ float d(const uint8_t *c) { return G::template head_d<SharedLoad>(c); }
    static __device__ __forceinline__ float negmin(const uint8_t *c) { return G::template head_negmin<SharedLoad>(c); }
};

}  // namespace mm
