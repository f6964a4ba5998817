// Prompt-row paged attention on f16 tensor cores (f32 accumulation): the device code of the
// f16 prompt-row kernel (its __global__ kernel and launch sit at the end of
// cuda/attention_prefill.cu, which the host emulator's build rewrites; LUCE_ATTN_PROMPT=f16 or
// tf32 picks this or the older TF32 kernel there, kPromptF16ByDefault when unset). Rows 0..prompt_rows-1 of a luce_attention launch,
// flash-attention style over the paged f32 KV cache, causal or not, GQA. Reference:
// luce/ref/attention_prefill.py (kind "f16": this kernel's roundings, key blocks and online
// softmax; tolerance model).
//
// Grid (tiles, Hkv, splits). A tile is kTileQV = 16 W query vectors (W warps: 8 at D <= 128,
// 4 at D = 256; vector v is row r0 + v / G, query head hk * G + v % G), one warp per 16 of
// them (the mma's M). Block (tile, hk, s) takes keys [s * S, (s + 1) * S) (S = kSplitKeys,
// absolute KV indices; only up to the tile's last key) in blocks of B keys (B = 32 at D = 256,
// else 64) and writes per row and head an unnormalized partial o, its running max m (log2
// units) and sum l into workspace entry s; the combine kernel (cuda/attention.cu) merges a
// prompt row's splits in order. Shared memory, f16, rows padded to D + 8 halves (16-byte
// aligned, ldmatrix conflict-free): Q [kTileQV][D + 8], then one or two buffers of K and V
// [B][D + 8] each; a key block's K and V rows are read once from the pages (f32) and stored as
// f16. Two buffers (PIPE, D <= 128): block i + 1's K rows load into registers before block
// i's Q K^T and land in the other buffer after it, its V rows likewise around P V; one
// __syncthreads a block. One buffer: all of a block's rows load between blocks (two syncs).
// Dynamic bytes: D = 64: 36,864 (two: 55,296) | D = 128: 69,632 (two: 104,448) | D = 256:
// 67,584, plus 1-2 KiB static. The launch takes two buffers where they fit (sm_80, sm_90),
// else one (the 99 KiB of sm_86/89/120), else the partition kernel; both do the same
// arithmetic in the same order, so a row's bits do not depend on the choice. Registers (sm_90,
// ptxas): D = 128 two buffers 229 (one 256-thread block an SM), one buffer 128 (two blocks);
// D = 256: 240 (two 128-thread blocks).
// Per row, query head and key block (all in the row's own absolute key positions):
//   q16 = f16(q * (scale * log2 e))        once per tile (f32 product, then round to nearest even)
//   s_j = q16 . f16(k_j)                   m16n8k16 MMAs over D in increasing 16-dim steps;
//                                          s_j = -inf for keys j >= the row's key count
//   m' = max(m, max_j s_j); a = exp2(m - m'); e_j = exp2(s_j - m')  (f32)
//   l = l * a + sum_j e_j (per lane, keys in order; the 4 lanes of a row added at the end)
//   o = o * a + f16(e) f16(V)              MMAs over the block's keys in increasing 16-key steps
// P never leaves registers: the S accumulator of two 8-key n-tiles is the A fragment of one
// 16-key step of P V. Nothing a row computes reads another row: a row's bits do not depend on
// its tile, the chunk or the launch. Key blocks past a row's keys are exact no-ops for it
// (a = 1, e = 0), and a warp skips those past all its rows. Keys past the tile's last key
// read as zeros. K, V and scaled q must be within f16 range (|x| < 65,520; beyond: inf).
//
// Per warp and key block (16 query vectors; D = 128, B = 64 | D = 256, B = 32):
//   Q K^T  D/16 ldmatrix.x4 (Q) + D/16 * B/16 ldmatrix.x4 (K) + D/16 * B/8 MMAs    8+32, 64 | 16+32, 64
//   P V    B/16 * D/16 ldmatrix.x4.trans (V) + B/16 * D/8 MMAs                      32, 64   | 32, 64
//   softmax B/2 ex2 + 2 (alpha), B/2 fadd (l), B/4 cvt.f16x2, D/2 fmul (o *= a)   34/32/16/64 | 18/16/8/128
// Per block and key block (W warps): B * D / 4 float4 loads of K and of V (f32 pages, L2
// mostly), each 2 cvt.f16x2 and one 8-byte shared store: 8 B D bytes read (64 KiB at D = 128,
// B = 64) against 16 W * B * 4D FLOP: 8 W FLOP/byte (64 at D <= 128, 32 at D = 256).
// Roof: a 512-row chunk ending at 4,096 keys is 12 GFLOP at the Coder-1.5B shape and 48 GFLOP
// at the 27B shape; at ~600 TFLOP/s (mma.sync f16) that is 20 / 80 us, so the kernel is bound
// by the staging (f32 loads and conversion) and the softmax between the MMAs, not the MMAs.
#pragma once

#include "attention_common.cuh"
#include "mma_f16.cuh"

namespace luce_attn {
namespace {

// 2^x for the online softmax (x <= 0 or -inf): the MUFU approximation on NVIDIA, exp2f elsewhere.
__device__ __forceinline__ float exp2_softmax(float x) {
#ifdef LUCE_MMA_F16_NATIVE
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

template <int D>
struct F16Shape {
    static constexpr int kWarps = D >= 256 ? 4 : 8;
    static constexpr int kThreads = kWarps * WARP_SIZE;
    static constexpr int kTileQV = 16 * kWarps;          // query vectors per tile
    static constexpr int kStride = D + 8;                 // halves per Q / K / V row in shared memory
    static constexpr int kBlockKeys = D >= 256 ? 32 : 64;
    static constexpr int kKeyTiles = kBlockKeys / 8;      // n-tiles of S
    static constexpr int kDimTiles = D / 8;               // n-tiles of P V
    static constexpr int kCols = D / 4;                   // float4 columns of a K / V row
    static constexpr int kLoadBatch = 8;                  // float4 loads in flight per thread (one buffer)
    static constexpr int kRowItems = kBlockKeys * kCols / kThreads;  // float4s of K (or V) a thread moves
    // PIPE (two K / V buffers, D <= 128): block i + 1's K and V rows load into registers while
    // block i's MMAs run and land in the other buffer; one buffer: they load between blocks.
    static constexpr size_t smem_bytes(bool pipe) {
        return sizeof(uint16_t) * (size_t)(kTileQV + (pipe ? 4 : 2) * kBlockKeys) * kStride;
    }
    static constexpr size_t kStaticBytes = sizeof(int64_t) * 2 * kBlockKeys + 2 * sizeof(int32_t) * kTileQV;
    static constexpr int min_blocks(bool pipe) { return pipe ? 1 : 2; }
    static_assert(kSplitKeys % kBlockKeys == 0, "key blocks tile a split");
    static_assert((2 * kBlockKeys * kCols) % (kThreads * kLoadBatch) == 0, "staging batches tile a block");
    static_assert((kBlockKeys * kCols) % kThreads == 0, "threads tile a block's rows");
};

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

// Keys of query vector v in this split (0: none, or a tree row or a dead slot).
__device__ __forceinline__ int32_t f16_qv_keys(const int32_t *row_n, const int32_t *row_state, int v, int nq, int G) {
    return v < nq && !row_state[v / G] ? max(row_n[v / G], 0) : 0;
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

// One block-uniform piece: rows r0..r1-1 of one segment, all in the tile.
template <int D, bool PIPE>
__device__ void f16_prompt_piece(const luce_attention_params &p, int32_t r0, int32_t r1, int32_t hk, int32_t split,
                                 int32_t n_parts, int32_t page_shift, uint16_t *smem, int64_t (*key_off)[F16Shape<D>::kBlockKeys],
                                 int32_t *row_n, int32_t *row_state) {
    using S = F16Shape<D>;
    constexpr int NT = S::kKeyTiles, DT = S::kDimTiles, KS = S::kStride, B = S::kBlockKeys;
    const int G = p.n_heads_q / p.n_heads_kv;
    const int nq = (r1 - r0) * G;
    const int32_t key0 = split * kSplitKeys;
    static_assert(!PIPE || D <= 128, "two buffers of D = 256 rows would not fit 99 KiB");
    uint16_t *q_s = smem;                       // [kTileQV][KS]
    uint16_t *kv_s = smem + S::kTileQV * KS;    // buffer b (0, 1 with PIPE): K [B][KS], then V [B][KS]

    if (threadIdx.x < S::kTileQV) {  // row_n: the row's keys in this split (<= 0: none)
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
    const int32_t page_base = p.kv_indptr[attention_segment_of(p, r0)];
    const float scale_log2 = p.scale * 1.44269504088896340736f;
    if (n_tile > 0) {  // q16 = f16(q * scale_log2), two columns a thread (q needs no alignment)
        const float *q0 = p.q + ((int64_t)r0 * p.n_heads_q + (int64_t)hk * G) * D;
        for (int i = threadIdx.x; i < S::kTileQV * D / 2; i += S::kThreads) {
            const int v = i / (D / 2), c = 2 * (i % (D / 2));
            float x0 = 0.0f, x1 = 0.0f;
            if (v < nq) {
                const float *qv = q0 + (int64_t)(v / G) * p.n_heads_q * D + (int64_t)(v % G) * D + c;
                x0 = qv[0] * scale_log2;
                x1 = qv[1] * scale_log2;
            }
            *reinterpret_cast<uint32_t *>(q_s + v * KS + c) = tc::pack_f16x2(x0, x1);
        }
        f16_key_offsets<D>(p, 0, n_tile, key0, page_base, page_shift, hk, key_off[0]);
        if (PIPE) {  // block 0 into buffer 0 now; block b's offsets sit in key_off[b & 1]
            __syncthreads();
            f16_stage_block<D>(p, key_off[0], kv_s);
            f16_key_offsets<D>(p, B, n_tile, key0, page_base, page_shift, hk, key_off[1]);
        }
    }

    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    const int v0 = 16 * warp + g;  // this lane's query vectors: v0 (fragment rows g) and v0 + 8
    const int32_t n_row[2] = {f16_qv_keys(row_n, row_state, v0, nq, G), f16_qv_keys(row_n, row_state, v0 + 8, nq, G)};
    int32_t n_warp = 0, n_warp_min = kSplitKeys;  // warp-uniform: most and fewest keys of its vectors
    for (int v = 16 * warp; v < 16 * warp + 16; ++v) {
        const int32_t n = f16_qv_keys(row_n, row_state, v, nq, G);
        n_warp = max(n_warp, n);
        n_warp_min = min(n_warp_min, n);
    }
    // ldmatrix row offsets of this lane (halves): Q and V name (row | key) lane % 8 + 8 ((lane / 8) & 1),
    // column 8 (lane / 16); K names key lane % 8 + 8 (lane / 16), column 8 ((lane / 8) & 1).
    const int32_t q_off = (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * KS + 8 * (lane >> 4);
    const int32_t k_off = ((lane & 7) + 8 * (lane >> 4)) * KS + 8 * ((lane >> 3) & 1);
    const int32_t v_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * KS + 8 * (lane >> 4);

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
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
        const bool live = b0 < n_warp;  // warp-uniform: some row of the warp attends a key here
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
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) {
            uint32_t a[4];
            tc::ldmatrix_x4(a, q_s + (q_off + 16 * kd));
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {  // n-tiles 2 np, 2 np + 1: keys 16 np .. 16 np + 15
                uint32_t b[4];
                tc::ldmatrix_x4(b, k_s + (k_off + 16 * np * KS + 16 * kd));
                tc::mma_f16_16x8x16(s[2 * np], a, b[0], b[1]);
                tc::mma_f16_16x8x16(s[2 * np + 1], a, b[2], b[3]);
            }
        }
        if (more) {
            f16_store_rows<D>(x, k_next);
            f16_load_rows<D>(p.v_pages, key_off[cur ^ 1], x);
        }
        // Online softmax; entry i of s[nt]: row v0 + 8 (i >> 1), key b0 + 8 nt + 2t + (i & 1).
        if (b0 + B > n_warp_min) {  // some vector of the warp ends in this block
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (b0 + 8 * nt + 2 * t + (i & 1) >= n_row[i >> 1]) s[nt][i] = -INFINITY;
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], warp_shfl_xor(mx[r], 1));
            mx[r] = fmaxf(mx[r], warp_shfl_xor(mx[r], 2));
            const float m_new = fmaxf(m[r], mx[r]);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            alpha[r] = exp2_softmax(m[r] - m_use);
            m[r] = m_new;
            mx[r] = m_use;
            l[r] *= alpha[r];
        }
        uint32_t pa[NT / 2][4];  // P as the A operand of 16-key step kk: n-tiles 2 kk (k 0..7), 2 kk + 1 (k 8..15)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            float e[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                e[i] = exp2_softmax(s[nt][i] - mx[i >> 1]);
                l[i >> 1] += e[i];
            }
            pa[nt >> 1][2 * (nt & 1)] = tc::pack_f16x2(e[0], e[1]);
            pa[nt >> 1][2 * (nt & 1) + 1] = tc::pack_f16x2(e[2], e[3]);
        }
#pragma unroll
        for (int d = 0; d < DT; ++d) {
            o[d][0] *= alpha[0];
            o[d][1] *= alpha[0];
            o[d][2] *= alpha[1];
            o[d][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < NT / 2; ++kk)
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {  // n-tiles 2 dp, 2 dp + 1: dims 16 dp .. 16 dp + 15
                uint32_t b[4];
                tc::ldmatrix_x4_trans(b, v_s + (v_off + 16 * kk * KS + 16 * dp));
                tc::mma_f16_16x8x16(o[2 * dp], pa[kk], b[0], b[1]);
                tc::mma_f16_16x8x16(o[2 * dp + 1], pa[kk], b[2], b[3]);
            }
        if (more) {
            f16_store_rows<D>(x, k_next + B * KS);
            f16_key_offsets<D>(p, b0 + 2 * B, n_tile, key0, page_base, page_shift, hk, key_off[cur]);
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
    for (int v = threadIdx.x; v < nq; v += S::kThreads) {
        if (!row_state[v / G] || row_n[v / G] <= 0) continue;
        float *ml = ws.ml(r0 + v / G, hk * G + v % G, split);
        ml[0] = ml[1] = __int_as_float(0x7fc00000);
    }
    __syncthreads();  // the next piece reuses row_n, key_off and the tiles
}

}  // namespace
}  // namespace luce_attn
