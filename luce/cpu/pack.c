/* Packing of Q4_K and Q6_K weights into the column-interleaved layout of packed.h, from the
 * canonical integers of decode.h (portable C; runs once per weight at load). */
#include "cpu_ops.h"
#include "decode.h"
#include "packed.h"

static int packed_kind(int32_t qtype) {
    const int kind = mm_kind(qtype);
    return kind == MM_Q4_K || kind == MM_Q6_K ? kind : -1;
}

int64_t luce_cpu_packed_bytes(int32_t qtype, int64_t n, int64_t k) {
    const int kind = packed_kind(qtype);
    if (kind < 0 || n <= 0 || n % PACK_COLS || k <= 0 || k % QK_K) return -1;
    return n / PACK_COLS * (k / QK_K) * (kind == MM_Q4_K ? PACKED_Q4_K : PACKED_Q6_K);
}

static void pack_q4_k(const uint8_t *blk, int c, uint8_t *rec) {
    decoded_block d;
    decode_q4_k(blk, &d);
    memcpy(rec + 4 * c, blk, 4);
    for (int j = 0; j < 8; j++) rec[64 + 16 * j + c] = (uint8_t)d.sc[j];
    for (int p = 0; p < 4; p++) {
        rec[192 + 32 * p + 2 * c] = (uint8_t)d.m[2 * p];
        rec[192 + 32 * p + 2 * c + 1] = (uint8_t)d.m[2 * p + 1];
    }
    for (int j = 0; j < 8; j++)
        for (int h = 0; h < 4; h++)
            for (int e = 0; e < 4; e++) {
                const int v = 32 * j + 8 * h + e;
                rec[320 + 256 * j + 64 * h + 4 * c + e] = (uint8_t)(d.q[v] | (d.q[v + 4] << 4));
            }
}

static void pack_q6_k(const uint8_t *blk, int c, uint8_t *rec) {
    decoded_block d;
    decode_q6_k(blk, &d);
    memcpy(rec + 2 * c, blk + 208, 2);
    for (int p = 0; p < 8; p++) {
        rec[32 + 32 * p + 2 * c] = (uint8_t)(int8_t)d.sc[2 * p];
        rec[32 + 32 * p + 2 * c + 1] = (uint8_t)(int8_t)d.sc[2 * p + 1];
    }
    for (int q = 0; q < 4; q++) {
        for (int h = 0; h < 8; h++)
            for (int e = 0; e < 4; e++) {
                const int v = 64 * q + 8 * h + e;
                const int lo = (d.q[v] + 32) & 15, hi = (d.q[v + 4] + 32) & 15;
                rec[288 + 512 * q + 64 * h + 4 * c + e] = (uint8_t)(lo | (hi << 4));
            }
        for (int p = 0; p < 4; p++)
            for (int e = 0; e < 4; e++) {
                int bits = 0;
                for (int i = 0; i < 4; i++) bits |= ((d.q[64 * q + 16 * p + 4 * i + e] + 32) >> 4) << (2 * i);
                rec[2336 + 256 * q + 64 * p + 4 * c + e] = (uint8_t)bits;
            }
    }
}

int luce_cpu_pack(const uint8_t *w, int32_t qtype, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out) {
    const int kind = packed_kind(qtype);
    if (luce_cpu_packed_bytes(qtype, n, k) < 0 || luce_cpu_row_bytes(qtype, k) != row_bytes) return LUCE_CPU_EARG;
    const int64_t nb = k / QK_K, bb = mm_block_bytes(kind), pb = kind == MM_Q4_K ? PACKED_Q4_K : PACKED_Q6_K;
    for (int64_t g = 0; g < n / PACK_COLS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rec = out + (g * nb + b) * pb;
            for (int c = 0; c < PACK_COLS; c++) {
                const uint8_t *blk = w + (g * PACK_COLS + c) * row_bytes + b * bb;
                if (kind == MM_Q4_K) pack_q4_k(blk, c, rec);
                else pack_q6_k(blk, c, rec);
            }
        }
    return LUCE_CPU_OK;
}
