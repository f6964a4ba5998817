// Few-row decode matmul at large k (IQ4_XS, Q4_K, Q5_K, Q6_K, Q8_0; 2..8 rows of x; k > 6,144, the 27B's
// down projection 5120 x 17408; Q8_0 also where matmul_gemv_rows.cuh's stages do not fit, k = 6,144):
// y [M, n] = x [M, k] @ W^T (+ bias) with the same integers and float steps as the tile kernel
// (cuda/matmul.cu mmq_kernel, matmul_chunk.cuh mmq_chunk_int; Q8_0 mmq_chunk_float), the one-row
// kernels and the few-row kernel of matmul_gemv_rows.cuh, so every row of x gets bitwise the row it
// gets alone or in any other call (DESIGN 5 rule 6). Per (row, token) and chunk ch the exact
// integers SH, SL (and MS, the min term) give c = d * fma(SH, 256, SL) (+ negmin * MS); the chains
// acc_kp = fma(xscale_ch, c_ch, acc_kp) over chunks kp, kp + 4, ... in order and y = ((acc0 + acc1)
// + acc2) + acc3 (+ bias) run once a batch's c is whole: the order depends on k alone.
//
// Why: matmul_gemv_rows.cuh holds a chunk's x in a warp's registers for the whole launch (k <=
// 6,144); at k = 17,408 (68 chunks) that would take 68 warps and a batch of 16 rows 148 KB of stage,
// and the tile kernel took the down projection at 37-40 us for 2..8 rows against 18.3 for one row
// (H200, docs/PERF.md). A form with k in block-wide slices (one barrier a slice, x reloaded a slice)
// measured no faster (session 14) and was removed.
//
// Layout. A block of W warps (W = ceil(chunks / P), P = ceil(chunks / kRowsKMaxWarps) chunks a warp:
// 68 chunks, 12 warps, 8 of 6 chunks and 4 of 5) takes batches of 16 weight rows (one mma row tile)
// blockIdx.x, + gridDim.x, ... (one block an SM: 320 batches of the 27B's down over 132 blocks, 2-3
// each); warp w takes chunks w, w + W, ... of every batch, as the tile kernel's warps take theirs: its
// own ring of R stages of one 16-row chunk each (matmul_stage.cuh LaneCopier: per-lane cp.async of the
// aligned words, rows past n clamped to n - 1), running on across batches, so a warp never waits for
// another warp's copies; B fragments of its chunk read from global memory (L2) a chunk ahead, each
// group's into the registers of the fragments its products have just read (ldg_after; lanes of tokens
// >= M read token M - 1's: those columns of the products are never read, and no load is predicated).
// Per chunk the warp forms SH, SL per (row grp + 8 r, token 2 quad + e) with m16n8k32 (Q6_K: two
// m16n8k16 a group) as matmul_gemv_rows.cuh and stores c into c [cbufs][chunks][16][8] (shared). After
// its last chunk of a batch every warp meets the block barrier; the chains of that batch (64 M items,
// thread i: row i / (4 M), token (i / 4) % M, kp i % 4) run at once and store y; with one c buffer
// (cbufs = 1, where two do not fit) a second barrier follows before the next batch writes c.
//
// Few warps, many registers: the kernel is latency-bound (ncu, 17 warps of 96 registers: 0.42 issued a
// scheduler, long-scoreboard stalls a third of the cycles, SMs idle a quarter of the time once the
// blocks of 2 batches are done). H200, 27B down, 5 rows (helper rowsdown, 2026-12-04): at most 17
// warps (96 registers, spills) IQ4_XS 43.8 us, 16 (14 warps, 128) 34.6, 12 (168, no spills) 32.8
// against the tile kernel's 38.5; Q4_K 51.2 / 42.8 / 32.9 against 27.6.
//
// IQ4_XS (kSplit): the table lookup of matmul_gemv_staged.cuh's split form, T[n] = R1 + R2 with R1 =
// prmt(T[0..7], n) (n >= 8: -1) and R2 = prmt(T[8..15] + 1, n ^ 8) (n < 8: 0), 4 prmt a word instead of
// 8 (7 ALU instructions instead of ~15), the mma taking R1 and R2 in turn onto one accumulator (exact:
// int32 sums). A word's nibbles select in the order lo0 hi0 lo1 hi1 | lo2 hi2 lo3 hi3, so the k slots
// of the fragments are values {4q, 16 + 4q, 4q + 1, 17 + 4q} and {4q + 2, 18 + 4q, 4q + 3, 19 + 4q};
// x's words are permuted alike (byte_perm 0x5140 / 0x7362 of its high / low byte words): the same
// products, the same integer sums. Measured at 17 warps: 43.8 us at 5 rows against 47.2 with
// iq4_lookup (kGemvRowsKSplitIQ4XS).
//
// Shared memory at k = 17,408 (W = 12, two c buffers of 34,816 B, x scales 2,176 B): IQ4_XS 3 stages
// of 2,816 B a warp (101,376 B): 173,184 B; Q4_K likewise plus the byte planes of x's group sums
// (17,408): 190,592 B; Q5_K 3 stages of 3,328 B: 209,024 B; Q6_K 2 stages of 3,840 B: 163,968 B; Q8_0 2
// stages of 4,864 B: 188,544 B (at k = 6,144, 24 chunks: 12 warps of 2, 142,080 B). 227 KB
// devices (H100/H200) only; the tile kernel elsewhere (gemv_rows_k_runs: one c buffer must fit).
#pragma once

#include "matmul_gemv_rows.cuh"
#include "matmul_stage.cuh"

namespace mm {

constexpr int kRowsKMaxWarps = 12;  // warps a block (3 a scheduler: 168 registers a thread)
constexpr int kRowsKThreads = kRowsKMaxWarps * WARP_SIZE;

struct GemvRowsKArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XLayout x;
    int64_t n, row_bytes;
    int tokens;  // M, 2..8
    int cbufs;   // c buffers: 2 (the next batch writes the other one), or 1 (a second barrier a batch)
};

// Warps of a block: P = ceil(chunks / kRowsKMaxWarps) chunks a warp, W = ceil(chunks / P).
inline int gemv_rows_k_warps(int64_t chunks) {
    const int64_t per_warp = (chunks + kRowsKMaxWarps - 1) / kRowsKMaxWarps;
    return (int)((chunks + per_warp - 1) / per_warp);
}

// Stages a warp: 3 where a stage is at most 3,328 B (IQ4_XS, Q4_K, Q5_K), else 2 (Q6_K).
template <class Q>
__host__ __device__ constexpr int gemv_rows_k_stages() { return Stage<Q>::kBytes <= 3328 ? 3 : 2; }

// Dynamic shared memory: W warps' stages, c [cbufs][chunks][16][8], xscale [8][chunks] (floats), for
// the types with mins the byte planes [chunks][8] of x's group sums (2 uint4 a token, matmul_x.cuh).
template <class Q>
size_t gemv_rows_k_smem_bytes(int64_t chunks, int cbufs) {
    return (size_t)gemv_rows_k_warps(chunks) * gemv_rows_k_stages<Q>() * Stage<Q>::kBytes +
           (size_t)(cbufs * kRowsTile + 1) * kRowsMaxTokens * chunks * sizeof(float) +
           (Q::kOffset ? (size_t)kRowsMaxTokens * chunks * 2 * sizeof(uint4) : 0);
}

#if defined(__HIPCC__)
#define LUCE_GEMV_ROWS_K_BOUNDS __launch_bounds__(kRowsKThreads)
#else
#define LUCE_GEMV_ROWS_K_BOUNDS __launch_bounds__(kRowsKThreads, 1)
#endif

// IQ4_XS group j of the reader's two rows in the split lookup (header; t0, u0: the low words of T[0..7]
// and of T[8..15] + 1 in registers): p1 + p2 = the table values,
// fragments in the split k order (p[r]: values {4q, 16 + 4q, 4q + 1, 17 + 4q}, p[2 + r]: {4q + 2,
// 18 + 4q, 4q + 3, 19 + 4q} of row grp + 8 r).
__device__ __forceinline__ void iq4_split_weights(const ReaderIQ4XS &rd, int j, int quad, uint32_t t0, uint32_t u0,
                                                  uint32_t p1[4], uint32_t p2[4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const uint32_t w = lds32(rd.b[r] + 8 + 16 * j + 4 * quad), f = w ^ 0x88888888u;
        p1[r] = prmt_sign(t0, kIq4Table1, w);
        p1[2 + r] = prmt_sign(t0, kIq4Table1, w >> 16);
        p2[r] = prmt_sign(u0, kIq4High1Hi, f);
        p2[2 + r] = prmt_sign(u0, kIq4High1Hi, f >> 16);
    }
}

// A read-only load of p issued after `after` is known (the group's products: the load may take the
// registers of the B fragments they read) and where it stands (volatile: nvcc otherwise sinks the 8
// loads of the next chunk's fragments past the chunk's work and moves registers around them).
__device__ __forceinline__ uint4 ldg_after(const uint4 *p, int after) {
#ifdef LUCE_MM_PORTABLE
    (void)after;
    return *p;
#else
    uint4 v;
    asm volatile("{ .reg .b32 t; mov.b32 t, %5; ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4]; }"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "r"(after));
    return v;
#endif
}

template <class Q, int R, bool kSplit>
__global__ void LUCE_GEMV_ROWS_K_BOUNDS gemv_rows_k_kernel(GemvRowsKArgs a) {
    static_assert(Q::kIntScale != (Q::kGroupBytes != 0) && (Q::kIntScale || !Q::kOffset),
                  "integer-scale chunks, or Q8_0's scaled groups (Q5_0's offsets: matmul_gemv_rows.cuh only)");
    static_assert(!kSplit || (!Q::kHalves && !Q::kOffset && Q::kChunkBytes == 136), "the split lookup is IQ4_XS's");
    using Copier = LaneCopier<Q, R>;
    extern __shared__ uint4 gemv_rows_k_words[];  // 16-byte aligned
    uint8_t *smem = reinterpret_cast<uint8_t *>(gemv_rows_k_words);
    const int chunks = (int)a.x.chunks, n = (int)a.n, M = a.tokens, W = (int)blockDim.x / WARP_SIZE;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    uint8_t *warp_stages = smem + (size_t)warp * R * Copier::kStageBytes;
    float *c_s = reinterpret_cast<float *>(smem + (size_t)W * R * Copier::kStageBytes);  // [cbufs][chunks][16][8]
    float *xd_s = c_s + a.cbufs * chunks * kRowsTile * kRowsMaxTokens;                   // [8][chunks]
    uint4 *xp_s = reinterpret_cast<uint4 *>(xd_s + kRowsMaxTokens * chunks);             // [chunks][8][2] (kOffset)

    // The block's batches blockIdx.x, + gridDim.x, ... (turn t: the t-th), batch b at row 16 b (a last
    // one past n: its rows >= n read row n - 1 and are not stored).
    const int batches = (n + kRowsTile - 1) / kRowsTile, row_step = (int)gridDim.x * kRowsTile;
    const int turns = (int)blockIdx.x < batches ? (batches - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int count = (chunks - warp + W - 1) / W;  // the warp's chunks a batch (W <= chunks: >= 1)
    auto tile_row = [&](int t) { return (int)blockIdx.x * kRowsTile + t * row_step; };

    Copier copier(warp_stages, a.w, a.w_end, a.row_bytes, a.n, lane);
    int fill_t = 0, fill_i = 0;  // the next copy: turn fill_t, the warp's chunk fill_i
    auto copy_next = [&](int s) {
        if (fill_t < turns) {
            copier.copy(s, tile_row(fill_t), warp + (int64_t)W * fill_i, lane);
            if (++fill_i == count) {
                fill_i = 0;
                ++fill_t;
            }
        }
        copier.commit();  // one group a chunk, empty or not: the wait for R - 1 pending counts chunks
    };
#pragma unroll
    for (int s = 0; s < R - 1; ++s) copy_next(s);  // weights before the kernel ahead ends
    wait_for_prior_kernels();                      // x is written by the kernel ahead
    let_dependents_start();

    // B fragments of the warp's first chunk: token grp's quad of each group (past M token M - 1's: the
    // mma's columns of tokens >= M are never read, and every lane loads, unpredicated).
    const uint4 *x_row = a.x.xq + (int64_t)min(grp, M - 1) * a.x.groups * 4 + quad;
    uint4 xb[kGroups];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) xb[j] = __ldg(x_row + ((int64_t)warp * kGroups + j) * 4);
    gemv_rows_stage_x<Q>(a.x, M, chunks, xd_s, xp_s, tid);
    __syncthreads();  // the scales and planes, everyone's

    // Chains of turn t (matmul_gemv_rows.cuh's): item i = 4 * (M r + m) + kp takes acc_kp of row r,
    // token m over chunks kp, kp + 4, ... in order; 64 M items (whole warps).
    auto chains = [&](int t, const float *c_b) {
        const int tile = tile_row(t);
        for (int i = tid; i < 4 * kRowsTile * M; i += blockDim.x) {
            float v = gemv_rows_chain(c_b, xd_s, i, M, chunks);
            const int item = i >> 2, r = item / M, m = item - r * M, row = tile + r;
            if ((i & 3) == 0 && row < n) {
                if (a.bias) v = v + a.bias[row];
                a.y[(int64_t)m * n + row] = v;
            }
        }
    };

    int fill = R - 1, use = 0;  // the stages of the next copy and of the next chunk used
    // (kSplit) the tables' low words, through lane-dependent addresses: registers of their own (constants
    // would be copied from a uniform register before each prmt that takes them).
    const uint32_t t0 = kSplit ? __ldg(&kIq4SplitA[lane & 1]) : 0;
    const uint32_t u0 = kSplit ? __ldg(&kIq4SplitA[2 + (lane & 1)]) : 0;
    for (int t = 0; t < turns; ++t) {
        const int tile = tile_row(t);
        const uint8_t *w0 = a.w + (int64_t)min(tile + grp, n - 1) * a.row_bytes;
        const uint8_t *w1 = a.w + (int64_t)min(tile + grp + 8, n - 1) * a.row_bytes;
        float *c_b = c_s + (a.cbufs == 2 ? (t & 1) : 0) * chunks * kRowsTile * kRowsMaxTokens;
        for (int i = 0; i < count; ++i) {
            copy_next(fill);
            copier.wait();  // the chunk in stage `use` has landed, for every lane
            const int ch = warp + W * i;
            const uint8_t *st = warp_stages + use * Copier::kStageBytes;
            fill = fill + 1 == R ? 0 : fill + 1;
            use = use + 1 == R ? 0 : use + 1;
            Q rd;
            rd.load(staged_row<Q>(st, grp, w0 + (int64_t)ch * Q::kChunkBytes),
                    staged_row<Q>(st, grp + 8, w1 + (int64_t)ch * Q::kChunkBytes), quad, kGroups);
            // The warp's next chunk (the first of the next batch after its last; past the last turn a
            // harmless reload): its B fragments replace this chunk's group by group.
            const int64_t next = i + 1 < count ? ch + W : warp;
            const uint4 *x_next = x_row + next * kGroups * 4;
            if constexpr (!Q::kIntScale) {  // Q8_0 (whole chunks: gemv_rows_k_runs)
                float cacc[4] = {};
#pragma unroll
                for (int j = 0; j < kGroups; ++j) {
                    const uint4 b = xb[j];
                    xb[j] = ldg_after(x_next + 4 * j, gemv_rows_group_float(rd, j, grp, quad, b, cacc));
                }
                gemv_rows_put_c(cacc, grp, quad, c_b + ch * kRowsTile * kRowsMaxTokens);
            } else {
                int sh[4] = {}, sl[4] = {};
                auto add_scaled = [&](int j, int h, const int (&hi)[4], const int (&lo)[4]) {  // SH, SL += scale * sums
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int s = rd.scale(j, h, e >> 1);
                        sh[e] += s * hi[e];
                        sl[e] += s * lo[e];
                    }
                };
#pragma unroll
                for (int j = 0; j < kGroups; ++j) {
                    const uint4 b = xb[j];
                    int hi[4], lo[4];
                    if constexpr (kSplit) {
                        uint32_t p1[4], p2[4];
                        iq4_split_weights(rd, j, quad, t0, u0, p1, p2);
                        const uint32_t h0 = byte_perm(b.x, b.y, 0x5140), h1 = byte_perm(b.x, b.y, 0x7362);
                        const uint32_t l0 = byte_perm(b.z, b.w, 0x5140), l1 = byte_perm(b.z, b.w, 0x7362);
                        mma_k32<false>(p1, h0, h1, 0, hi);
                        mma_k32_acc<false>(p2, h0, h1, hi, hi);
                        mma_k32<true>(p1, l0, l1, 0, lo);
                        mma_k32_acc<true>(p2, l0, l1, lo, lo);
                        xb[j] = ldg_after(x_next + 4 * j, hi[0] ^ lo[0]);
                        add_scaled(j, 0, hi, lo);
                    } else {
                        uint32_t w[4];
                        rd.weights(j, quad, w);
                        if constexpr (!Q::kHalves) {
                            mma_k32<false>(w, b.x, b.y, 0, hi);
                            mma_k32<true>(w, b.z, b.w, 0, lo);
                            xb[j] = ldg_after(x_next + 4 * j, hi[0] ^ lo[0]);
                            add_scaled(j, 0, hi, lo);
                        } else {
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                mma_k16<false>(w[2 * h], w[2 * h + 1], h ? b.y : b.x, 0, hi);
                                mma_k16<true>(w[2 * h], w[2 * h + 1], h ? b.w : b.z, 0, lo);
                                if (h) xb[j] = ldg_after(x_next + 4 * j, hi[0] ^ lo[0]);
                                add_scaled(j, h, hi, lo);
                            }
                        }
                    }
                }
                gemv_rows_store_c(rd, sh, sl, xp_s, ch, grp, quad, c_b + ch * kRowsTile * kRowsMaxTokens);
            }
            __syncwarp();  // every lane is done with the stage before a later chunk refills it
        }
        __syncthreads();  // every warp's chunks of batch t: its c is whole
        chains(t, c_b);
        if (a.cbufs == 1) __syncthreads();  // the chains have read c before batch t + 1 writes it
    }
}

// The large-k form can run: 2..8 rows of x, more chunks than matmul_gemv_rows.cuh takes (Q8_0: any
// count of whole chunks), row indices as int, and one c buffer's shared memory within the device's
// opt-in limit (0: unknown, 48 KiB).
template <class Q>
bool gemv_rows_k_runs(int64_t rows, int64_t n, const XLayout &x, int smem_limit) {
    const bool chunks_ok = Q::kGroupBytes ? x.groups == x.chunks * kGroups : x.chunks > kRowsMaxChunks;
    return rows >= 2 && rows <= kRowsMaxTokens && chunks_ok && n < ((int64_t)1 << 30) &&
           gemv_rows_k_smem_bytes<Q>(x.chunks, 1) <= (size_t)(smem_limit > 0 ? smem_limit : 48 << 10);
}

}  // namespace mm
