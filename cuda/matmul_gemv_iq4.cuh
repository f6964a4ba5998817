// IQ4_XS reader of the one-row matmul (cuda/matmul_gemv.cuh) with a lane layout of its own
// (kOwnLayout): coalesced loads, and the table lookup in few instructions.
//
// Chunk (136 B): f16 d, u16 scales_h (2 bits a group at 2g), u32 scales_l (4 bits at 4g),
// qs[128]; qs[16g + l] low nibble = table index of value l of group g, high nibble value l + 16.
// Value = (d * (ls_g - 32)) * table[index], ls_g = scales_l_g | scales_h_g << 4.
//
// Lanes. Lane j (= lane % 8) of a chunk loads three 8-byte words a row: the header (all 8
// lanes the same), qs bytes 8j..8j+7 ("unit a") and 64+8j..64+8j+7 ("unit b"). The 8 lanes'
// unit loads of one instruction are 64 contiguous bytes (the layout of ReaderIQ4XS in
// matmul_gemv_types.cuh before: bytes 16j.. and 16j+8.., half a sector's bytes an instruction
// and each sector fetched by both). Unit a holds values l0..l0+7 and l0+16..l0+23 of group
// ga = j / 2 (l0 = 8 (j % 2)), unit b the same values of group gb = ga + 4: a lane sums two half
// groups, each with its own integer scale (one more scale to extract a row than one group a lane).
//
// Same sums: the chunk integers SH = sum_g s_g * sum(q * xhi), SL (low bytes) are sums of the
// same integer products as the tile kernel's (and as the one-group-a-lane layout's); only which
// lane adds which product differs, and integer sums are exact in any order (DESIGN 5 rule 6).
//
// Lookup. A word w of 4 qs bytes is 8 nibbles in the order (value, value + 16) for 4 values;
// prmt with the table's low / high 8 entries (index bits 0..2) and a second prmt choosing
// between them by index bit 3 gives the 8 table values in that same interleaved order: 6 prmt a
// word. x is stored in that order once at launch (load_x), so the weights need no reordering
// (iq4_lookup in matmul_blocks.cuh spends 2 more prmt a word for it). The selectors are
// masked here, once a word: __byte_perm has the compiler mask every variable selector itself.
#pragma once

#include "matmul_gemv_types.cuh"
#include "matmul_x.cuh"

namespace mm {

// Table values of the 8 nibbles of w, in nibble order: v01 of nibbles 0..3, v23 of 4..7.
__device__ __forceinline__ void iq4_pairs(uint32_t w, uint32_t t0, uint32_t t2, uint32_t &v01, uint32_t &v23) {
    const uint32_t idx = w & 0x77777777u;                          // index within a half table
    const uint32_t half = 0x32103210u + ((w & 0x88888888u) >> 1);  // nibble i: byte i or i + 4
    const uint32_t lo = idx >> 16, hh = half >> 16;
    v01 = prmt_clear(prmt_clear(t0, kIq4Table1, idx), prmt_clear(t2, kIq4Table3, idx), half);
    v23 = prmt_clear(prmt_clear(t0, kIq4Table1, lo), prmt_clear(t2, kIq4Table3, lo), hh);
}

struct GemvIQ4XS {
    using Tensor = ReaderIQ4XS;
    static constexpr bool kHalves = false, kOffset = false, kGroupScale = false, kOwnLayout = true;
    static constexpr int kAlign = 8;  // 8-byte loads
    static constexpr int kRows = 4;   // 6 registers a row (tune 6: 8)
    static constexpr bool kDeepInLane = true;
    struct Raw { uint2 head, qa, qb; };

    // Row `off` bytes past the chunk at c0 (c0 the same for a batch's rows: the lane's address
    // c0 + 8 + 8j is formed once a batch, a row adds off to it).
    static __device__ __forceinline__ void load_at(Raw &r, const uint8_t *c0, uint32_t off, int j) {
        const uint8_t *q = c0 + (8 + 8 * j);
        r.head = ldg8(c0 + off);
        r.qa = ldg8(q + off);
        r.qb = ldg8(q + off + 64);
    }

    // x of lane j's words qa.x, qa.y, qb.x, qb.y (v[0..3]): quads 2h, 2h + 1 (h = j % 2) of
    // groups ga and gb, each as {high bytes of values (l, l+16, l+1, l+17), of (l+2, l+18, l+3,
    // l+19), low bytes of the same}, l = 4 * quad: iq4_pairs' order.
    // Word i of lane j: group ga + 4 * (i / 2) of the chunk, quad 2h + i % 2 (its unit of xq).
    static __device__ __forceinline__ void x_unit_quad(int j, int i, int &group, int &quad) {
        group = (j >> 1) + 4 * (i >> 1);
        quad = 2 * (j & 1) + (i & 1);
    }
    // The same unit as gemv_quantize_x (matmul_gemv_x.cuh) takes it: values a..a+3, b..b+3 of the chunk.
    static __device__ __forceinline__ void x_unit(int j, int i, int &a, int &b) {
        int group, quad;
        x_unit_quad(j, i, group, quad);
        a = 32 * group + 4 * quad;
        b = a + 16;
    }

    // gx from the lane's 4 xq words (x_unit's order), from the workspace or quantized in lane
    // (matmul_gemv_x.cuh).
    static __device__ __forceinline__ void set_x(const uint4 (&w)[4], int, int j, GroupX &gx) {
        const int h = j & 1;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            gx.v[i] = make_uint4(byte_perm(w[i].x, w[i].y, 0x5140), byte_perm(w[i].x, w[i].y, 0x7362),
                                 byte_perm(w[i].z, w[i].w, 0x5140), byte_perm(w[i].z, w[i].w, 0x7362));
        gx.s = 0;  // no mins
        gx.k[0] = __ldg(&kIq4TableA[h]);
        gx.k[1] = __ldg(&kIq4TableA[2 + h]);
    }

    static __device__ __forceinline__ void load_x(const XLayout &x, int64_t ch, int j, GroupX &gx) {
        uint4 w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int group, quad;
            x_unit_quad(j, i, group, quad);
            w[i] = __ldg(x.xq + (ch * kGroups + group) * 4 + quad);
        }
        set_x(w, 0, j, gx);
    }

    // Lane j's share of one row's chunk sums: sh = sa * (its high-byte sum of group ga) + sb *
    // (of gb), sl likewise with the low bytes; no mins (ms = 0).
    static __device__ __forceinline__ void sums(const Raw &r, int j, const GroupX &gx, int &sh, int &sl, int &ms) {
        const uint32_t w[4] = {r.qa.x, r.qa.y, r.qb.x, r.qb.y};
        int ph[2] = {0, 0}, pl[2] = {0, 0};  // group ga, gb
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint32_t v01, v23;
            iq4_pairs(w[q], gx.k[0], gx.k[1], v01, v23);
            ph[q >> 1] = dp4<false>(v01, gx.v[q].x, ph[q >> 1]);
            ph[q >> 1] = dp4<false>(v23, gx.v[q].y, ph[q >> 1]);
            pl[q >> 1] = dp4<true>(v01, gx.v[q].z, pl[q >> 1]);
            pl[q >> 1] = dp4<true>(v23, gx.v[q].w, pl[q >> 1]);
        }
        const int ga = j >> 1;
        const uint32_t l4 = r.head.y >> (4 * ga), h2 = r.head.x >> (12 + 2 * ga);  // ga at bits 0 / 4, gb 16 / 12
        const int sa = (int)((l4 & 15) | (h2 & 0x30)) - 32, sb = (int)(((l4 >> 16) & 15) | ((h2 >> 8) & 0x30)) - 32;
        sh = sa * ph[0] + sb * ph[1];
        sl = sa * pl[0] + sb * pl[1];
        ms = 0;
    }

    static __device__ __forceinline__ float d(const Raw &r) { return f16_to_f32(r.head.x); }
    static __device__ __forceinline__ float negmin(const Raw &) { return 0.0f; }
};

}  // namespace mm
