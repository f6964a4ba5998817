// Prompt-row paged attention on tensor cores: rows 0..prompt_rows-1 of a luce_attention launch
// (cuda/luce_ops.h), flash-attention style over the paged f32 KV cache, causal or not, GQA.
// Two kernels share the grid, the key splits and the workspace: the f16 one (mma.sync
// m16n8k16, f32 accumulation; its arithmetic and counts in cuda/attention_prefill_f16.cuh,
// kernels and launch in cuda/attention_prefill_f16_launch.cuh) and the TF32 one below
// (m16n8k8). The environment's LUCE_ATTN_PROMPT (f16; f16p, f16s, f16w, f16l, f16l4, f16l2, f16g:
// the f16 kernel's paged, 8-warp staged, wide staged, long staged or warpgroup forms; or tf32), read by each
// launch, picks one; unset, kPromptF16ByDefault does (f16: its GPU tests passed on the H200 on 2026-12-03, 2.3-2.6x the
// TF32 kernel's rate; docs/PERF.md, session 10).
// Reference: luce/ref/attention.py (math, float64) and luce/ref/attention_prefill.py (each
// kernel's arithmetic: roundings, key blocks, online softmax; tolerance model).
//
// The TF32 kernel.
// Grid (tiles, Hkv, splits). A tile is kTileQV = 64 query vectors (row r0 + v / G, query head
// hk * G + v % G; 64 / G consecutive rows), one warp per 16 of them (the mma's M). Block
// (tile, hk, s) takes keys [s * S, (s + 1) * S) (S = kSplitKeys, absolute KV indices; only up
// to the tile's last key) in blocks of B keys (B = 32 at D = 256, else 64), each block's K
// then V rows read once from the pages into shared memory as TF32 (tf32_round), and writes per
// row and head an unnormalized partial output o, its running max m (log2 units) and sum l into
// the workspace entry of split s; the combine kernel (cuda/attention.cu) merges a prompt row's
// splits 0..ceil(keys / S) - 1 in order. Q is rounded to TF32 once per tile.
// Per row, query head and key block (all in the row's own absolute key positions):
//   s_j = (q . k_j) * (scale * log2 e)   m16n8k8 TF32 MMAs over D in increasing 8-dim steps;
//                                        s_j = -inf for keys j >= the row's key count
//   m' = max(m, max_j s_j); a = exp2(m - m'); p_j = tf32(exp2(s_j - m'))
//   l = l * a + sum_j p_j (per lane, keys in order; the 4 lanes of a row added at the end)
//   o = o * a + P V                      MMAs over the block's keys in increasing 8-key steps
// Nothing a row computes reads another row: a row's bits do not depend on its tile, the chunk
// or the launch. Key blocks past a row's keys are exact no-ops for it (a = 1, p = 0), and a
// warp skips those past all its rows. Keys past the tile's last key read as zeros.
//
// Roof. Per row, query head and attended key: 4D FLOP (q.k and p v), one exp2. K and V rows
// are read once per tile: 2 * D * 4 bytes per key against 64 * 4D FLOP, 32 FLOP/byte (G = 6:
// 60 live query vectors, 30), mostly L2 hits (the tiles of one KV head run side by side).
// Workspace: (D + 2) * 4 bytes written and read per row, head and split. A 512-row prompt
// chunk ending at 4,096 keys is 48 GFLOP at the 27B shape (Hq 24, Hkv 4, D 256; 208 tiles x 4
// splits) and 12 GFLOP at the Coder-1.5B shape (Hq 12, Hkv 2, D 128); against the H200's TF32
// mma.sync rate (~half its 495 TFLOP/s dense TF32) that is ~0.2 / 0.05 ms, so the kernel is
// bound by its loads, the online softmax and the f32 -> TF32 conversions, not the MMAs.
#include <stdlib.h>
#include <string.h>

#include "attention_common.cuh"
#include "attention_prefill_f16_launch.cuh"
#include "mma_tf32.cuh"

namespace luce_attn {
namespace {

using tc::mma_tf32_16x8x8;
using tc::tf32_round;

constexpr int kWarps = 4;
constexpr int kPromptThreads = kWarps * WARP_SIZE;
constexpr int kTileQV = 16 * kWarps;  // query vectors per tile

template <int D>
struct PromptShape {
    static constexpr int kStride = D + 4;                 // Q / K / V rows: conflict-free fragments
    static constexpr int kBlockKeys = D >= 256 ? 32 : 64;
    static constexpr int kKeyTiles = kBlockKeys / 8;      // n-tiles of S, k-steps of P V
    static constexpr int kDimTiles = D / 8;               // k-steps of Q K^T, n-tiles of P V
    static constexpr int kCols = D / 4;                   // float4 columns of a row
    static constexpr size_t kSmemBytes = sizeof(float) * (size_t)(kTileQV + kBlockKeys) * kStride;
    static constexpr int kMinBlocks = D >= 256 ? 2 : 3;
    static_assert(kSplitKeys % kBlockKeys == 0, "key blocks tile a split");
};

// Rows of one key block (K or V of KV head hk; key_off[j] < 0: a zero row) into kv_s as TF32.
template <int D>
__device__ __forceinline__ void load_block(const float *pages, const int64_t *key_off, float *kv_s) {
    using S = PromptShape<D>;
    for (int i = threadIdx.x; i < S::kBlockKeys * S::kCols; i += kPromptThreads) {
        const int j = i / S::kCols, c = i % S::kCols;
        const int64_t off = key_off[j];
        float4 x = off >= 0 ? reinterpret_cast<const float4 *>(pages + off)[c] : zero4();
        x = make_float4(tf32_round(x.x), tf32_round(x.y), tf32_round(x.z), tf32_round(x.w));
        reinterpret_cast<float4 *>(kv_s + j * S::kStride)[c] = x;
    }
}

// Keys of query vector v in this split (0: none, or a tree row or a dead slot).
__device__ __forceinline__ int32_t qv_keys(const int32_t *row_n, const int32_t *row_state, int v, int nq, int G) {
    return v < nq && !row_state[v / G] ? max(row_n[v / G], 0) : 0;
}

// One block-uniform piece: rows r0..r1-1 of one segment, all in the tile.
template <int D>
__device__ void prompt_piece(const luce_attention_params &p, int32_t r0, int32_t r1, int32_t hk, int32_t split,
                             int32_t n_parts, int32_t page_shift, float *smem, int64_t *key_off,
                             int32_t *row_n, int32_t *row_state) {
    using S = PromptShape<D>;
    constexpr int NT = S::kKeyTiles, DT = S::kDimTiles, KS = S::kStride;
    const int G = p.n_heads_q / p.n_heads_kv;
    const int nq = (r1 - r0) * G;
    const int32_t key0 = split * kSplitKeys;
    const int64_t key_stride = (int64_t)p.n_heads_kv * D;
    const int32_t page_mask = (1 << page_shift) - 1;
    float *q_s = smem;                      // [kTileQV][KS]
    float *kv_s = smem + kTileQV * KS;      // [kBlockKeys][KS]

    if (threadIdx.x < kTileQV) {  // row_n: the row's keys in this split (<= 0: none)
        int32_t n = 0, state = 0;
        const int32_t row = r0 + (int32_t)threadIdx.x;
        if (row < r1) {
            const RowKeys rk = attention_row_keys(p, row);
            n = min(kSplitKeys, rk.keys - key0);
            state = p.tree_parents != nullptr && p.tree_parents[row] >= 0;
        }
        row_n[threadIdx.x] = n;
        row_state[threadIdx.x] = state;
    }
    __syncthreads();
    int32_t n_tile = 0;
    for (int r = 0; r < r1 - r0; ++r)
        if (!row_state[r]) n_tile = max(n_tile, row_n[r]);
    const float *q0 = p.q + ((int64_t)r0 * p.n_heads_q + (int64_t)hk * G) * D;
    if (n_tile > 0) {
        for (int i = threadIdx.x; i < kTileQV * D; i += kPromptThreads) {  // scalar: q needs no alignment
            const int v = i / D, c = i % D;
            q_s[v * KS + c] = v < nq ? tf32_round(q0[(int64_t)(v / G) * p.n_heads_q * D + (int64_t)(v % G) * D + c]) : 0.0f;
        }
    }
    const int32_t page_base = p.kv_indptr[attention_segment_of(p, r0)];

    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    const int v0 = 16 * warp + g;  // this lane's query vectors: v0 (fragment rows g) and v0 + 8
    const int32_t n_row[2] = {qv_keys(row_n, row_state, v0, nq, G), qv_keys(row_n, row_state, v0 + 8, nq, G)};
    int32_t n_warp = 0;
    for (int v = 16 * warp; v < 16 * warp + 16; ++v) n_warp = max(n_warp, qv_keys(row_n, row_state, v, nq, G));
    const float scale_log2 = p.scale * 1.44269504088896340736f;

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int32_t b0 = 0; b0 < n_tile; b0 += S::kBlockKeys) {
        __syncthreads();  // q_s written; the previous block's V readers are done
        if (threadIdx.x < S::kBlockKeys) {
            const int32_t j = b0 + (int32_t)threadIdx.x, key = key0 + j;
            int64_t off = -1;
            if (j < n_tile) {
                const int64_t page = p.kv_indices[page_base + (key >> page_shift)];
                off = ((page << page_shift) + (key & page_mask)) * key_stride + (int64_t)hk * D;
            }
            key_off[threadIdx.x] = off;
        }
        __syncthreads();
        load_block<D>(p.k_pages, key_off, kv_s);
        __syncthreads();
        const bool live = b0 < n_warp;  // warp-uniform: some row of the warp attends a key here
        float s[NT][4];
        if (live) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const float *qa = q_s + v0 * KS + t;
            const float *kb = kv_s + g * KS + t;
#pragma unroll 4
            for (int kd = 0; kd < DT; ++kd) {
                const float a[4] = {qa[8 * kd], qa[8 * KS + 8 * kd], qa[8 * kd + 4], qa[8 * KS + 8 * kd + 4]};
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const float b[2] = {kb[8 * nt * KS + 8 * kd], kb[8 * nt * KS + 8 * kd + 4]};
                    mma_tf32_16x8x8(s[nt], a, b);
                }
            }
            // Online softmax; entry i of s[nt]: row v0 + 8 (i >> 1), key b0 + 8 nt + 2t + (i & 1).
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int32_t j = b0 + 8 * nt + 2 * t + (i & 1);
                    const float x = j < n_row[i >> 1] ? s[nt][i] * scale_log2 : -INFINITY;
                    s[nt][i] = x;
                    mx[i >> 1] = fmaxf(mx[i >> 1], x);
                }
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], warp_shfl_xor(mx[r], 1));
                mx[r] = fmaxf(mx[r], warp_shfl_xor(mx[r], 2));
                const float m_new = fmaxf(m[r], mx[r]);
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                alpha[r] = exp2f(m[r] - m_use);
                m[r] = m_new;
                mx[r] = m_use;
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float e = tf32_round(exp2f(s[nt][i] - mx[i >> 1]));
                    s[nt][i] = e;
                    l[i >> 1] += e;
                }
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                o[d][0] *= alpha[0];
                o[d][1] *= alpha[0];
                o[d][2] *= alpha[1];
                o[d][3] *= alpha[1];
            }
        }
        __syncthreads();  // K readers done
        load_block<D>(p.v_pages, key_off, kv_s);
        __syncthreads();
        if (live) {
            // P as the A operand: k index t is key 2t of the 8-key step, k index t + 4 key 2t + 1
            // (the C layout of S, so no shuffles); V rows are read in the same key order.
#pragma unroll
            for (int kk = 0; kk < NT; ++kk) {
                const float a[4] = {s[kk][0], s[kk][2], s[kk][1], s[kk][3]};
                const float *vb = kv_s + (8 * kk + 2 * t) * KS + g;
#pragma unroll
                for (int d = 0; d < DT; ++d) {
                    const float b[2] = {vb[8 * d], vb[KS + 8 * d]};
                    mma_tf32_16x8x8(o[d], a, b);
                }
            }
        }
    }

    // Partials of the split (entry `split` of each row and head): the 4 lanes of a row add
    // their l (xor 1, then xor 2).
    const Workspace ws = workspace_of(p, n_parts, p.prompt_rows);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += warp_shfl_xor(l[r], 1);
        l[r] += warp_shfl_xor(l[r], 2);
        const int v = v0 + 8 * r;
        if (n_row[r] <= 0) continue;
        const int32_t row = r0 + v / G, h = hk * G + v % G;
        float *dst = ws.o(row, h, split) + 2 * t;
#pragma unroll
        for (int d = 0; d < DT; ++d) *reinterpret_cast<float2 *>(dst + 8 * d) = make_float2(o[d][2 * r], o[d][2 * r + 1]);
        if (t == 0) {
            float *ml = ws.ml(row, h, split);
            ml[0] = m[r];
            ml[1] = l[r];
        }
    }
    // Tree rows (never sent here by the engine) get NaN statistics: a NaN output, not a wrong one.
    for (int v = threadIdx.x; v < nq; v += kPromptThreads) {
        if (!row_state[v / G] || row_n[v / G] <= 0) continue;
        float *ml = ws.ml(r0 + v / G, hk * G + v % G, split);
        ml[0] = ml[1] = __int_as_float(0x7fc00000);
    }
    __syncthreads();  // the next piece reuses row_n, key_off and the tiles
}

template <int D>
__global__ void __launch_bounds__(kPromptThreads, PromptShape<D>::kMinBlocks)
attention_prompt_kernel(luce_attention_params p, int32_t n_parts, int32_t page_shift) {
    extern __shared__ float4 smem4[];
    __shared__ int64_t key_off[PromptShape<D>::kBlockKeys];
    __shared__ int32_t row_n[kTileQV], row_state[kTileQV];
    for_tile_pieces(p, kTileQV, [&](int32_t r0, int32_t r1) {
        prompt_piece<D>(p, r0, r1, blockIdx.y, blockIdx.z, n_parts, page_shift, reinterpret_cast<float *>(smem4),
                        key_off, row_n, row_state);
    });
}

// Raises the TF32 kernel's shared-memory limit once (luce_attention_workspace_bytes and the
// first launch ask, before any graph capture reaches here); false where the device cannot hold a tile.
template <int D>
bool prepare_prompt_tf32() {
    constexpr size_t smem = PromptShape<D>::kSmemBytes;
    static int ready = 0;  // 1: the shared-memory limit is raised; -1: the device cannot hold a tile
    if (ready == 0) {
        int device = 0, optin = 0;
        cudaError_t err = cudaGetDevice(&device);
        if (err == cudaSuccess)
            err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        const size_t static_bytes = sizeof(int64_t) * PromptShape<D>::kBlockKeys + 2 * sizeof(int32_t) * kTileQV;
        if (err == cudaSuccess && (size_t)optin < smem + static_bytes)
            err = cudaErrorNotSupported;  // e.g. a 64 KiB LDS: every row takes the partition kernel
        if (err == cudaSuccess)
            err = cudaFuncSetAttribute(attention_prompt_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem);
        ready = err == cudaSuccess ? 1 : -1;
        if (err != cudaSuccess) (void)cudaGetLastError();
    }
    return ready > 0;
}

template <int D>
int launch_prompt(const luce_attention_params &p, int32_t n_parts, int32_t page_shift, cudaStream_t stream) {
    constexpr size_t smem = PromptShape<D>::kSmemBytes;
    if (!prepare_prompt_tf32<D>()) return (int)cudaErrorNotSupported;
    const int G = p.n_heads_q / p.n_heads_kv;
    const int32_t rows_per_tile = kTileQV / G;
    const unsigned tiles = (unsigned)((p.prompt_rows + rows_per_tile - 1) / rows_per_tile);
    const unsigned splits = (unsigned)prompt_splits(n_parts);
    attention_prompt_kernel<D><<<dim3(tiles, (unsigned)p.n_heads_kv, splits), kPromptThreads, smem,
                                 stream>>>(p, n_parts, page_shift);
    return luce_status(cudaGetLastError());
}

}  // namespace

bool tiled_attention_fits(int32_t head_dim) {
#if WARP_SIZE != 32
    (void)head_dim;
    return false;  // the fragment layouts are a 32-lane warp's
#else
    const PromptKind kind = prompt_kind();
    const bool f16 = kind != kPromptTf32;
    switch (head_dim) {
        case 64: return f16 ? prompt_f16_fits<64>(kind) : prepare_prompt_tf32<64>();
        case 128: return f16 ? prompt_f16_fits<128>(kind) : prepare_prompt_tf32<128>();
        case 256: return f16 ? prompt_f16_fits<256>(kind) : prepare_prompt_tf32<256>();
        default: return false;
    }
#endif
}

int64_t tiled_attention_stage_rows(int32_t head_dim, int32_t page_size, int64_t n_kv_indices) {
#if WARP_SIZE != 32
    (void)head_dim, (void)page_size, (void)n_kv_indices;
    return 0;
#else
    switch (head_dim) {
        case 64: return prompt_stage_rows<64>(page_size, n_kv_indices);
        case 128: return prompt_stage_rows<128>(page_size, n_kv_indices);
        case 256: return prompt_stage_rows<256>(page_size, n_kv_indices);
        default: return 0;
    }
#endif
}

int launch_tiled_attention(const luce_attention_params &p, int32_t n_parts, int32_t page_shift,
                           cudaStream_t stream) {
#if WARP_SIZE != 32
    return (int)cudaErrorNotSupported;  // the fragment layouts are a 32-lane warp's
#else
    if (prompt_kind() != kPromptTf32) {
        switch (p.head_dim) {
            case 64: return launch_prompt_f16<64>(p, n_parts, page_shift, stream);
            case 128: return launch_prompt_f16<128>(p, n_parts, page_shift, stream);
            case 256: return launch_prompt_f16<256>(p, n_parts, page_shift, stream);
            default: return (int)cudaErrorInvalidValue;
        }
    }
    switch (p.head_dim) {
        case 64: return launch_prompt<64>(p, n_parts, page_shift, stream);
        case 128: return launch_prompt<128>(p, n_parts, page_shift, stream);
        case 256: return launch_prompt<256>(p, n_parts, page_shift, stream);
        default: return (int)cudaErrorInvalidValue;
    }
#endif
}

}  // namespace luce_attn
