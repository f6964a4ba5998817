// The wide form of the staged f16 prompt-row kernel (cuda/attention_prefill_f16.cuh: its
// arithmetic; cuda/attention_prefill_f16_staged.cuh: the f16 key staging and cp.async copies it
// shares): the same tile of kTileQV = 128 query vectors and the same key blocks, but 4 warps
// of two m-tiles (32 query vectors) each instead of 8 warps of one, so that
//   - every K and V fragment a warp ldmatrix's feeds two MMAs (one per m-tile): per warp and
//     key block (D = 128, B = 64) 256 MMAs for 80 ldmatrix.x4 (16 Q, 32 K, 32 V), against the
//     8-warp form's 128 for 64: shared-memory reads per MMA 0.31 x4 instead of 0.5, ~188 bytes
//     an MMA with the cp.async writes instead of ~281 (at 128 B a cycle an SM, ~1.5 cycles an
//     MMA: below the ~1.6 of mma.sync's own rate on the H200, where the 8-warp form's 2.2 is above);
//   - two 128-thread blocks share an SM (< 128 KiB shared memory and <= 255 registers each):
//     each SM sub-partition runs one warp of each, and the blocks' __syncthreads are their own,
//     so one block's softmax (no tensor work) overlaps the other's MMAs, where the 8-warp
//     form's one block a SM moves all its warps through Q K^T, softmax and P V in step.
// Q stays in shared memory (ldmatrix'd each key block: two m-tiles of Q fragments would not
// fit beside o [2][D/8][4] and s [2][B/8][4]). Shared memory: Q [kTileQV][D + 8], then a ring of
// two buffers of K [B] and V [B] rows (104,448 bytes at D = 128: sm_80 / sm_90 only; 99 KiB
// cards keep the 8-warp staged form). A row's MMAs, masks, softmax and sums run in the
// 8-warp form's order (an m-tile is a warp's 16 vectors there; key blocks past an m-tile's
// rows are exact no-ops for it), so a row's bits are the same in every form.
#pragma once

#include "attention_prefill_f16_staged.cuh"

namespace luce_attn {
namespace {

template <int D>
struct F16Wide {
    using S = F16Shape<D>;
    static constexpr int kMTiles = 2;                         // m-tiles (16 query vectors) a warp
    static constexpr int kWarps = S::kTileQV / (16 * kMTiles);
    static constexpr int kThreads = kWarps * WARP_SIZE;
    static constexpr int kBufHalves = 2 * S::kBlockKeys * S::kStride;  // K then V rows of one block
    static constexpr size_t kSmemBytes = sizeof(uint16_t) * (size_t)(S::kTileQV * S::kStride + 2 * kBufHalves);
    static constexpr size_t kStaticBytes = 2 * sizeof(int32_t) * S::kTileQV;
    static_assert(D <= 128, "the wide form holds o of two m-tiles: D <= 128");
};

// One block-uniform piece of the wide form: rows r0..r1-1 of one segment, all in the tile.
template <int D>
__device__ void f16w_prompt_piece(const luce_attention_params &p, const StagedKv &st, int32_t r0, int32_t r1,
                                  int32_t hk, int32_t split, int32_t n_parts, uint16_t *smem, int32_t *row_n,
                                  int32_t *row_state) {
    using S = F16Shape<D>;
    using W = F16Wide<D>;
    constexpr int NT = S::kKeyTiles, KS = S::kStride, B = S::kBlockKeys, MT = W::kMTiles;
    const int G = p.n_heads_q / p.n_heads_kv;
    const int nq = (r1 - r0) * G;
    const int32_t key0 = split * kSplitKeys;
    uint16_t *q_s = smem, *bufs = smem + S::kTileQV * KS;  // buffer i: bufs + i * kBufHalves

    const int32_t n_tile = f16_piece_rows<D>(p, r0, r1, key0, row_n, row_state);
    const StagedSource src = staged_source<D>(p, st, r0, hk, key0, n_tile);
    const uint16_t *k_src = src.k, *v_src = src.v;
    const int32_t n_ok = src.n_ok;
    const int n_blocks = (n_tile + B - 1) / B;
    if (n_blocks > 0) f16s_copy_block<D, W::kThreads>(k_src, v_src, 0, n_ok, bufs);
    cp_async_commit();
    if (n_tile > 0) f16_store_q<D, W::kThreads>(p, r0, hk, nq, q_s);  // read after the loop's first sync

    const int first = 16 * MT * (int)(threadIdx.x / WARP_SIZE);
    F16Warp<D> w0(row_n, row_state, nq, G, first), w1(row_n, row_state, nq, G, first + 16);
    F16Warp<D> *const w[MT] = {&w0, &w1};
    const int32_t n_warp = max(w0.n_warp, w1.n_warp);
    const int32_t q_off = f16_q_off<D>(first), k_off = f16_k_off<D>(), v_off = f16_v_off<D>();
    for (int b = 0; b < n_blocks; ++b) {
        cp_async_wait<0>();  // this thread's pieces of block b have landed
        __syncthreads();     // everyone's have; block b - 1's readers are done with the other buffer
        if (b + 1 < n_blocks) f16s_copy_block<D, W::kThreads>(k_src, v_src, (b + 1) * B, n_ok, bufs + ((b + 1) & 1) * W::kBufHalves);
        cp_async_commit();
        const int32_t b0 = b * B;
        if (b0 >= n_warp) continue;  // warp-uniform: no row of the warp attends a key here
        const uint16_t *k_s = bufs + (b & 1) * W::kBufHalves, *v_s = k_s + B * KS;
        float s[MT][NT][4];
        f16_scores_mt<D, MT>(s, q_s, q_off, k_s, k_off);
        uint32_t pa[MT][NT / 2][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) f16_softmax<D>(s[mt], b0, *w[mt], pa[mt]);
        f16_pv<D, MT>(pa, w, v_s, v_off);
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) f16_write_warp<D>(p, *w[mt], G, r0, hk, split, n_parts, first + 16 * mt);
    f16_write_end<W::kThreads>(p, G, r0, hk, split, n_parts, nq, row_n, row_state);
}

}  // namespace
}  // namespace luce_attn
