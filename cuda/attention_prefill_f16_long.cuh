// The long-context form of the staged f16 prompt-row kernel (cuda/attention_prefill_f16.cuh: its
// arithmetic; cuda/attention_prefill_f16_staged.cuh: the f16 key staging and cp.async ring it
// shares). LUCE_ATTN_PROMPT=f16l (6 warps, a tile of 96 query vectors, 3-stage ring, two blocks
// an SM), f16l4 (4 warps, 64 query vectors, 2-stage ring, three blocks an SM) or f16l2 (4 warps
// of two m-tiles, 128 query vectors, 2-stage ring, two blocks an SM); D <= 128.
// What differs from the 8-warp staged form, none of it in a row's arithmetic:
//   - a block walks a run of consecutive splits [s0, s1) of its tile (grid z: runs of
//     `per_block` splits, chosen by the launch to fill the device; LUCE_ATTN_SPLITS_PER_BLOCK
//     sets it): the rows' keys are read and Q is converted once for the run, and the cp.async
//     ring streams the run's key blocks without a break at a split boundary, where the block
//     writes the split's partial (workspace entry s, exactly as the one-split blocks do) and
//     starts the next split's online softmax from m = -inf, l = 0, o = 0. The per-block start
//     (row keys, the tile's Q from f32, the ring's first loads) and the drain at the end come
//     once a run, not once a split;
//   - f16l, f16l4: one m-tile (16 query vectors) a warp with Q's A fragments in registers (32),
//     o [D/8][4] (64 at D = 128) and s [8][4] (32): <= 168 registers (launch bounds), several
//     blocks an SM (12 warps), each with its own barriers, so one block's softmax overlaps
//     another's MMAs. At that budget the block-uniform state (piece rows, run, m-tiles' key
//     bounds, G) sits in shared memory (F16LongRun), read after barriers, not in registers;
//   - f16l2: two m-tiles a warp (the wide form's arithmetic order: f16_scores_mt, f16_pv), Q
//     in its own buffer ldmatrix'd each key block, so each K and V fragment feeds two MMAs:
//     per warp and key block (D = 128) 256 MMAs for 80 ldmatrix.x4 against 128 for 64 (shared
//     memory reads per MMA 0.31 x4, not 0.5), o [2][D/8][4] and s [2][8][4] in <= 255
//     registers, 8 warps an SM: the wide form's layout (session 12's ncu: latency-bound, 84
//     bytes spilled in the key loop) with runs of splits, whose start, Q conversion and ring
//     fill come once a run, not once a 1,024-key split;
//   - Q loads as float4, four of a thread's in flight (the launch takes another form where q is
//     not 16-byte aligned).
// sm_90 ptxas (CUDA 13.0): f16l 168 registers, no spill; f16l4 168, 28 bytes; f16l2 255, 96
// bytes (4 values reloaded and stored once a key block, against 256 MMAs); D = 64: 143 / 143 /
// 237, none.
// A row's splits, key blocks (64 keys at absolute positions), masks, MMAs, online softmax and
// partials are the other forms' (f16_scores / f16_scores_mt, f16_softmax, f16_pv,
// f16_write_warp, f16_write_end; zeros past the tile's last key), so every form gives the same
// bits and the combine merges them as before.
// Shared memory: STAGES buffers of K [64] then V [64] rows of D + 8 halves (34,816 bytes each at
// D = 128): f16l 104,448 (x2 an SM), f16l4 69,632 (x3 an SM), f16l2 69,632 + its Q tile
// 34,816 (x2 an SM). f16l and f16l4: Q passes through the last buffer into registers before
// that buffer's first key block lands.
#pragma once

#include <stdlib.h>

#include "attention_prefill_f16_staged.cuh"

namespace luce_attn {
namespace {

template <int D, int WARPS, int STAGES, int MT = 1>
struct F16Long {
    using S = F16Shape<D>;
    static constexpr int kThreads = WARPS * WARP_SIZE;
    static constexpr int kTileQV = 16 * MT * WARPS;                    // query vectors a tile
    static constexpr int kBufHalves = 2 * S::kBlockKeys * S::kStride;  // K then V rows of one block
    static constexpr int kQHalves = MT > 1 ? kTileQV * S::kStride : 0;  // Q's own buffer (MT = 2)
    static constexpr int kMinBlocks = MT > 1 || WARPS >= 6 ? 2 : 3;     // blocks an SM (<= 168 / 255 registers)
    static constexpr size_t kSmemBytes = sizeof(uint16_t) * ((size_t)STAGES * kBufHalves + kQHalves);
    static constexpr size_t kStaticBytes = sizeof(int32_t) * (3 * kTileQV + 2 * WARPS * MT + 12);
    static_assert(D <= 128, "Q's fragments in registers (MT = 1) or o of two m-tiles (MT = 2): D <= 128");
    static_assert(MT == 1 || MT == 2, "one or two m-tiles a warp");
    static_assert(STAGES >= 2, "a ring of at least two buffers");
    static_assert(MT > 1 || kTileQV * S::kStride <= kBufHalves, "Q passes through one K / V buffer");
};

// A piece's block-uniform state in shared memory (thread 0 writes it; every thread reads it after
// a barrier where it needs it, so that none of it holds a register over the key blocks).
template <int WARPS>  // WARPS: the block's m-tiles (warps x MT)
struct F16LongRun {
    int32_t next, end;      // the tile's next row (for_tile_pieces' r0) and its end
    int32_t piece_end;      // the piece's end (r1)
    int32_t group;          // G = Hq / Hkv
    const uint16_t *k;      // the run's first key in the K staging (V: st.v - st.k halves on)
    int32_t n_ok;           // keys of the run with staged data (zeros past)
    int32_t n_blocks;       // the run's key blocks
    int32_t n_any;          // the most keys of any row of the piece (tree rows too)
    int32_t warp[WARPS][2]; // the current split's n_warp, n_warp_min of each m-tile
};

// Splits a block of the long form walks (grid z: ceil(splits / per_block) runs): the run length
// whose waves of tile_blocks (tiles x KV heads) x runs blocks, each costing its splits plus a
// quarter split of start and drain, end first on a device holding `slots` blocks at once;
// ties to the longer run. LUCE_ATTN_SPLITS_PER_BLOCK (>= 1) sets it. Only the grid moves: a
// split's partial is the same in any run.
inline int32_t f16l_per_block(int64_t tile_blocks, int32_t splits, int64_t slots) {
    if (const char *e = getenv("LUCE_ATTN_SPLITS_PER_BLOCK"))
        if (atoi(e) >= 1) return min(atoi(e), max(splits, 1));
    if (slots <= 0 || splits <= 1) return 1;
    int32_t best = 1;
    double best_cost = 0.0;
    for (int32_t n = 1; n <= splits; ++n) {
        const int64_t blocks = tile_blocks * ((splits + n - 1) / n);
        const double cost = (double)((blocks + slots - 1) / slots) * (n + 0.25);
        if (n == 1 || cost <= best_cost) best = n, best_cost = cost;
    }
    return best;
}

// Key block at key j0 of the run into buf [2B][kStride]: this thread's 16-byte column c of rows
// r, r + THREADS / (D / 8), ... of K, then of V (zeros past n_ok).
template <int D, int THREADS, class Run>
__device__ __forceinline__ void f16l_copy_block(const Run &run, const StagedKv &st, int32_t j0, uint16_t *buf) {
    constexpr int B = F16Shape<D>::kBlockKeys, KS = F16Shape<D>::kStride, C = D / 8, STEP = THREADS / C;
    constexpr int N = (B + STEP - 1) / STEP;  // rows of K (and of V) a thread copies, the last maybe none
    static_assert(THREADS % C == 0, "a thread keeps one column");
    const int row = (int)threadIdx.x / C, c = (int)threadIdx.x % C;
    const int32_t left = run.n_ok - j0 - row;  // row r + STEP u has data where STEP u < left
    const uint16_t *k = run.k + ((uint32_t)(j0 + row) * (uint32_t)D + 8u * c);  // < 2^32: keys < 2^24
    const int64_t v_off = st.v - st.k;
    uint16_t *dst = buf + row * KS + 8 * c;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv)
#pragma unroll
        for (int u = 0; u < N; ++u) {
            if (B % STEP != 0 && u == N - 1 && row + STEP * u >= B) break;
            cp_async16(dst + (kv * B + STEP * u) * KS, k + (kv ? v_off : 0) + (int64_t)STEP * u * D, STEP * u < left);
        }
}

// q16 = f16(q * scale_log2) of the tile's nq query vectors into q_s [TILE][kStride] (zeros past
// nq): f16_store_q's values, by float4 loads (q 16-byte aligned: the launch asks), BATCH of a
// thread's in flight before their conversions.
template <int D, int TILE, int THREADS>
__device__ __forceinline__ void f16l_store_q(const luce_attention_params &p, int G, int32_t r0, int32_t hk, int nq,
                                             uint16_t *q_s) {
    constexpr int KS = F16Shape<D>::kStride, C4 = D / 4, N = TILE * C4, ITER = (N + THREADS - 1) / THREADS;
    constexpr int BATCH = 4;
    const float scale_log2 = p.scale * 1.44269504088896340736f;
    const float *q0 = p.q + ((int64_t)r0 * p.n_heads_q + (int64_t)hk * G) * D;
#pragma unroll 1
    for (int i0 = 0; i0 < ITER; i0 += BATCH) {
        float4 x[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int i = (int)threadIdx.x + (i0 + u) * THREADS, v = i / C4, c = 4 * (i % C4);
            x[u] = i < N && v < nq ? *reinterpret_cast<const float4 *>(q0 + (int64_t)(v / G) * p.n_heads_q * D +
                                                                       (int64_t)(v % G) * D + c)
                                   : zero4();
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int i = (int)threadIdx.x + (i0 + u) * THREADS, v = i / C4, c = 4 * (i % C4);
            if (i >= N) break;
            const uint32_t lo = tc::pack_f16x2(x[u].x * scale_log2, x[u].y * scale_log2);
            const uint32_t hi = tc::pack_f16x2(x[u].z * scale_log2, x[u].w * scale_log2);
            *reinterpret_cast<uint2 *>(q_s + v * KS + c) = make_uint2(lo, hi);
        }
    }
}

// The start of a piece of rows r0..r1-1 (threads < TILE: row_keys, row_state; thread 0: the
// run's block-uniform state for splits s0..s1-1, K from the staging); ends with a barrier.
template <int D, int TILE, class Run>
__device__ __forceinline__ void f16l_piece_start(const luce_attention_params &p, const StagedKv &st, int32_t hk,
                                                 int32_t s0, int32_t s1, int32_t r0, int32_t r1, int32_t *row_keys,
                                                 int32_t *row_state, Run *run) {
    if (threadIdx.x < TILE) {
        int32_t n = 0, state = 0;
        const int32_t row = r0 + (int32_t)threadIdx.x;
        if (row < r1) {
            n = max(attention_row_keys(p, row).keys, 0);
            state = p.tree_parents != nullptr && p.tree_parents[row] >= 0;
        }
        row_keys[threadIdx.x] = n;
        row_state[threadIdx.x] = state;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        run->piece_end = r1;
        int32_t n_total = 0, n_any = 0;  // the most keys of a prompt row (of any row) of the piece
        for (int r = 0; r < r1 - r0; ++r) {
            n_any = max(n_any, row_keys[r]);
            if (!row_state[r]) n_total = max(n_total, row_keys[r]);
        }
        const int32_t key_lo = s0 * kSplitKeys, key_hi = min(s1 * kSplitKeys, n_total);
        const StagedSource src = staged_source<D>(p, st, r0, hk, key_lo, n_total - key_lo);
        run->k = src.k;
        run->n_ok = src.n_ok;
        run->n_blocks = key_hi > key_lo ? (key_hi - key_lo + F16Shape<D>::kBlockKeys - 1) / F16Shape<D>::kBlockKeys : 0;
        run->n_any = n_any;
    }
    __syncthreads();
}

// One block-uniform piece of the long form (for_tile_pieces' with r0 in shared memory): rows
// r0 = run->next .. r1 - 1 of one segment, all in the tile (rows before run->end), splits
// s0..s1-1; sets run->next = r1. row_keys: each row's keys (all splits); row_n: the current split's (the
// other forms' row_n); row_state: a tree row; run: the piece's block-uniform state. MT = 1: Q's
// fragments in registers (through the ring's last buffer); MT = 2: Q in its own buffer after the
// ring, ldmatrix'd each key block, and each K / V fragment feeds both m-tiles of a warp.
template <int D, int WARPS, int STAGES, int MT>
__device__ void f16l_prompt_piece(const luce_attention_params &p, const StagedKv &st, int32_t G, int32_t hk,
                                  int32_t s0, int32_t s1, int32_t n_parts, uint16_t *smem,
                                  int32_t *row_keys, int32_t *row_n, int32_t *row_state,
                                  F16LongRun<WARPS * MT> *run) {
    using S = F16Shape<D>;
    using L = F16Long<D, WARPS, STAGES, MT>;
    constexpr int NT = S::kKeyTiles, KS = S::kStride, B = S::kBlockKeys;
    const int32_t r0 = run->next, r1 = min(run->end, p.qo_indptr[attention_segment_of(p, r0) + 1]);
    const int nq = (r1 - r0) * G;
    uint16_t *q_s = smem + (MT > 1 ? STAGES : STAGES - 1) * L::kBufHalves;  // buffer i: smem + i * kBufHalves

    f16l_piece_start<D, L::kTileQV>(p, st, hk, s0, s1, r0, r1, row_keys, row_state, run);
    const int n_blocks = run->n_blocks;
#pragma unroll
    for (int b = 0; b < STAGES - 1; ++b) {
        if (b < n_blocks) f16l_copy_block<D, L::kThreads>(*run, st, b * B, smem + b * L::kBufHalves);
        cp_async_commit();
    }
    const int warp = (int)(threadIdx.x / WARP_SIZE);
    const int first = 16 * MT * warp;  // the warp's first query vector
    uint32_t qf[MT == 1 ? D / 16 : 1][4];
    if (n_blocks > 0) {
        f16l_store_q<D, L::kTileQV, L::kThreads>(p, G, r0, hk, nq, q_s);
        if constexpr (MT == 1) {  // MT = 2: the key loop's first barrier orders Q before its reads
            __syncthreads();
            const int32_t q_off = f16_q_off<D>();
#pragma unroll
            for (int kd = 0; kd < D / 16; ++kd) tc::ldmatrix_x4(qf[kd], q_s + (q_off + 16 * kd));
        }
    }
    int b = 0;  // the run's next key block (runs start on a split: split s's first is 16 (s - s0))
    for (int32_t s = s0; s < s1; ++s) {
        const int32_t key0 = s * kSplitKeys;
        if (key0 >= run->n_any) break;  // no row has keys here or further: nothing to write
        if (threadIdx.x < L::kTileQV) row_n[threadIdx.x] = min(kSplitKeys, row_keys[threadIdx.x] - key0);
        __syncthreads();
        const int nqs = (run->piece_end - run->next) * run->group;
        F16Warp<D> w0(row_n, row_state, nqs, run->group, first);
        F16Warp<D> w1(row_n, row_state, MT > 1 ? nqs : 0, run->group, first + 16);  // MT = 1: unused
        F16Warp<D> *const w[2] = {&w0, &w1};
        if (threadIdx.x % WARP_SIZE == 0)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                run->warp[MT * warp + mt][0] = w[mt]->n_warp, run->warp[MT * warp + mt][1] = w[mt]->n_warp_min;
        __syncwarp();
        const int32_t b_first = b;
        for (; b < b_first + kSplitKeys / B; ++b) {
            if (b >= run->n_blocks) break;  // the run's last block was the split's last
            cp_async_wait<STAGES - 2>();  // this thread's pieces of block b have landed
            __syncthreads();              // everyone's have; block b - 1's readers (and Q's) are done
            if (b + STAGES - 1 < run->n_blocks)
                f16l_copy_block<D, L::kThreads>(*run, st, (b + STAGES - 1) * B,
                                                smem + ((b + STAGES - 1) % STAGES) * L::kBufHalves);
            cp_async_commit();
            const int32_t b0 = (b - b_first) * B;  // the block's first key in the split
            int32_t n_warp = 0;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                w[mt]->n_warp = run->warp[MT * warp + mt][0], w[mt]->n_warp_min = run->warp[MT * warp + mt][1];
                n_warp = max(n_warp, w[mt]->n_warp);
            }
            if (b0 >= n_warp) continue;  // warp-uniform: no row of the warp attends a key here
            const uint16_t *k_s = smem + (b % STAGES) * L::kBufHalves, *v_s = k_s + B * KS;
            if constexpr (MT == 1) {
                const auto q_frag = [&](int kd, uint32_t (&a)[4]) {
                    a[0] = qf[kd][0], a[1] = qf[kd][1], a[2] = qf[kd][2], a[3] = qf[kd][3];
                };
                float sc[NT][4];
                f16_scores<D>(sc, q_frag, k_s, f16_k_off<D>());
                f16_softmax_pv<D>(sc, b0, w0, v_s, f16_v_off<D>());
            } else {
                // An m-tile past its rows' keys is an exact no-op (a = 1, e = 0): the bits of the
                // one-m-tile forms, which skip it.
                float sc[MT][NT][4];
                f16_scores_mt<D, MT>(sc, q_s, f16_q_off<D>(first), k_s, f16_k_off<D>());
                uint32_t pa[MT][NT / 2][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) f16_softmax<D>(sc[mt], b0, *w[mt], pa[mt]);
                f16_pv<D, MT>(pa, w, v_s, f16_v_off<D>());
            }
        }
        // The piece's rows from shared memory again (no register held over the key blocks).
        const int32_t r0w = run->next, gw = run->group, nqw = (run->piece_end - r0w) * gw;
        // G passed from shared memory: no register holds it, or anything divided by it, over the key blocks.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) f16_write_warp<D>(p, *w[mt], gw, r0w, blockIdx.y, s, n_parts, first + 16 * mt);
        f16_write_end<L::kThreads>(p, gw, r0w, blockIdx.y, s, n_parts, nqw, row_n, row_state);  // ends with a sync
    }
    cp_async_wait<0>();
    if (threadIdx.x == 0) run->next = run->piece_end;
    __syncthreads();  // the next piece reuses the buffers and the row arrays
}

}  // namespace
}  // namespace luce_attn
