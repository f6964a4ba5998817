// Readers of the staged one-row matmul (cuda/matmul_gemv_staged.cuh): a lane j takes group j of
// its chunk of each row of a batch from the stage in shared memory and returns the group's exact
// integer sums against x (sh, sl: the high and low x bytes, scaled by the group's integer scale;
// ms: its integer min times x's group sum, the types with mins), and the chunk header's d and
// negated min that the writer applies, c = d * fma(SH, 256, SL) (+ negmin * MS): matmul_gemv_c.cuh's
// ChunkIntC, so the bits are the register form's and the tile kernel's (DESIGN 5 rule 6).
//   StagedIQ4XS: its own lane layout (x words in the table lookup's order, kOwnLayout).
//   StagedK45<kQ5>: Q4_K and Q5_K, a lane layout of their own (kOwnLayout).
//   StagedKQuant<GemvQ6K>: the register form's reader on the stage's bytes.
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

    // Unit i of lane j: quad i of group j (values a..a+3, b..b+3 of the chunk).
    static __device__ __forceinline__ void x_unit(int j, int i, int &a, int &b) {
        a = 32 * j + 4 * i;
        b = a + 16;
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

// x bits rotated right by s (0..31).
__device__ __forceinline__ uint32_t rotr32(uint32_t x, int s) {
#ifdef LUCE_MM_PORTABLE
    return (x >> s) | (x << ((32 - s) & 31));
#else
    return __funnelshift_r(x, x, s);
#endif
}

// Q4_K and Q5_K reader of its own lane layout (session 38): lane j takes qs bytes 16j..16j+15 of
// a row's chunk whole, values l = 16h..16h+15 (h = j % 2) of groups ga = 2i (the low nibbles) and
// gb = 2i + 1 (the high nibbles), i = j / 2; Q5_K also qh bytes 16h..16h+15 (bits ga, gb: bit 4
// of the values). A row costs a lane one 16-byte shared load of qs, one of the header (the
// chunk's 8 lanes alike) and Q5_K one of qh, and its two scales and two mins come from the header
// by two prmt with lane-constant selectors (StagedKQuant: three to five 16-byte loads, the
// header's 16 scales and mins decoded a row). Same sums: SH = sum_g s_g * sum(q * xhi), SL and
// MS = sum_g m_g * sum(x) are the tile kernel's integers, added by other lanes (exact in any order).
// x (kOwnLayout): gx.v[w] = {high, low bytes of ga's values 16h+4w..16h+4w+3, of gb's}; gx.s and
// gx.k[0] the integer sums of the lane's 16 values of ga and of gb.
template <bool kQ5>
struct StagedK45 {
    static constexpr int kChunkBytes = kQ5 ? 176 : 144, kQs = kQ5 ? 48 : 16;
    static constexpr bool kOwnLayout = true, kOffset = true, kGroupScale = false;
    static constexpr int kMaxRegs = kQ5 ? 64 : 56;  // sm_90a: Q4_K spills 8 bytes at 56, Q5_K 52

    // Unit i of lane j: 8 values of group 2 (j / 2) + i / 2 from 16 (j % 2) + 8 (i % 2): a..a+3, b..b+3.
    static __device__ __forceinline__ void x_unit(int j, int i, int &a, int &b) {
        a = 32 * (2 * (j >> 1) + (i >> 1)) + 16 * (j & 1) + 8 * (i & 1);
        b = a + 4;
    }

    // gx from the lane's units' words {high bytes of values a.., of b.., low bytes of a.., of b..}.
    static __device__ __forceinline__ void set_x(const uint4 (&w)[4], int, int, GroupX &gx) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // units h (ga) and 2 + h (gb): words 2h (values a..) and 2h + 1 (b..)
            gx.v[2 * h] = make_uint4(w[h].x, w[h].z, w[2 + h].x, w[2 + h].z);
            gx.v[2 * h + 1] = make_uint4(w[h].y, w[h].w, w[2 + h].y, w[2 + h].w);
        }
        int ha = 0, la = 0, hb = 0, lb = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // 256 * (high bytes, signed) + low bytes, exact
            ha = dp4<false>(0x01010101u, gx.v[q].x, ha);
            la = dp4<true>(0x01010101u, gx.v[q].y, la);
            hb = dp4<false>(0x01010101u, gx.v[q].z, hb);
            lb = dp4<true>(0x01010101u, gx.v[q].w, lb);
        }
        gx.s = ha * 256 + la;
        gx.k[0] = (uint32_t)(hb * 256 + lb);
        gx.k[1] = 0;
    }

    // The same words from the workspace: value l of a group is quad (l % 16) / 4's .x / .z (l < 16)
    // or .y / .w (l >= 16) (matmul_x.cuh).
    static __device__ __forceinline__ void load_x(const XLayout &x, int64_t ch, int j, GroupX &gx) {
        const int h = j & 1;
        uint4 w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int64_t g = ch * kGroups + 2 * (j >> 1) + (u >> 1);
            const uint4 qa = __ldg(x.xq + g * 4 + 2 * (u & 1)), qb = __ldg(x.xq + g * 4 + 2 * (u & 1) + 1);
            w[u] = h ? make_uint4(qa.y, qb.y, qa.w, qb.w) : make_uint4(qa.x, qb.x, qa.z, qb.z);
        }
        set_x(w, 0, j, gx);
    }

    static __device__ __forceinline__ void sums(const uint8_t *c, int j, const GroupX &gx, int &sh, int &sl, int &ms) {
        const int i = j >> 1;
        const uint4 hd = *reinterpret_cast<const uint4 *>(c);
        const uint4 q = *reinterpret_cast<const uint4 *>(c + kQs + 16 * j);
        uint4 qh = {};
        if constexpr (kQ5) qh = *reinterpret_cast<const uint4 *>(c + 16 + 16 * (j & 1));
        int pha = 0, pla = 0, phb = 0, plb = 0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t qw = word_of(q, w);
            uint32_t a = qw & 0x0F0F0F0Fu, b = (qw >> 4) & 0x0F0F0F0Fu;
            if constexpr (kQ5) {  // bit 2i (ga) / 2i + 1 (gb) of each qh byte to bit 4
                const uint32_t hw = word_of(qh, w);
                a |= rotr32(hw, (2 * i - 4) & 31) & 0x10101010u;
                b |= rotr32(hw, (2 * i - 3) & 31) & 0x10101010u;
            }
            pha = dp4<false>(a, gx.v[w].x, pha);
            pla = dp4<true>(a, gx.v[w].y, pla);
            phb = dp4<false>(b, gx.v[w].z, phb);
            plb = dp4<true>(b, gx.v[w].w, plb);
        }
        // {sa, sb, ma, mb} (k_scales_mins' bytes 2i, 2i + 1 of sc and mn): bytes p, p + 1 (p = 2i % 4)
        // of scales 0..3 (hd.y), mins 0..3 (hd.z) and, for i >= 2, the low / high nibbles of hd.w.
        const uint32_t p = (2 * i) & 3, sel = p | (p + 1) << 4 | (p + 4) << 8 | (p + 5) << 12;
        const bool upper = i >= 2;
        const uint32_t t = prmt_clear(hd.y, hd.z, sel);
        const uint32_t u = upper ? prmt_clear(hd.w, hd.w >> 4, sel) : t;
        const uint32_t v = (u & 0x0F0F0F0Fu) | ((t >> (upper ? 2 : 0)) & 0x30303030u);
        const int sa = (int)(v & 0xFF), sb = (int)((v >> 8) & 0xFF);
        const int ma = (int)((v >> 16) & 0xFF), mb = (int)(v >> 24);
        sh = sa * pha + sb * phb;
        sl = sa * pla + sb * plb;
        ms = ma * gx.s + mb * (int)gx.k[0];
    }
    static __device__ __forceinline__ float d(const uint8_t *c) { return GemvQ4K::head_d<SharedLoad>(c); }
    static __device__ __forceinline__ float negmin(const uint8_t *c) { return GemvQ4K::head_negmin<SharedLoad>(c); }
};

// Q6_K: the register form's reader (G = GemvQ6K, matmul_gemv_types.cuh) loading a row's chunk from
// the stage (SharedLoad) at the offsets it reads global memory at; the default x layout (group j's
// quads and, with mins, its integer sum).
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
