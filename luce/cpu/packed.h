/* Column-interleaved ("packed") Q4_K, Q6_K, Q5_0 and Q8_0 weights for the AVX-512 VNNI and AVX2 matmuls.
 *
 * The GGUF layout puts one output column's blocks in a row, so a SIMD dot product runs along
 * K and every block ends in a horizontal sum per column. The packed layout holds the same
 * integers for 16 consecutive columns side by side: one 32-bit lane per column, four
 * consecutive values of that column per lane. A VNNI instruction then multiplies four values
 * of 16 columns by one broadcast activation word, sums stay per column in their lane, and
 * no horizontal sum is needed: about a third of the instructions per row of the row-major
 * kernel (the multi-row verify and prompt steps were compute bound).
 *
 * The integers are exact and the float combine per block is blocks.h's, in block order, so
 * a packed matmul is bitwise the row-major one (tests/kernels/test_cpu_packed.py).
 *
 * A weight [N, K] (N % 16 == 0) packs to N / 16 groups; a group is K / 256 (K / 32) records,
 * one per block, in block order; record (g, b) holds block b of columns 16 g .. 16 g + 15:
 *
 * Q4_K, PACKED_Q4_K bytes (the GGUF blocks' 2304 plus 64 of unpacked scales):
 *   0     u32 dd[16]          the column's f16 d | f16 dmin << 16 (block bytes 0..3)
 *   64    u8  sc[8][16]       6-bit scale of sub-block j (32 values)
 *   192   u8  m[4][16][2]     mins of sub-blocks 2p, 2p + 1
 *   320   u8  q[8][4][16][4]  [j][h][column][e]: low nibble q[32 j + 8 h + e], high nibble
 *                             q[32 j + 8 h + 4 + e] (values 0..15)
 * Q6_K, PACKED_Q6_K bytes (exactly the GGUF blocks' 16 * 210), u = q + 32 in 0..63:
 *   0     u16 d[16]           f16 d
 *   32    i8  sc[8][16][2]    scales of sub-blocks 2p, 2p + 1 (16 values each)
 *   288   u8  lo[4][8][16][4] [quarter][h][column][e]: low nibble u[64 q + 8 h + e] & 15, high
 *                             nibble u[64 q + 8 h + 4 + e] & 15
 *   2336  u8  hi[4][4][16][4] [quarter][p][column][e]: bits 2 i, 2 i + 1 = u[64 q + 16 p + 4 i + e] >> 4
 * Q5_0, PACKED_Q5_0 bytes (16 * 22), u = q + 16 in 0..31:
 *   0     u16 d[16]           f16 d
 *   32    u8  lo[4][16][4]    [h][column][e]: low nibble u[8 h + e] & 15, high nibble u[8 h + 4 + e] & 15
 *   288   u8  hi[16][4]       [column][e]: bit i = u[4 i + e] >> 4
 * Q8_0, PACKED_Q8_0 bytes (16 * 34), u = q + 128 in 0..255:
 *   0     u16 d[16]           f16 d
 *   32    u8  u[8][16][4]     [g][column][e]: u[4 g + e]
 */
#ifndef LUCE_CPU_PACKED_H
#define LUCE_CPU_PACKED_H

#include "matmul.h"

#define PACK_COLS 16
#define PACKED_Q4_K 2368
#define PACKED_Q6_K 3360
#define PACKED_Q5_0 352
#define PACKED_Q8_0 544

/* bytes of a packed [n, k] weight of ggml type qtype; -1 if it does not pack (type, n % 16, k) */
int64_t luce_cpu_packed_bytes(int32_t qtype, int64_t n, int64_t k);

/* W [n, k] (rows row_bytes apart) -> out [luce_cpu_packed_bytes]; 0 or LUCE_CPU_EARG */
int luce_cpu_pack(const uint8_t *w, int32_t qtype, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out);

/* tile kernels over packed weights (j->w = the packed bytes; n0, n1 multiples of 16) per kind,
 * NULL where a kind has none or the build lacks the instruction set */
extern const mm_tile_fn mm_packed_avx512[MM_KINDS];
extern const mm_tile_fn mm_packed_avx2[MM_KINDS];   /* gemv_packed_avx2.c: the same layout, 8 lanes */

/* A packed tile kernel per type and the instruction set's table, from the including file's
 * q4_k_rows, q6_k_rows, q5_0_rows and q8_0_rows(j, group, t0, R): each 16-column group of
 * [n0, n1) once per MAX_ROWS (4) rows, the group's records staying in cache between passes. */
#define PACKED_ROWS_DISPATCH(name, rows)                                                \
    static void name(const mm_job *j, int64_t n0, int64_t n1) {                         \
        for (int64_t g = n0 / PACK_COLS; g < n1 / PACK_COLS; g++)                       \
            for (int64_t t0 = 0; t0 < j->T; t0 += 4) {                                  \
                switch (j->T - t0 >= 4 ? 4 : (int)(j->T - t0)) {                       \
                case 1: rows(j, g, t0, 1); break;                                       \
                case 2: rows(j, g, t0, 2); break;                                       \
                case 3: rows(j, g, t0, 3); break;                                       \
                default: rows(j, g, t0, 4); break;                                      \
                }                                                                       \
            }                                                                           \
    }

#define PACKED_KERNELS(isa)                                                             \
    _Static_assert(MAX_ROWS == 4, "PACKED_ROWS_DISPATCH passes up to 4 rows");          \
    PACKED_ROWS_DISPATCH(gemv_q4_k_packed_##isa, q4_k_rows)                             \
    PACKED_ROWS_DISPATCH(gemv_q6_k_packed_##isa, q6_k_rows)                             \
    PACKED_ROWS_DISPATCH(gemv_q5_0_packed_##isa, q5_0_rows)                             \
    PACKED_ROWS_DISPATCH(gemv_q8_0_packed_##isa, q8_0_rows)                             \
    const mm_tile_fn mm_packed_##isa[MM_KINDS] = {                                      \
        [MM_Q4_K] = gemv_q4_k_packed_##isa, [MM_Q6_K] = gemv_q6_k_packed_##isa,         \
        [MM_Q5_0] = gemv_q5_0_packed_##isa, [MM_Q8_0] = gemv_q8_0_packed_##isa};

#endif
