// Row readers for IQ4_XS (256-value super-blocks) and the 32-value block types Q8_0, Q5_0.
// Layouts as in luce/gguf/quants_iq.py and quants_legacy.py (ggml's). Same interface as
// cuda/matmul_kquants.cuh; a "chunk" of a 32-value type is 8 blocks (256 values), the last
// chunk of a row may hold fewer (`ngroups`). Q8_0 and Q5_0 blocks are only 2-byte aligned.
#pragma once

#include "matmul_mma.cuh"

namespace mm {

// IQ4_XS table (ggml's kvalues_iq4nl) as 4 little-endian words of int8.
constexpr uint32_t kIq4Table0 = 0xBFAD9881u;  // -127, -104, -83, -65
constexpr uint32_t kIq4Table1 = 0xF6EADDCFu;  // -49, -35, -22, -10
constexpr uint32_t kIq4Table2 = 0x26190D01u;  // 1, 13, 25, 38
constexpr uint32_t kIq4Table3 = 0x71594535u;  // 53, 69, 89, 113

// prmt takes one of its two data words from a register: the table's words 0 and 2 (1 and 3 are
// immediates). Held in registers, loaded through a lane-dependent address so that ptxas can
// neither fold them to constants nor keep them in uniform registers (it did both with an
// immediate or a uniform load, then copied them into a register before every prmt: ~56 moves a
// batch of 4 rows in the one-row kernel, 8 a group in the tile kernels).
__device__ const uint32_t kIq4TableA[4] = {kIq4Table0, kIq4Table0, kIq4Table2, kIq4Table2};

// w holds 8 4-bit table indices (byte i: low nibble index of value i, high nibble of value
// i + 16); t0 / t2 the table's words 0 / 2. Returns the table values of the low nibbles (lo)
// and of the high nibbles (hi). Every selector has bit 3 of its nibbles clear (prmt_clear).
__device__ __forceinline__ void iq4_lookup(uint32_t w, uint32_t t0, uint32_t t2, uint32_t &lo, uint32_t &hi) {
    const uint32_t idx3 = w & 0x77777777u;                          // index within a half table
    const uint32_t half = 0x32103210u + ((w & 0x88888888u) >> 1);  // nibble i: byte i or i + 4
    // Nibbles of w in order: lo0 hi0 lo1 hi1 | lo2 hi2 lo3 hi3.
    const uint32_t v01 = prmt_clear(prmt_clear(t0, kIq4Table1, idx3), prmt_clear(t2, kIq4Table3, idx3), half);
    const uint32_t v23 = prmt_clear(prmt_clear(t0, kIq4Table1, idx3 >> 16), prmt_clear(t2, kIq4Table3, idx3 >> 16),
                                    half >> 16);
    lo = prmt_clear(v01, v23, 0x6420);
    hi = prmt_clear(v01, v23, 0x7531);
}

// IQ4_XS, 136 B: f16 d, u16 scales_h, scales_l[4], qs[128]; qs[16j + l] low nibble = index of
// value l, high nibble = value l + 16 of sub-block j. Value = (d * (ls - 32)) * table[index];
// integer scale ls - 32 (matmul_kquants.cuh's integer-scale interface).
struct ReaderIQ4XS {
    static constexpr int kChunkBytes = 136, kGroupBytes = 0;
    static constexpr bool kHalves = false, kOffset = false, kIntScale = true;
    const uint8_t *b[2];
    uint32_t ls_lo[2], ls_hi[2];  // scales_l (4-bit each), scales_h (2-bit each, at bit 2j)
    uint32_t t0, t2;              // the table's words 0 and 2 (iq4_lookup)
    float d[2], negmin[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int quad, int) {
        b[0] = b0;
        b[1] = b1;
        t0 = __ldg(&kIq4TableA[quad & 1]);
        t2 = __ldg(&kIq4TableA[2 + (quad & 1)]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint2 head = *reinterpret_cast<const uint2 *>(b[r]);
            ls_lo[r] = head.y;
            ls_hi[r] = head.x >> 16;
            d[r] = f16_to_f32(head.x);
            negmin[r] = 0.0f;
        }
    }

    __device__ __forceinline__ void weights(int j, int quad, uint32_t a[4]) const {
#pragma unroll
        for (int r = 0; r < 2; ++r) iq4_lookup(lds32(b[r] + 8 + 16 * j + 4 * quad), t0, t2, a[r], a[2 + r]);
    }

    __device__ __forceinline__ int scale(int j, int, int r) const {
        return (int)(((ls_lo[r] >> (4 * j)) & 15) | (((ls_hi[r] >> (2 * j)) & 3) << 4)) - 32;
    }
};

// Q8_0, 34 B: f16 d, int8 q[32]. Value = q * d.
struct ReaderQ80 {
    static constexpr int kChunkBytes = 8 * 34, kGroupBytes = 34;
    static constexpr bool kHalves = false, kOffset = false, kIntScale = false;
    const uint8_t *b[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
    }

    __device__ __forceinline__ void group(int j, int quad, GroupOperands &op) const {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint8_t *blk = b[r] + 34 * j;
            op.a[r] = lds32_a2(blk + 2 + 4 * quad);
            op.a[2 + r] = lds32_a2(blk + 18 + 4 * quad);
            op.scale[0][r] = f16_to_f32(lds16(blk));
            op.offset[0][r] = 0.0f;
        }
    }
};

// Bits 0..3 of v moved to bit 4 of bytes 0..3.
__device__ __forceinline__ uint32_t spread_bit4(uint32_t v) {
    return ((v * 0x00204081u) & 0x01010101u) << 4;
}

// Q5_0's offset per group: value = d * q + q50_offset(d), q = 0..31.
__device__ __forceinline__ float q50_offset(float d) { return -16.0f * d; }

// Q5_0, 22 B: f16 d, u32 qh, qs[16]; value l < 16: low nibble of qs[l], value l + 16: high
// nibble of qs[l]; bit 4 of value l is bit l of qh. Value = d * (q - 16).
struct ReaderQ50 {
    static constexpr int kChunkBytes = 8 * 22, kGroupBytes = 22;
    static constexpr bool kHalves = false, kOffset = true, kIntScale = false;
    const uint8_t *b[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
    }

    __device__ __forceinline__ void group(int j, int quad, GroupOperands &op) const {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint8_t *blk = b[r] + 22 * j;
            const uint32_t qh = lds32_a2(blk + 2), qs = lds32_a2(blk + 6 + 4 * quad);
            op.a[r] = (qs & 0x0F0F0F0Fu) | spread_bit4((qh >> (4 * quad)) & 15);
            op.a[2 + r] = ((qs >> 4) & 0x0F0F0F0Fu) | spread_bit4((qh >> (16 + 4 * quad)) & 15);
            op.scale[0][r] = f16_to_f32(lds16(blk));
            op.offset[0][r] = q50_offset(op.scale[0][r]);
        }
    }
};

}  // namespace mm
