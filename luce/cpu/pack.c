/* Packing of Q4_K, Q6_K, Q5_0 and Q8_0 weights into the column-interleaved layout of packed.h, from the
 * canonical integers of decode.h (portable C; runs once per weight at load). */
#include "cpu_ops.h"
#include "decode.h"
#include "packed.h"

/* bytes of one packed record (16 columns' block) of a kind, 0 if the kind does not pack */
static int record_bytes(int kind) {
    switch (kind) {
    case MM_Q4_K: return PACKED_Q4_K;
    case MM_Q6_K: return PACKED_Q6_K;
    case MM_Q5_0: return PACKED_Q5_0;
    case MM_Q8_0: return PACKED_Q8_0;
    default: return 0;
    }
}

int64_t luce_cpu_packed_bytes(int32_t qtype, int64_t n, int64_t k) {
    const int kind = mm_kind(qtype);
    if (kind < 0 || !record_bytes(kind) || n <= 0 || n % PACK_COLS || k <= 0 || k % mm_block_values(kind)) return -1;
    return n / PACK_COLS * (k / mm_block_values(kind)) * record_bytes(kind);
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

static void pack_q5_0(const uint8_t *blk, int c, uint8_t *rec) {
    decoded_block d;
    decode_q5_0(blk, &d);
    memcpy(rec + 2 * c, blk, 2);
    for (int h = 0; h < 4; h++)
        for (int e = 0; e < 4; e++) {
            const int lo = (d.q[8 * h + e] + 16) & 15, hi = (d.q[8 * h + 4 + e] + 16) & 15;
            rec[32 + 64 * h + 4 * c + e] = (uint8_t)(lo | (hi << 4));
        }
    for (int e = 0; e < 4; e++) {
        int bits = 0;
        for (int i = 0; i < 8; i++) bits |= ((d.q[4 * i + e] + 16) >> 4) << i;
        rec[288 + 4 * c + e] = (uint8_t)bits;
    }
}

static void pack_q8_0(const uint8_t *blk, int c, uint8_t *rec) {
    decoded_block d;
    decode_q8_0(blk, &d);
    memcpy(rec + 2 * c, blk, 2);
    for (int g = 0; g < 8; g++)
        for (int e = 0; e < 4; e++) rec[32 + 64 * g + 4 * c + e] = (uint8_t)(d.q[4 * g + e] + 128);
}

int luce_cpu_pack(const uint8_t *w, int32_t qtype, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out) {
    const int kind = mm_kind(qtype);
    if (luce_cpu_packed_bytes(qtype, n, k) < 0 || luce_cpu_row_bytes(qtype, k) != row_bytes) return LUCE_CPU_EARG;
    const int64_t nb = k / mm_block_values(kind), bb = mm_block_bytes(kind), pb = record_bytes(kind);
    for (int64_t g = 0; g < n / PACK_COLS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rec = out + (g * nb + b) * pb;
            for (int c = 0; c < PACK_COLS; c++) {
                const uint8_t *blk = w + (g * PACK_COLS + c) * row_bytes + b * bb;
                switch (kind) {
                case MM_Q4_K: pack_q4_k(blk, c, rec); break;
                case MM_Q6_K: pack_q6_k(blk, c, rec); break;
                case MM_Q5_0: pack_q5_0(blk, c, rec); break;
                default: pack_q8_0(blk, c, rec); break;
                }
            }
        }
    return LUCE_CPU_OK;
}
