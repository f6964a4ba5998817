// Prompt-row paged attention on f16 tensor cores (f32 accumulation): the arithmetic of the
// f16 prompt-row kernel, shared by its forms, which differ only in how K and V reach shared
// memory and how many m-tiles a warp takes: staged (cuda/attention_prefill_f16_staged.cuh: a
// pre-pass converts the prompt segments' keys to f16 once into the workspace, the tiles
// cp.async them; its wide variant cuda/attention_prefill_f16_wide.cuh gives each of 4 warps
// two m-tiles) and paged (cuda/attention_prefill_f16_paged.cuh: every tile converts the f32
// pages itself). Kernels and launch: cuda/attention_prefill_f16_launch.cuh
// (LUCE_ATTN_PROMPT=f16, f16p, f16s, f16w or tf32 picks the kernel and form in
// cuda/attention_prefill.cu, kPromptF16ByDefault when unset). Rows
// 0..prompt_rows-1 of a luce_attention launch, flash-attention style over the paged f32 KV
// cache, causal or not, GQA. Reference: luce/ref/attention_prefill.py (kind "f16": this
// kernel's roundings, key blocks and online softmax; tolerance model).
//
// Grid (tiles, Hkv, splits). A tile is kTileQV = 16 W query vectors (W warps: 8 at D <= 128,
// 4 at D = 256; vector v is row r0 + v / G, query head hk * G + v % G), one warp per 16 of
// them (the mma's M). Block (tile, hk, s) takes keys [s * S, (s + 1) * S) (S = kSplitKeys,
// absolute KV indices; only up to the tile's last key) in blocks of B keys (B = 32 at D = 256,
// else 64) and writes per row and head an unnormalized partial o, its running max m (log2
// units) and sum l into workspace entry s; the combine kernel (cuda/attention.cu) merges a
// prompt row's splits in order. Shared memory holds f16 rows padded to D + 8 halves (16-byte
// aligned, ldmatrix conflict-free): the Q tile [kTileQV][D + 8] and K, V blocks [B][D + 8].
// Per row, query head and key block (all in the row's own absolute key positions):
//   q16 = f16(q * (scale * log2 e))        once per tile (f32 product, then round to nearest even)
//   s_j = q16 . f16(k_j)                   m16n8k16 MMAs over D in increasing 16-dim steps;
//                                          s_j = -inf for keys j >= the row's key count
//   m' = max(m, max_j s_j); a = exp2(m - m'); e_j = exp2(s_j - m')  (f32)
//   l = l * a + sum_j e_j (per lane, keys in order; the 4 lanes of a row added at the end)
//   o = o * a + f16(e) f16(V)              MMAs over the block's keys in increasing 16-key steps
// f16(k), f16(v): cvt.rn (nearest even) in either form. P never leaves registers: the S
// accumulator of two 8-key n-tiles is the A fragment of one 16-key step of P V. Nothing a row
// computes reads another row: a row's bits do not depend on its tile, the chunk, the launch
// or the form. Key blocks past a row's keys are exact no-ops for it (a = 1, e = 0), and a
// warp skips those past all its rows. Keys past the tile's last key read as zeros. K, V and
// scaled q must be within f16 range (|x| < 65,520; beyond: inf).
//
// Per warp and key block (16 query vectors; D = 128, B = 64 | D = 256, B = 32):
//   Q K^T  D/16 ldmatrix.x4 (Q) + D/16 * B/16 ldmatrix.x4 (K) + D/16 * B/8 MMAs    8+32, 64 | 16+32, 64
//   P V    B/16 * D/16 ldmatrix.x4.trans (V) + B/16 * D/8 MMAs                      32, 64   | 32, 64
//   softmax B/2 ex2 + 2 (alpha), B/2 fadd (l), B/4 cvt.f16x2, D/2 fmul (o *= a)   34/32/16/64 | 18/16/8/128
// (the staged form keeps Q's fragments in registers at D <= 128: no Q ldmatrix). sm_90 SASS,
// D = 128, one key block a warp: paged 1,138 instructions for 128 HMMA (of them 26 LDG, 34
// STS, 64 F2FP and ~250 integer ops of its f32 staging, plus a page-table load before each
// __syncthreads); staged 607 (8 LDGSTS). Measured paged at 1.5B shape, 512 rows: ~85-105
// TFLOP/s against ~600 for mma.sync f16: ~10,000 SM cycles a key block where its MMAs need
// ~1,800 and its ldmatrix traffic (~290 KiB a block and key block at 128 B/cycle) ~2,300:
// latency, not a pipe, bounded it (register staging behind one 8-warp block an SM).
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

// Keys of query vector v in this split (0: none, or a tree row or a dead slot).
__device__ __forceinline__ int32_t f16_qv_keys(const int32_t *row_n, const int32_t *row_state, int v, int nq, int G) {
    return v < nq && !row_state[v / G] ? max(row_n[v / G], 0) : 0;
}

// Rows r0..r1-1 of a piece (threads < kTileQV write row_n: the row's keys in split key0 / S,
// <= 0 none; row_state: a tree row). Returns the tile's most keys (every thread, after a sync).
template <int D>
__device__ __forceinline__ int32_t f16_piece_rows(const luce_attention_params &p, int32_t r0, int32_t r1, int32_t key0,
                                                  int32_t *row_n, int32_t *row_state) {
    if (threadIdx.x < F16Shape<D>::kTileQV) {
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
    return n_tile;
}

// q16 = f16(q * scale_log2) of the tile's nq query vectors into q_s [kTileQV][kStride] (zeros
// past nq), two columns a thread (q needs no alignment).
template <int D, int THREADS = F16Shape<D>::kThreads>
__device__ __forceinline__ void f16_store_q(const luce_attention_params &p, int32_t r0, int32_t hk, int nq,
                                            uint16_t *q_s) {
    using S = F16Shape<D>;
    const int G = p.n_heads_q / p.n_heads_kv;
    const float scale_log2 = p.scale * 1.44269504088896340736f;
    const float *q0 = p.q + ((int64_t)r0 * p.n_heads_q + (int64_t)hk * G) * D;
    for (int i = threadIdx.x; i < S::kTileQV * D / 2; i += THREADS) {
        const int v = i / (D / 2), c = 2 * (i % (D / 2));
        float x0 = 0.0f, x1 = 0.0f;
        if (v < nq) {
            const float *qv = q0 + (int64_t)(v / G) * p.n_heads_q * D + (int64_t)(v % G) * D + c;
            x0 = qv[0] * scale_log2;
            x1 = qv[1] * scale_log2;
        }
        *reinterpret_cast<uint32_t *>(q_s + v * S::kStride + c) = tc::pack_f16x2(x0, x1);
    }
}

// The first query vector of this warp's 16 (an m-tile) where a warp takes one: 16 warp.
__device__ __forceinline__ int f16_first_qv() { return 16 * (int)(threadIdx.x / WARP_SIZE); }

// One warp's m-tile of 16 query vectors from `first`, and its running state: its lane's
// vectors v0 = first + g and v0 + 8 (their keys n_row), the most and fewest keys of the 16
// (warp-uniform), and per vector pair o [D/8][4], m, l.
template <int D>
struct F16Warp {
    int32_t n_row[2], n_warp, n_warp_min;
    float o[F16Shape<D>::kDimTiles][4], m[2], l[2];

    __device__ __forceinline__ F16Warp(const int32_t *row_n, const int32_t *row_state, int nq, int G,
                                       int first = f16_first_qv()) {
        const int v0 = first + (threadIdx.x % WARP_SIZE) / 4;
        n_row[0] = f16_qv_keys(row_n, row_state, v0, nq, G);
        n_row[1] = f16_qv_keys(row_n, row_state, v0 + 8, nq, G);
        n_warp = 0, n_warp_min = kSplitKeys;
        for (int v = first; v < first + 16; ++v) {
            const int32_t n = f16_qv_keys(row_n, row_state, v, nq, G);
            n_warp = max(n_warp, n);
            n_warp_min = min(n_warp_min, n);
        }
#pragma unroll
        for (int d = 0; d < F16Shape<D>::kDimTiles; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }
};

// ldmatrix row offsets of this lane (halves): Q and V name (row | key) lane % 8 + 8 ((lane / 8) & 1),
// column 8 (lane / 16); K names key lane % 8 + 8 (lane / 16), column 8 ((lane / 8) & 1).
template <int D>
__device__ __forceinline__ int32_t f16_q_off(int first = f16_first_qv()) {
    const int lane = threadIdx.x % WARP_SIZE;
    return (first + (lane & 7) + 8 * ((lane >> 3) & 1)) * F16Shape<D>::kStride + 8 * (lane >> 4);
}
template <int D>
__device__ __forceinline__ int32_t f16_k_off() {
    const int lane = threadIdx.x % WARP_SIZE;
    return ((lane & 7) + 8 * (lane >> 4)) * F16Shape<D>::kStride + 8 * ((lane >> 3) & 1);
}
template <int D>
__device__ __forceinline__ int32_t f16_v_off() {
    const int lane = threadIdx.x % WARP_SIZE;
    return ((lane & 7) + 8 * ((lane >> 3) & 1)) * F16Shape<D>::kStride + 8 * (lane >> 4);
}

// s = q16 K^T of one key block (k_s [B][kStride]); q_frag(kd, a) gives the A fragment of dims
// 16 kd .. 16 kd + 15 (from shared memory or registers: the same values).
template <int D, class QFrag>
__device__ __forceinline__ void f16_scores(float (&s)[F16Shape<D>::kKeyTiles][4], const QFrag &q_frag,
                                           const uint16_t *k_s, int32_t k_off) {
    constexpr int NT = F16Shape<D>::kKeyTiles, KS = F16Shape<D>::kStride;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
        uint32_t a[4];
        q_frag(kd, a);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {  // n-tiles 2 np, 2 np + 1: keys 16 np .. 16 np + 15
            uint32_t b[4];
            tc::ldmatrix_x4(b, k_s + (k_off + 16 * np * KS + 16 * kd));
            tc::mma_f16_16x8x16(s[2 * np], a, b[0], b[1]);
            tc::mma_f16_16x8x16(s[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// s[mt] = q16 K^T of one key block for MT m-tiles of one warp (Q rows at q_s + q_off + 16 mt
// rows): each K fragment feeds every m-tile; each s[mt] sums over D in f16_scores' order.
template <int D, int MT>
__device__ __forceinline__ void f16_scores_mt(float (&s)[MT][F16Shape<D>::kKeyTiles][4], const uint16_t *q_s,
                                            int32_t q_off, const uint16_t *k_s, int32_t k_off) {
    constexpr int NT = F16Shape<D>::kKeyTiles, KS = F16Shape<D>::kStride;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) tc::ldmatrix_x4(a[mt], q_s + (q_off + 16 * mt * KS + 16 * kd));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {  // n-tiles 2 np, 2 np + 1: keys 16 np .. 16 np + 15
            uint32_t b[4];
            tc::ldmatrix_x4(b, k_s + (k_off + 16 * np * KS + 16 * kd));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                tc::mma_f16_16x8x16(s[mt][2 * np], a[mt], b[0], b[1]);
                tc::mma_f16_16x8x16(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// The online softmax of key block b0 (scores s), in three parts that f16_softmax runs in order
// (the warpgroup form's overlap runs the last before the second; they touch different values):
// f16_softmax_stats: masks, the rows' new max m' (mx: the m' that e uses), a = exp2(m - m'),
// m = m', l *= a.
template <int D>
__device__ __forceinline__ void f16_softmax_stats(float (&s)[F16Shape<D>::kKeyTiles][4], int32_t b0, F16Warp<D> &w,
                                                  float (&mx)[2], float (&alpha)[2]) {
    constexpr int NT = F16Shape<D>::kKeyTiles;
    const int t = threadIdx.x & 3;
    // Entry i of s[nt]: row v0 + 8 (i >> 1), key b0 + 8 nt + 2t + (i & 1).
    if (b0 + F16Shape<D>::kBlockKeys > w.n_warp_min) {  // some vector of the warp ends in this block
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (b0 + 8 * nt + 2 * t + (i & 1) >= w.n_row[i >> 1]) s[nt][i] = -INFINITY;
    }
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], warp_shfl_xor(mx[r], 1));
        mx[r] = fmaxf(mx[r], warp_shfl_xor(mx[r], 2));
        const float m_new = fmaxf(w.m[r], mx[r]);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = exp2_softmax(w.m[r] - m_use);
        w.m[r] = m_new;
        mx[r] = m_use;
        w.l[r] *= alpha[r];
    }
}

// f16_softmax_exp: e = exp2(s - m'), l += e (keys in order), pa = f16(e) as the A operand of
// 16-key step kk (n-tiles 2 kk: k 0..7, 2 kk + 1: k 8..15).
template <int D>
__device__ __forceinline__ void f16_softmax_exp(const float (&s)[F16Shape<D>::kKeyTiles][4], const float (&mx)[2],
                                                F16Warp<D> &w, uint32_t (&pa)[F16Shape<D>::kKeyTiles / 2][4]) {
    constexpr int NT = F16Shape<D>::kKeyTiles;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        float e[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            e[i] = exp2_softmax(s[nt][i] - mx[i >> 1]);
            w.l[i >> 1] += e[i];
        }
        pa[nt >> 1][2 * (nt & 1)] = tc::pack_f16x2(e[0], e[1]);
        pa[nt >> 1][2 * (nt & 1) + 1] = tc::pack_f16x2(e[2], e[3]);
    }
}

// f16_softmax_scale: o *= a.
template <int D>
__device__ __forceinline__ void f16_softmax_scale(F16Warp<D> &w, const float (&alpha)[2]) {
#pragma unroll
    for (int d = 0; d < F16Shape<D>::kDimTiles; ++d) {
        w.o[d][0] *= alpha[0];
        w.o[d][1] *= alpha[0];
        w.o[d][2] *= alpha[1];
        w.o[d][3] *= alpha[1];
    }
}

// The online softmax of key block b0: m, l, o *= a, and pa = f16(e).
template <int D>
__device__ __forceinline__ void f16_softmax(float (&s)[F16Shape<D>::kKeyTiles][4], int32_t b0, F16Warp<D> &w,
                                            uint32_t (&pa)[F16Shape<D>::kKeyTiles / 2][4]) {
    float mx[2], alpha[2];
    f16_softmax_stats<D>(s, b0, w, mx, alpha);
    f16_softmax_exp<D>(s, mx, w, pa);
    f16_softmax_scale<D>(w, alpha);
}

// o += pa V (v_s [B][kStride]) for MT m-tiles of one warp: each V fragment feeds all MT.
template <int D, int MT>
__device__ __forceinline__ void f16_pv(const uint32_t (&pa)[MT][F16Shape<D>::kKeyTiles / 2][4], F16Warp<D> *const (&w)[MT],
                                       const uint16_t *v_s, int32_t v_off) {
    constexpr int NT = F16Shape<D>::kKeyTiles, DT = F16Shape<D>::kDimTiles, KS = F16Shape<D>::kStride;
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk)
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {  // n-tiles 2 dp, 2 dp + 1: dims 16 dp .. 16 dp + 15
            uint32_t b[4];
            tc::ldmatrix_x4_trans(b, v_s + (v_off + 16 * kk * KS + 16 * dp));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                tc::mma_f16_16x8x16(w[mt]->o[2 * dp], pa[mt][kk], b[0], b[1]);
                tc::mma_f16_16x8x16(w[mt]->o[2 * dp + 1], pa[mt][kk], b[2], b[3]);
            }
        }
}

// The online softmax of key block b0 (scores s) and o = o * a + f16(e) V (v_s [B][kStride]).
template <int D>
__device__ __forceinline__ void f16_softmax_pv(float (&s)[F16Shape<D>::kKeyTiles][4], int32_t b0, F16Warp<D> &w,
                                               const uint16_t *v_s, int32_t v_off) {
    uint32_t pa[1][F16Shape<D>::kKeyTiles / 2][4];
    f16_softmax<D>(s, b0, w, pa[0]);
    F16Warp<D> *const ws[1] = {&w};
    f16_pv<D, 1>(pa, ws, v_s, v_off);
}

// Partials of the split (entry `split` of each row and head) of the m-tile from `first`: the
// 4 lanes of a row add their l (xor 1, then xor 2).
template <int D>
__device__ __forceinline__ void f16_write_warp(const luce_attention_params &p, F16Warp<D> &w, int G, int32_t r0,
                                               int32_t hk, int32_t split, int32_t n_parts, int first = f16_first_qv()) {
    const int lane = threadIdx.x % WARP_SIZE, t = lane & 3;
    const int v0 = first + (lane >> 2);
    const Workspace ws = workspace_of(p, n_parts, p.prompt_rows);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        w.l[r] += warp_shfl_xor(w.l[r], 1);
        w.l[r] += warp_shfl_xor(w.l[r], 2);
        const int v = v0 + 8 * r;
        if (w.n_row[r] <= 0) continue;
        const int32_t row = r0 + v / G, h = hk * G + v % G;
        float *dst = ws.o(row, h, split) + 2 * t;
#pragma unroll
        for (int d = 0; d < F16Shape<D>::kDimTiles; ++d)
            *reinterpret_cast<float2 *>(dst + 8 * d) = make_float2(w.o[d][2 * r], w.o[d][2 * r + 1]);
        if (t == 0) {
            float *ml = ws.ml(row, h, split);
            ml[0] = w.m[r];
            ml[1] = w.l[r];
        }
    }
}

// After every m-tile's f16_write_warp: tree rows (never sent here by the engine) get NaN
// statistics (a NaN output, not a wrong one). Ends with a sync (the next piece reuses row_n
// and the tiles).
template <int THREADS>
__device__ __forceinline__ void f16_write_end(const luce_attention_params &p, int G, int32_t r0, int32_t hk,
                                              int32_t split, int32_t n_parts, int nq, const int32_t *row_n,
                                              const int32_t *row_state) {
    const Workspace ws = workspace_of(p, n_parts, p.prompt_rows);
    for (int v = threadIdx.x; v < nq; v += THREADS) {
        if (!row_state[v / G] || row_n[v / G] <= 0) continue;
        float *ml = ws.ml(r0 + v / G, hk * G + v % G, split);
        ml[0] = ml[1] = __int_as_float(0x7fc00000);
    }
    __syncthreads();
}

// The one-m-tile-a-warp forms' partials: f16_write_warp, then f16_write_end.
template <int D>
__device__ __forceinline__ void f16_write_partials(const luce_attention_params &p, F16Warp<D> &w, int32_t r0,
                                                   int32_t hk, int32_t split, int32_t n_parts, int nq,
                                                   const int32_t *row_n, const int32_t *row_state) {
    const int G = p.n_heads_q / p.n_heads_kv;
    f16_write_warp<D>(p, w, G, r0, hk, split, n_parts);
    f16_write_end<F16Shape<D>::kThreads>(p, G, r0, hk, split, n_parts, nq, row_n, row_state);
}

}  // namespace
}  // namespace luce_attn
