// Row readers for the K-quants (256-value super-blocks): Q4_K, Q5_K, Q6_K.
// Layouts as in luce/gguf/quants_k.py (ggml's). A reader points at one super-block ("chunk")
// of the thread's two weight rows in a shared-memory stage (matmul_stage.cuh), keeps its
// header and turns group j (values 32j..32j+31) into mma operands (matmul_mma.cuh): the lane
// `quad` of its quad reads values 4*quad..+3 and 16 + 4*quad..+3 of every group. The small
// integer scales stay integers (one f32 scale per chunk and row).
#pragma once

#include "matmul_mma.cuh"

namespace mm {

// Integer-scale readers: group j's contribution to y[row r, token t] of the chunk is
//   d[r] * sum over halves h of scale(j, h, r) * sum(q * xq)  +  negmin[r] * m_j * sum(xq)
// with m_j byte j of the words mn[r] (kOffset types)
// with every product and both sums exact integers (matmul_chunk.cuh adds them up per chunk).

// Q4_K / Q5_K header: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs (uint4 h).
// Unpacked to bytes: sc[0] scales of groups 0..3, sc[1] of 4..7; mn likewise for the mins.
__device__ __forceinline__ void k_scales_mins(const uint4 &h, uint32_t sc[2], uint32_t mn[2]) {
    sc[0] = h.y & 0x3F3F3F3Fu;
    sc[1] = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    mn[0] = h.z & 0x3F3F3F3Fu;
    mn[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
}

// Q4_K, 144 B: header[16], qs[128]; qs[32i + l] low nibble = sub-block 2i value l, high
// nibble = sub-block 2i+1 value l. Value = (d * sc) * q - dmin * m.
struct ReaderQ4K {
    static constexpr int kChunkBytes = 144, kGroupBytes = 0;
    static constexpr bool kHalves = false, kOffset = true, kIntScale = true;
    const uint8_t *b[2];
    uint32_t sc[2][2], mn[2][2];
    float d[2], negmin[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint4 h = *reinterpret_cast<const uint4 *>(b[r]);
            k_scales_mins(h, sc[r], mn[r]);
            d[r] = f16_to_f32(h.x);
            negmin[r] = -f16_to_f32(h.x >> 16);
        }
    }

    __device__ __forceinline__ void weights(int j, int quad, uint32_t a[4]) const {
        const int i = j >> 1, sh = 4 * (j & 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            a[r] = (lds32(b[r] + 16 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu;
            a[2 + r] = (lds32(b[r] + 32 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu;
        }
    }

    __device__ __forceinline__ int scale(int j, int, int r) const { return (int)ubyte(sc[r][j >> 2], j & 3); }
};

// Q5_K, 176 B: header[16], qh[32], qs[128]; as Q4_K plus bit j of qh[l] = bit 4 of
// sub-block j value l.
struct ReaderQ5K {
    static constexpr int kChunkBytes = 176, kGroupBytes = 0;
    static constexpr bool kHalves = false, kOffset = true, kIntScale = true;
    const uint8_t *b[2];
    uint32_t sc[2][2], mn[2][2];
    float d[2], negmin[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint4 h = *reinterpret_cast<const uint4 *>(b[r]);
            k_scales_mins(h, sc[r], mn[r]);
            d[r] = f16_to_f32(h.x);
            negmin[r] = -f16_to_f32(h.x >> 16);
        }
    }

    __device__ __forceinline__ void weights(int j, int quad, uint32_t a[4]) const {
        const int i = j >> 1, sh = 4 * (j & 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint32_t qh_lo = lds32(b[r] + 16 + 4 * quad), qh_hi = lds32(b[r] + 32 + 4 * quad);
            a[r] = ((lds32(b[r] + 48 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu) | (((qh_lo >> j) & 0x01010101u) << 4);
            a[2 + r] = ((lds32(b[r] + 64 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu) | (((qh_hi >> j) & 0x01010101u) << 4);
        }
    }

    __device__ __forceinline__ int scale(int j, int, int r) const { return (int)ubyte(sc[r][j >> 2], j & 3); }
};

// Bytes q in 0..63 to the signed bytes q - 32 (no carries: q + 0x60 < 256).
__device__ __forceinline__ uint32_t minus32_bytes(uint32_t q) { return (q + 0x60606060u) ^ 0x80808080u; }

// Q6_K, 210 B (only 2-byte aligned): ql[128], qh[64], int8 scales[16], f16 d. Group j is
// half h = j / 4, group G = j % 4 of that half; its value l has low 4 bits in
// ql[64h + 32 (G & 1) + l] (nibble G >> 1) and high 2 bits in qh[32h + l] (bits 2G..2G+1).
// 16-value sub-blocks: value = (d * sc[16-value index]) * (q - 32); the mma takes q - 32.
struct ReaderQ6K {
    static constexpr int kChunkBytes = 210, kGroupBytes = 0;
    static constexpr bool kHalves = true, kOffset = false, kIntScale = true;
    const uint8_t *b[2];
    uint32_t sc[2][4];  // the 16 int8 scales of each row
    float d[2], negmin[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int w = 0; w < 4; ++w) sc[r][w] = lds32_a2(b[r] + 192 + 4 * w);
            d[r] = f16_to_f32(lds16(b[r] + 208));
            negmin[r] = 0.0f;
        }
    }

    __device__ __forceinline__ void weights(int j, int quad, uint32_t a[4]) const {
        const int h = j >> 2, G = j & 3;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int s = 0; s < 2; ++s) {  // s = 0: values 4*quad.., 1: 16 + 4*quad..
                const int l = 16 * s + 4 * quad;
                const uint32_t ql = lds32_a2(b[r] + 64 * h + 32 * (G & 1) + l);
                const uint32_t qh = lds32_a2(b[r] + 128 + 32 * h + l);
                a[2 * s + r] = minus32_bytes(((ql >> (4 * (G >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * G)) & 0x03030303u) << 4));
            }
        }
    }

    // Sub-block 8h + 2G + s (16 values) of row r: int8 scale.
    __device__ __forceinline__ int scale(int j, int s, int r) const {
        const int idx = 8 * (j >> 2) + 2 * (j & 3) + s;
        return sbyte(sc[r][idx >> 2], idx & 3);
    }
};

}  // namespace mm
