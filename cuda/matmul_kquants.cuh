// Row readers for the K-quants (256-value super-blocks): Q4_K, Q5_K, Q6_K.
// Layouts as in luce/gguf/quants_k.py (ggml's). A reader points at one super-block ("chunk")
// of the thread's two weight rows in a shared-memory stage (matmul_stage.cuh), keeps its
// header and turns group j (values 32j..32j+31) into mma operands (matmul_mma.cuh): the lane
// `quad` of its quad reads values 4*quad..+3 and 16 + 4*quad..+3 of every group. Scales
// follow ggml's f32 operations (d * sc first).
#pragma once

#include "matmul_mma.cuh"

namespace mm {

// Q4_K / Q5_K header: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs (uint4 h).
__device__ __forceinline__ void k_scale_min(const uint4 &h, int j, float &scale, float &offset) {
    uint32_t sc, m;
    if (j < 4) {
        sc = byte_of(h.y, j) & 63;
        m = byte_of(h.z, j) & 63;
    } else {
        sc = (byte_of(h.w, j - 4) & 15) | ((byte_of(h.y, j - 4) >> 6) << 4);
        m = (byte_of(h.w, j - 4) >> 4) | ((byte_of(h.z, j - 4) >> 6) << 4);
    }
    scale = __fmul_rn(f16_to_f32(h.x), small_uint_to_f32(sc));
    offset = -__fmul_rn(f16_to_f32(h.x >> 16), small_uint_to_f32(m));
}

// Q4_K, 144 B: header[16], qs[128]; qs[32i + l] low nibble = sub-block 2i value l, high
// nibble = sub-block 2i+1 value l. Value = (d * sc) * q - dmin * m.
struct ReaderQ4K {
    static constexpr int kChunkBytes = 144, kGroupBytes = 0;
    static constexpr bool kHalves = false, kOffset = true;
    const uint8_t *b[2];
    uint4 head[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
        head[0] = *reinterpret_cast<const uint4 *>(b0);
        head[1] = *reinterpret_cast<const uint4 *>(b1);
    }

    __device__ __forceinline__ void group(int j, int quad, GroupOperands &op) const {
        const int i = j >> 1, sh = 4 * (j & 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            op.a[r] = (lds32(b[r] + 16 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu;
            op.a[2 + r] = (lds32(b[r] + 32 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu;
            k_scale_min(head[r], j, op.scale[0][r], op.offset[0][r]);
        }
    }
};

// Q5_K, 176 B: header[16], qh[32], qs[128]; as Q4_K plus bit j of qh[l] = bit 4 of
// sub-block j value l.
struct ReaderQ5K {
    static constexpr int kChunkBytes = 176, kGroupBytes = 0;
    static constexpr bool kHalves = false, kOffset = true;
    const uint8_t *b[2];
    uint4 head[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
        head[0] = *reinterpret_cast<const uint4 *>(b0);
        head[1] = *reinterpret_cast<const uint4 *>(b1);
    }

    __device__ __forceinline__ void group(int j, int quad, GroupOperands &op) const {
        const int i = j >> 1, sh = 4 * (j & 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint32_t qh_lo = lds32(b[r] + 16 + 4 * quad), qh_hi = lds32(b[r] + 32 + 4 * quad);
            op.a[r] = ((lds32(b[r] + 48 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu) | (((qh_lo >> j) & 0x01010101u) << 4);
            op.a[2 + r] = ((lds32(b[r] + 64 + 32 * i + 4 * quad) >> sh) & 0x0F0F0F0Fu) | (((qh_hi >> j) & 0x01010101u) << 4);
            k_scale_min(head[r], j, op.scale[0][r], op.offset[0][r]);
        }
    }
};

// Q6_K, 210 B (only 2-byte aligned): ql[128], qh[64], int8 scales[16], f16 d. Group j is
// half h = j / 4, group G = j % 4 of that half; its value l has low 4 bits in
// ql[64h + 32 (G & 1) + l] (nibble G >> 1) and high 2 bits in qh[32h + l] (bits 2G..2G+1).
// 16-value sub-blocks: value = (d * sc[16-value index]) * (q - 32), so offset = -32 * scale.
struct ReaderQ6K {
    static constexpr int kChunkBytes = 210, kGroupBytes = 0;
    static constexpr bool kHalves = true, kOffset = true;
    const uint8_t *b[2];
    float d[2];

    __device__ __forceinline__ void load(const uint8_t *b0, const uint8_t *b1, int, int) {
        b[0] = b0;
        b[1] = b1;
        d[0] = f16_to_f32(lds16(b0 + 208));
        d[1] = f16_to_f32(lds16(b1 + 208));
    }

    __device__ __forceinline__ void group(int j, int quad, GroupOperands &op) const {
        const int h = j >> 2, G = j & 3;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int s = 0; s < 2; ++s) {  // s = 0: values 4*quad.., 1: 16 + 4*quad..
                const int l = 16 * s + 4 * quad;
                const uint32_t ql = lds32_a2(b[r] + 64 * h + 32 * (G & 1) + l);
                const uint32_t qh = lds32_a2(b[r] + 128 + 32 * h + l);
                op.a[2 * s + r] = ((ql >> (4 * (G >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * G)) & 0x03030303u) << 4);
                const int idx = 8 * h + 2 * G + s;  // 16-value sub-block of this half
                const uint32_t biased = (lds16(b[r] + 192 + (idx & ~1)) >> (8 * (idx & 1)) & 0xFF) ^ 0x80u;
                op.scale[s][r] = __fmul_rn(d[r], small_uint_to_f32(biased) - 128.0f);  // int8 sc
                op.offset[s][r] = -32.0f * op.scale[s][r];
            }
        }
    }
};

}  // namespace mm
