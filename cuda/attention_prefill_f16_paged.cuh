// The paged form of the f16 prompt-row kernel (cuda/attention_prefill_f16.cuh: its arithmetic,
// shapes and counts): every tile block reads each key block's K and V rows from the f32 pages
// (through registers, converted to f16) into shared memory. The launch takes it where the
// staged form (cuda/attention_prefill_f16_staged.cuh) does not run: no staging workspace
// (n_kv_indices = 0), LUCE_ATTN_PROMPT=f16p, or a device whose shared memory does not hold
// that form. Both forms do the same arithmetic in the same order: the same bits.
// Shared memory, f16, rows padded to D + 8 halves: Q [kTileQV][D + 8], then one or two
// buffers of K and V [B][D + 8] each. Two buffers (PIPE, D <= 128): block i + 1's K rows load
// into registers before block i's Q K^T and land in the other buffer after it, its V rows
// likewise around P V; one __syncthreads a block. One buffer: all of a block's rows load
// between blocks (two syncs). Dynamic bytes: F16Shape::smem_bytes.
#pragma once

#include "attention_prefill_f16.cuh"

namespace luce_attn {
namespace {

// The float4s of one key block's K or V rows (key_off < 0: zeros) this thread moves: item
// threadIdx.x + u * kThreads is row item / kCols, float4 column item % kCols.
template <int D>
__device__ __forceinline__ void f16_load_rows(const float *pages, const int64_t *key_off,
                                              float4 (&x)[F16Shape<D>::kRowItems]) {
    using S = F16Shape<D>;
#pragma unroll
    for (int u = 0; u < S::kRowItems; ++u) {
        const int i = threadIdx.x + u * S::kThreads, j = i / S::kCols, c = i % S::kCols;
        const int64_t off = key_off[j];
        x[u] = off >= 0 ? reinterpret_cast<const float4 *>(pages + off)[c] : zero4();
    }
}

// f16_load_rows' float4s into rows dst[B][kStride] as f16.
template <int D>
__device__ __forceinline__ void f16_store_rows(const float4 (&x)[F16Shape<D>::kRowItems], uint16_t *dst) {
    using S = F16Shape<D>;
#pragma unroll
    for (int u = 0; u < S::kRowItems; ++u) {
        const int i = threadIdx.x + u * S::kThreads, j = i / S::kCols, c = i % S::kCols;
        uint2 h;
        h.x = tc::pack_f16x2(x[u].x, x[u].y);
        h.y = tc::pack_f16x2(x[u].z, x[u].w);
        *reinterpret_cast<uint2 *>(dst + j * S::kStride + 4 * c) = h;
    }
}

// Float offsets of key block b0's KV rows (head hk) for threads 0..B-1; -1 past the tile's keys.
template <int D>
__device__ __forceinline__ void f16_key_offsets(const luce_attention_params &p, int32_t b0, int32_t n_tile,
                                                int32_t key0, int32_t page_base, int32_t page_shift,
                                                int32_t hk, int64_t *key_off) {
    using S = F16Shape<D>;
    if (threadIdx.x >= S::kBlockKeys) return;
    const int32_t j = b0 + (int32_t)threadIdx.x, key = key0 + j;
    int64_t off = -1;
    if (j < n_tile) {
        const int64_t page = p.kv_indices[page_base + (key >> page_shift)];
        off = ((page << page_shift) + (key & ((1 << page_shift) - 1))) * ((int64_t)p.n_heads_kv * D) + (int64_t)hk * D;
    }
    key_off[threadIdx.x] = off;
}

// K then V rows of one key block into k_s, v_s ([B][kStride] f16; key_off < 0: a zero row).
template <int D>
__device__ __forceinline__ void f16_stage_block(const luce_attention_params &p, const int64_t *key_off,
                                                uint16_t *k_s) {
    using S = F16Shape<D>;
    constexpr int kItems = 2 * S::kBlockKeys * S::kCols;  // float4s of K, then of V
    for (int i0 = threadIdx.x; i0 < kItems; i0 += S::kThreads * S::kLoadBatch) {
        float4 x[S::kLoadBatch];
#pragma unroll
        for (int u = 0; u < S::kLoadBatch; ++u) {
            const int i = i0 + u * S::kThreads, kv = i / (S::kBlockKeys * S::kCols);
            const int j = (i / S::kCols) % S::kBlockKeys, c = i % S::kCols;
            const int64_t off = key_off[j];
            x[u] = off >= 0 ? reinterpret_cast<const float4 *>((kv ? p.v_pages : p.k_pages) + off)[c] : zero4();
        }
#pragma unroll
        for (int u = 0; u < S::kLoadBatch; ++u) {
            const int i = i0 + u * S::kThreads, row = i / S::kCols, c = i % S::kCols;  // row: K rows, then V rows
            uint2 h;
            h.x = tc::pack_f16x2(x[u].x, x[u].y);
            h.y = tc::pack_f16x2(x[u].z, x[u].w);
            *reinterpret_cast<uint2 *>(k_s + row * S::kStride + 4 * c) = h;
        }
    }
}

// One block-uniform piece of the paged form (K and V read from the f32 pages by every tile):
// rows r0..r1-1 of one segment, all in the tile.
template <int D, bool PIPE>
__device__ void f16_prompt_piece(const luce_attention_params &p, int32_t r0, int32_t r1, int32_t hk, int32_t split,
                                 int32_t n_parts, int32_t page_shift, uint16_t *smem, int64_t (*key_off)[F16Shape<D>::kBlockKeys],
                                 int32_t *row_n, int32_t *row_state) {
    using S = F16Shape<D>;
    constexpr int NT = S::kKeyTiles, KS = S::kStride, B = S::kBlockKeys;
    const int G = p.n_heads_q / p.n_heads_kv;
    const int nq = (r1 - r0) * G;
    const int32_t key0 = split * kSplitKeys;
    static_assert(!PIPE || D <= 128, "two buffers of D = 256 rows would not fit 99 KiB");
    uint16_t *q_s = smem;                       // [kTileQV][KS]
    uint16_t *kv_s = smem + S::kTileQV * KS;    // buffer b (0, 1 with PIPE): K [B][KS], then V [B][KS]

    const int32_t n_tile = f16_piece_rows<D>(p, r0, r1, key0, row_n, row_state);
    const int32_t page_base = p.kv_indptr[attention_segment_of(p, r0)];
    if (n_tile > 0) {
        f16_store_q<D>(p, r0, hk, nq, q_s);
        f16_key_offsets<D>(p, 0, n_tile, key0, page_base, page_shift, hk, key_off[0]);
        if (PIPE) {  // block 0 into buffer 0 now; block b's offsets sit in key_off[b & 1]
            __syncthreads();
            f16_stage_block<D>(p, key_off[0], kv_s);
            f16_key_offsets<D>(p, B, n_tile, key0, page_base, page_shift, hk, key_off[1]);
        }
    }

    F16Warp<D> w(row_n, row_state, nq, G);
    const int32_t q_off = f16_q_off<D>(), k_off = f16_k_off<D>(), v_off = f16_v_off<D>();
    const auto q_frag = [&](int kd, uint32_t (&a)[4]) { tc::ldmatrix_x4(a, q_s + (q_off + 16 * kd)); };
    int cur = 0;  // block b0 / B's offsets: key_off[cur]; with PIPE its rows: buffer cur
    for (int32_t b0 = 0; b0 < n_tile; b0 += B, cur ^= 1) {
        __syncthreads();  // q_s and key_off written; the previous block's readers are done
        if (!PIPE) {
            f16_stage_block<D>(p, key_off[cur], kv_s);
            f16_key_offsets<D>(p, b0 + B, n_tile, key0, page_base, page_shift, hk, key_off[cur ^ 1]);
            __syncthreads();
        }
        const uint16_t *k_s = kv_s + (PIPE ? cur : 0) * 2 * B * KS, *v_s = k_s + B * KS;
        uint16_t *k_next = kv_s + (cur ^ 1) * 2 * B * KS;  // PIPE: block b0 + B's rows go here
        const bool more = PIPE && b0 + B < n_tile;
        const bool live = b0 < w.n_warp;  // warp-uniform: some row of the warp attends a key here
        float4 x[S::kRowItems];
        if (more) f16_load_rows<D>(p.k_pages, key_off[cur ^ 1], x);
        if (!live) {  // the next block's rows still move through this warp's threads
            if (more) {
                f16_store_rows<D>(x, k_next);
                f16_load_rows<D>(p.v_pages, key_off[cur ^ 1], x);
                f16_store_rows<D>(x, k_next + B * KS);
                f16_key_offsets<D>(p, b0 + 2 * B, n_tile, key0, page_base, page_shift, hk, key_off[cur]);
            }
            continue;
        }
        float s[NT][4];
        f16_scores<D>(s, q_frag, k_s, k_off);
        if (more) {
            f16_store_rows<D>(x, k_next);
            f16_load_rows<D>(p.v_pages, key_off[cur ^ 1], x);
        }
        f16_softmax_pv<D>(s, b0, w, v_s, v_off);
        if (more) {
            f16_store_rows<D>(x, k_next + B * KS);
            f16_key_offsets<D>(p, b0 + 2 * B, n_tile, key0, page_base, page_shift, hk, key_off[cur]);
        }
    }
    f16_write_partials<D>(p, w, r0, hk, split, n_parts, nq, row_n, row_state);
}

}  // namespace
}  // namespace luce_attn
