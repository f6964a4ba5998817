// f16 prompt-row GEMM (DESIGN 5 rule 1: prefill rows only; LUCE_PREFILL_GEMM=f16, see
// cuda/matmul_prefill.cu): y [rows, n] f32 = x [rows, k] f32 @ W^T (+ bias [n]), W [n, k] GGUF
// blocks (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q5_0). Reference: luce/ref/matmul_prefill.py
// (matmul_prefill_f16). Entry: luce_matmul_prefill_f16 (same params as luce_matmul_prefill).
//
// Arithmetic: x -> f16 scaled by a power of two per row (matmul_prefill_xh.cuh), W decoded to
// f16 once per block tile (matmul_prefill_f16_decode.cuh), then mma.sync m16n8k16 f16 x f16
// -> f32 accumulating over all of k in one fixed order (chunk, group, 16-value half):
//   acc = sum_k wh[r, k] * xh[t, k],   y[t, r] = acc * out_scale[t] (+ bias[r])
// Every output element is one accumulator chain over k through the same sequence of mma
// instructions, whatever the row count, the element's place in the tile and the launch shape
// (kWarps, kNT); no split-K, no reduction across threads: a row's bits never depend on them.
// (Tune 81 alone splits k, by the matrix's shape: matmul_prefill_wgmma.cuh.)
//
// Tiles: a block is kWarps warps x kMT 16-row m tiles (16 kMT weight rows a warp) by
// kTok = 8 kNT tokens; a k step is one 256-value chunk. Per step, the raw GGUF bytes of each
// warp's rows (LaneCopier, matmul_stage.cuh) and the block's kTok x 256 f16 of x go to shared
// memory by cp.async, double-buffered (one barrier a step). Per 32-value group a warp decodes
// its rows into A fragments (registers) once and multiplies them with kNT B fragments of each
// 16-value half (ldmatrix.x4: 2 token tiles of 8): 2 kMT kNT mma per group.
// Counted for tune 8 (kWarps 8, kMT 2, kNT 8: 256 rows x 64 tokens, 256 threads, IQ4_XS):
//   per k step: 2 * 256 * 64 * 256 = 8.4 MFLOP for 34.8 KB of weights + 32 KB of f16 x from
//   L2 (~125 FLOP/B: 400 TFLOP/s needs ~3.2 TB/s of L2);
//   shared memory: 2 stages x (8 warps x 32 rows x 176 B of weights + 64 x 528 B of x) = 158 KB
//   (Q6_K 190 KB, Q8_0 223 KB): one block (8 warps) per SM;
//   per warp and group: 32 mma and 8 ldmatrix.x4 (4 KB of B, 128 B per mma: shared memory's
//   128 B per clock allow one mma per clock per SM); decode of 4 rows x 8 values per lane:
//   4 x (load + table 10) + 8 words x 7 (xor, 2 permutes into 1024 + byte, 2 exact
//   subtractions, 2 multiplies) + 4 x ~8 scale ops ~ 130 slots: ~5.4 issue slots per mma
//   (decode 4, ldmatrix 0.25, mma 1). One issue per clock per sub-partition allows 0.74 mma per
//   clock per SM; mma.sync m16n8k16 sustains ~0.6-0.65 per clock per SM on Hopper (~60-65% of
//   the wgmma f16 peak, 1 per clock): the bound is ~0.6 mma/clock/SM, ~620 TFLOP/s at 1.83 GHz
//   on 132 SMs, with issue nearly saturated; expect 350-450.
// tune 16 (kWarps 8, kMT 1, kNT 16: 128 rows x 128 tokens, 180 KB) halves the decode per mma
// (3.6 issue slots per mma) for twice the B loads (256 B per mma: 0.5 mma per clock per SM).
// Small shared memory (sm_86 / sm_89 / sm_120, 99 KB): tune 4 or 2 (kNT 4: 32 tokens).
// H100/H200 (sm_90a): tunes 32 and 64 run the same decode and x on warpgroup MMAs (wgmma, A from
// registers; cuda/matmul_prefill_wgmma.cuh): 128 or 256 rows x 128 tokens, no ldmatrix or mma
// issue per warp, and measured 1.2-1.4x faster than tune 16 (27B shapes: up to 366 TFLOP/s).
// Tunes 80 and 48 run them on 80- / 48-token tiles: a DFlash pass of 3-5 lanes (48-80 rows) on
// the 27B's LM head, 1,166 -> 881 us at 80 rows (H100, docs/PERF.md session 34).
#include <string.h>

#include "matmul_prefill_f16_decode.cuh"
#include "matmul_stage.cuh"
#include "matmul_prefill_xh.cuh"
#include "pdl.cuh"
#if (defined(__CUDACC__) && !defined(__HIPCC__)) || defined(LUCE_MMA_F16_HOST)
#define LUCE_PREFILL_WG 1              // the warpgroup-MMA tunes exist (the host emulator runs them too)
#include "matmul_prefill_wgmma.cuh"  // tunes 32 / 64 / 48 / 80: sm_90a warpgroup MMAs
#endif

namespace {

using namespace mm;
using namespace mmh;

constexpr int kStagesH = 2;
constexpr int kXRowBytes = 2 * kChunk + 16;  // a token's chunk of f16 in shared memory (ldmatrix rows hit 8 banks)

struct HalfArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XhLayout x;
    int64_t rows, n, row_bytes;
};

template <class Q, int kWarps, int kMT, int kNT>
struct HalfSmem {
    static constexpr int kWarpW = kMT * kStagesH * Stage<Q>::kBytes;  // per warp: [stage][m tile] weight chunks
    static constexpr int kW = kWarps * kWarpW;
    static constexpr int kX = 8 * kNT * kXRowBytes;                 // per stage: kTok tokens of f16 x
    static constexpr int kBytes = kW + kStagesH * kX;
};

template <class Q, int kWarps, int kMT, int kNT>
__global__ void __launch_bounds__(kWarps * WARP_SIZE, 1) mmh_kernel(HalfArgs a) {
    using Sm = HalfSmem<Q, kWarps, kMT, kNT>;
    constexpr int kTok = 8 * kNT, kThreads = kWarps * WARP_SIZE;
    static_assert(kRowPad % kTok == 0, "x rows are padded to whole token tiles");
    extern __shared__ float4 smem4[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(smem4);
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const int64_t t0 = (int64_t)blockIdx.x * kTok;                               // token tiles vary fastest:
    const int64_t tile = ((int64_t)blockIdx.y * kWarps + warp) * 16 * kMT;       // blocks in flight share weights
    const bool live = tile < a.n;  // dead warps still copy x and meet every barrier
    const int64_t chunks = a.x.chunks;
    uint8_t *wst = smem + warp * Sm::kWarpW;  // stage s, m tile m at wst + (kMT s + m) * Stage<Q>::kBytes
    uint8_t *xst = smem + Sm::kW;             // stage s at xst + s * kX
    LaneCopier<Q, kMT * kStagesH> copier(wst, a.w, a.w_end, a.row_bytes, a.n, lane);

    auto copy_w = [&](int s, int64_t ch) {
#pragma unroll
        for (int m = 0; m < kMT; ++m)
            if (tile + 16 * m < a.n) copier.copy(kMT * s + m, tile + 16 * m, ch, lane);
    };
    auto copy_x = [&](int s, int64_t ch) {
        uint8_t *xs = xst + s * Sm::kX;
        const uint8_t *src = reinterpret_cast<const uint8_t *>(a.x.xh + t0 * a.x.kp + ch * kChunk);
        for (int i = threadIdx.x; i < kTok * (2 * kChunk / 16); i += kThreads) {
            const int tok = i / (2 * kChunk / 16), word = i % (2 * kChunk / 16);
            cp_async16(xs + tok * kXRowBytes + 16 * word, src + tok * a.x.kp * 2 + 16 * word, 16);
        }
    };

#pragma unroll
    for (int s = 0; s < kStagesH - 1; ++s)
        if (s < chunks) copy_w(s, s);
    wait_for_prior_kernels();  // xh is written by scale_x_f16_kernel (the kernel ahead)
#pragma unroll
    for (int s = 0; s < kStagesH - 1; ++s) {
        if (s < chunks) copy_x(s, s);
        cp_async_commit();
    }

    const uint8_t *wrow[kMT][2];  // global rows of m tile m, r: the readers' alignment
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int64_t row = tile + 16 * m + grp + 8 * r;
            wrow[m][r] = a.w + (row < a.n ? row : a.n - 1) * a.row_bytes;
        }
    // ldmatrix rows: lanes 0-7 tokens 0-7 values 0-7 of a half, 8-15 values 8-15, 16-31 tokens 8-15.
    const int ld_off = ((lane >> 4) * 8 + (lane & 7)) * kXRowBytes + ((lane >> 3) & 1) * 16;
    float acc[kMT][kNT][4] = {};
    for (int64_t ch = 0; ch < chunks; ++ch) {
        cp_async_wait<kStagesH - 2>();
        __syncthreads();  // stage ch landed for every thread; everyone is done with stage ch - 1
        {
            const int64_t next = ch + kStagesH - 1;
            const int s = (int)(next % kStagesH);
            if (next < chunks) {
                copy_w(s, next);
                copy_x(s, next);
            }
            cp_async_commit();
        }
        if (!live) continue;
        const int s = (int)(ch % kStagesH);
        const uint8_t *xs = xst + s * Sm::kX + ld_off;
        Q rd[kMT];
        const int ng = load_chunk(rd, [&](int m) { return wst + (kMT * s + m) * Stage<Q>::kBytes; }, wrow, a.x.groups, ch,
                                  grp, quad);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (j >= ng) break;
            uint32_t av[kMT][2][4];  // [m tile][half][fragment]
#pragma unroll
            for (int m = 0; m < kMT; ++m) decode_group_f16(rd[m], j, quad, av[m]);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int p = 0; p < kNT / 2; ++p) {
                    uint32_t b[4];  // b0, b1 of token tile 2p, then of 2p + 1
                    tc::ldmatrix_x4(b, xs + p * 16 * kXRowBytes + 2 * (32 * j + 16 * h));
#pragma unroll
                    for (int m = 0; m < kMT; ++m) {
                        tc::mma_f16_16x8x16(acc[m][2 * p], av[m][h], b[0], b[1]);
                        tc::mma_f16_16x8x16(acc[m][2 * p + 1], av[m][h], b[2], b[3]);
                    }
                }
        }
    }
    if (!live) return;
    int64_t row0[kMT];
#pragma unroll
    for (int m = 0; m < kMT; ++m) row0[m] = tile + 16 * m;
    store_tiles(acc, a, row0, t0, grp, quad);
}

template <class Q, int kWarps, int kMT, int kNT>
int launch_half(const HalfArgs &a, cudaStream_t stream) {
    constexpr int kSmem = HalfSmem<Q, kWarps, kMT, kNT>::kBytes;
    auto kernel = mmh_kernel<Q, kWarps, kMT, kNT>;
    static bool ready = false;  // raise the dynamic shared-memory limit once per kernel
    if (!ready) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return luce_status(err);
        ready = true;
    }
    // Token tiles holding live rows only: x is padded to 128 rows (kRowPad), and a tile of pad
    // rows stores nothing (a DFlash pass of 80 rows at kNT 4: 3 tiles, not 4).
    const dim3 grid((unsigned)((a.rows + 8 * kNT - 1) / (8 * kNT)), (unsigned)((a.n + 16 * kMT * kWarps - 1) / (16 * kMT * kWarps)));
#if defined(__CUDACC__) || defined(__HIPCC__)
    return luce_status(launch_overlapped(kernel, grid, dim3(kWarps * WARP_SIZE), kSmem, stream, true, a));
#else  // the host emulator (tests/kernels/emu)
    kernel<<<grid, dim3(kWarps * WARP_SIZE), kSmem, stream>>>(a);
    return luce_status(cudaGetLastError());
#endif
}

#if defined(LUCE_PREFILL_WG)
// mmw_kernel on kTok-token tiles: 256 weight rows a block (kMT 2) where its shared memory fits an
// H100/H200 block (227 KiB) and `wide` or it wins by waves, else 128. Waves x work a block:
// 256-row tiles ran at 0.89x the time per FLOP of 128-row ones (H200, 27B shapes, docs/PERF.md,
// session 11), so they win unless they add a wave (27B at 512 rows: down and out (5,120 rows:
// 1 wave against 2) take 256, gate and qkv 128).
// The 80- and 48-token tiles take three warpgroups a block (192 weight rows, kMT 1: 12 warps an
// SM where 8 left the LM head at 80 rows latency-bound, 0.51 of 2 warps eligible a scheduler)
// where those blocks fill every SM once: H100, docs/PERF.md session 35, us, three / two: Q6_K
// LM head 80 rows 760 / 838, 48 rows 731 / 756; Q8_0 gate|up (34,816 rows) 80 rows 136 / 157, 48
// rows 120 / 137; but the 5,120-row out and down at 80 rows (27 blocks) 55 / 44 and 223 / 173.
// LUCE_PREFILL_WG_GROUPS=2 or 3 (read once; A/B runs) forces either.
int wg_groups_forced() {
    static const int groups = [] {
        const char *v = getenv("LUCE_PREFILL_WG_GROUPS");
        return v && (strcmp(v, "2") == 0 || strcmp(v, "3") == 0) ? v[0] - '0' : 0;
    }();
    return groups;
}

template <class Q, int kTok>
int launch_wg_rows(const HalfArgs &a, cudaStream_t stream, bool wide) {
    const int sms = mm::device_shape().sms;
    const int64_t tiles = (a.rows + kTok - 1) / kTok;
    if constexpr (kTok <= 80) {
        const int forced = wg_groups_forced();
        if (forced == 3 || (forced == 0 && sms > 0 && (a.n + 191) / 192 * tiles >= sms))
            return launch_wgmma<Q, 1, kTok, 3>(a, stream);
    }
    if constexpr (WgSmem<Q, 2, kTok>::kBytes > 227 * 1024) {
        (void)wide;
        return launch_wgmma<Q, 1, kTok>(a, stream);
    } else {
        const int64_t waves1 = sms > 0 ? ((a.n + 127) / 128 * tiles + sms - 1) / sms : 1;
        const int64_t waves2 = sms > 0 ? ((a.n + 255) / 256 * tiles + sms - 1) / sms : 1;
        return wide || 2 * 89 * waves2 < 100 * waves1 ? launch_wgmma<Q, 2, kTok>(a, stream)
                                                      : launch_wgmma<Q, 1, kTok>(a, stream);
    }
}

// Tune 81: the 80- / 48-token tiles of three warpgroups with k split over clusters of Z blocks
// (mmw_kernel), Z by the matrix alone (n, k and the SMs, never the rows: a row's bits are the same
// in every call of this tune): the fewest chunk steps, counted as waves of one block an SM times a
// block's chunks plus kSplitStepOverhead (its fill and the cluster's sum), Z <= 8 and the chunks.
// The 27B's DFlash draft (Q8_0, 27 row blocks of 192 at n = 5,120) on 132 SMs: down (68 chunks)
// and out (16) Z = 4, q (4,096 rows, 20 chunks) 5, gate|up (34,816 rows) 2. For the draft's own
// weights (luce/models/dflash_routing.py): other bits than tunes 0-80 (issue 17's allowance for
// draft rows, within the reference's bound).
constexpr int64_t kSplitStepOverhead = 2;
inline int split_k_parts(int64_t row_blocks, int64_t chunks, int sms) {
    int best = 1;
    int64_t best_cost = -1;
    for (int z = 1; z <= 8 && z <= chunks; ++z) {
        const int64_t waves = sms > 0 ? (row_blocks * z + sms - 1) / sms : 1;
        const int64_t cost = waves * ((chunks + z - 1) / z + kSplitStepOverhead);
        if (best_cost < 0 || cost < best_cost) best = z, best_cost = cost;
    }
    return best;
}

int split_k_forced() {  // LUCE_PREFILL_SPLIT_K=1..8 (read once): Z for tests and A/B runs
    static const int z = [] {
        const char *v = getenv("LUCE_PREFILL_SPLIT_K");
        const int n = v ? atoi(v) : 0;
        return n >= 1 && n <= 8 ? n : 0;
    }();
    return z;
}

// The k parts tune 81 asks for an [n, k] matrix (at most its chunks).
int split_k_asked(int64_t n, int64_t chunks) {
    const int forced = split_k_forced();
    const int z = forced ? forced : split_k_parts((n + 191) / 192, chunks, mm::device_shape().sms);
    return z > chunks ? (int)chunks : z;
}

template <class Q>
int launch_wg_split(const HalfArgs &a, cudaStream_t stream) {
    const int z = split_k_asked(a.n, a.x.chunks);
    return a.rows <= 48 ? launch_wgmma<Q, 1, 48, 3>(a, stream, z) : launch_wgmma<Q, 1, 80, 3>(a, stream, z);
}

// The k parts tune 81 runs for an [n, k] matrix of Q here at 49+ rows (48-token tiles need less
// shared memory: the same where these fit); 1 where it does not split.
template <class Q>
int wg_split_parts(int64_t n, int64_t chunks) {
    if (!wgmma_runs_here<Q, 1, 80, 3, HalfArgs>()) return 1;
    return wgmma_parts_here<Q, 1, 80, 3, HalfArgs>(split_k_asked(n, chunks));
}
#endif

// Warpgroup MMAs for tune 0 where the device runs them (sm_90a) and LUCE_PREFILL_WGMMA is not 0:
// on the H200 their bits are tune 16's (GPU tests), and the 27B's prefill of 512 tokens ran at
// 1.19x the mma.sync kernels' rate (docs/PERF.md, session 11).
constexpr bool kWgmmaByDefault = true;

bool wgmma_by_default() {
    static const bool on = [] {
        const char *v = getenv("LUCE_PREFILL_WGMMA");
        return v && v[0] ? strcmp(v, "0") != 0 : kWgmmaByDefault;
    }();
    return on;
}

// tune 8: 8 warps of 2 m tiles x 64 tokens (256 x 64 tiles), 16: 8 warps of 1 m tile x 128
// tokens (128 x 128), 4: 4 warps of 2 m tiles x 32 tokens (128 x 32), 2: 2 warps of 2 m tiles x
// 32 tokens (64 x 32); 32 / 64: warpgroup MMAs (sm_90a only, cuda/matmul_prefill_wgmma.cuh) on
// 128 x 128 / 256 x 128 tiles (64 takes 32 where its shared memory does not fit); 80 / 48: the
// same on 80- / 48-token tiles (launch_wg_rows: three warpgroups where their blocks fill the SMs,
// else 256 rows where that fits, else 128); 81: those tiles with k split over a cluster
// (launch_wg_split: its own bits). 0 picks the warpgroup MMAs (wgmma_by_default) where
// 128 x 128 blocks fill every SM once, on the narrowest of 48, 80 and 128 tokens holding all rows
// (launch_wg_rows' shapes, not `wide`: 256 rows only where that wins by waves), else the first of
// 16, 8, 4, 2 whose shared memory fits, 16 and 8 only when their blocks fill every SM once. Every
// shape but tune 81's split gives the same bits (see the header; the GPU tests check wgmma's
// against mma.sync's).
template <class Q>
int launch_half_pick(const HalfArgs &a, int tune, cudaStream_t stream) {
#ifdef __HIPCC__  // one launch shape on AMD (the shuffle form of the mma; it keeps the build short)
    (void)tune;
    return launch_half<Q, 2, 2, 4>(a, stream);
#else
    const mm::DeviceShape &d = mm::device_shape();
    auto fits = [&](int bytes) { return d.smem <= 0 || bytes <= d.smem; };
    const int64_t token_tiles = a.x.tp / 128, blocks16 = (a.n + 127) / 128 * token_tiles;
#if defined(LUCE_PREFILL_WG)
    if (tune == 32) return launch_wgmma<Q, 1>(a, stream);
    if (tune == 64) return launch_wg_rows<Q, 128>(a, stream, true);
    if (tune == 80) return launch_wg_rows<Q, 80>(a, stream, true);
    if (tune == 48) return launch_wg_rows<Q, 48>(a, stream, true);
    if (tune == LUCE_PREFILL_TUNE_SPLIT_K) {  // without sm_90a code: tune 0's choice (its bits: no split)
        const int status = launch_wg_split<Q>(a, stream);
        if (status != (int)cudaErrorInvalidDeviceFunction) return status;
    }
    if (tune == 0 && wgmma_by_default() && d.sms > 0 && blocks16 >= d.sms) {
        const int status = a.rows <= 48   ? launch_wg_rows<Q, 48>(a, stream, false)
                           : a.rows <= 80 ? launch_wg_rows<Q, 80>(a, stream, false)
                                          : launch_wg_rows<Q, 128>(a, stream, false);
        if (status != (int)cudaErrorInvalidDeviceFunction) return status;  // else no sm_90a code here
    }
#endif
    if (tune == 8) return launch_half<Q, 8, 2, 8>(a, stream);
    if (tune == 16) return launch_half<Q, 8, 1, 16>(a, stream);
    if (tune == 4) return launch_half<Q, 4, 2, 4>(a, stream);
    if (tune == 2) return launch_half<Q, 2, 2, 4>(a, stream);
    // Tune 16 measured fastest on the H200 where its blocks fill the SMs (27B gate / down at 512
    // and 4,096 rows: 0.82-0.85x tune 8's time; docs/PERF.md, session 10).
    const int64_t blocks8 = (a.n + 255) / 256 * (a.x.tp / 64);
    const bool many = d.sms <= 0 || blocks16 >= d.sms;
    if (fits(HalfSmem<Q, 8, 1, 16>::kBytes) && many) return launch_half<Q, 8, 1, 16>(a, stream);
    if (fits(HalfSmem<Q, 8, 2, 8>::kBytes) && !(d.sms > 0 && blocks8 < d.sms)) return launch_half<Q, 8, 2, 8>(a, stream);
    if (fits(HalfSmem<Q, 4, 2, 4>::kBytes)) return launch_half<Q, 4, 2, 4>(a, stream);
    return launch_half<Q, 2, 2, 4>(a, stream);
#endif
}

int64_t block_row_bytes(int32_t qtype, int64_t k) {
    int64_t block = 0, bytes = 0;
    switch (qtype) {
        case LUCE_QT_Q8_0: block = 32; bytes = 34; break;
        case LUCE_QT_Q5_0: block = 32; bytes = 22; break;
        case LUCE_QT_Q4_K: block = 256; bytes = 144; break;
        case LUCE_QT_Q5_K: block = 256; bytes = 176; break;
        case LUCE_QT_Q6_K: block = 256; bytes = 210; break;
        case LUCE_QT_IQ4_XS: block = 256; bytes = 136; break;
        default: return -1;  // float types: luce_matmul
    }
    return k <= 0 || k % block ? -1 : k / block * bytes;
}

}  // namespace

extern "C" int64_t luce_matmul_prefill_f16_workspace_bytes(int64_t rows, int64_t k) {
    return rows <= 0 || k <= 0 ? 0 : xh_bytes(rows, k);
}

// luce_matmul_prefill_split_k's answer for the f16 GEMM (luce_ops_weights.h).
extern "C" int luce_matmul_prefill_f16_split_k(int32_t qtype, int64_t n, int64_t k) {
    if (n <= 0 || block_row_bytes(qtype, k) < 0) return 0;
#if defined(LUCE_PREFILL_WG)
    const int64_t chunks = (k + kChunk - 1) / kChunk;
    switch (qtype) {
        case LUCE_QT_Q4_K: return wg_split_parts<ReaderQ4K>(n, chunks);
        case LUCE_QT_Q5_K: return wg_split_parts<ReaderQ5K>(n, chunks);
        case LUCE_QT_Q6_K: return wg_split_parts<ReaderQ6K>(n, chunks);
        case LUCE_QT_IQ4_XS: return wg_split_parts<ReaderIQ4XS>(n, chunks);
        case LUCE_QT_Q8_0: return wg_split_parts<ReaderQ80>(n, chunks);
        default: return wg_split_parts<ReaderQ50>(n, chunks);
    }
#else
    return 1;
#endif
}

// luce_matmul_prefill with the f16 GEMM (the params of luce_ops_weights.h; workspace:
// luce_matmul_prefill_f16_workspace_bytes; REUSE_X reuses the f16 x of the last call).
extern "C" int luce_matmul_prefill_f16(const luce_matmul_params *p, void *stream_ptr) {
    if (p->rows == 0) return 0;
    const int64_t row_bytes = block_row_bytes(p->qtype, p->k);
    if (p->rows < 0 || p->n <= 0 || row_bytes < 0 || !p->x || !p->w || !p->y || !p->workspace ||
        p->workspace_bytes < xh_bytes(p->rows, p->k) || (reinterpret_cast<uintptr_t>(p->x) & 15) ||
        (reinterpret_cast<uintptr_t>(p->workspace) & 15) || p->rows > (1LL << 30) ||
        (p->n + 15) / 16 > 65535LL || (p->tune != 0 && p->tune != 2 && p->tune != 4 && p->tune != 8 && p->tune != 16 && p->tune != 32 &&
         p->tune != 64 && p->tune != 48 && p->tune != 80 && p->tune != LUCE_PREFILL_TUNE_SPLIT_K))
        return (int)cudaErrorInvalidValue;
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const XhLayout xl = xh_layout(p->workspace, p->rows, p->k);
    if (!(p->flags & LUCE_MATMUL_REUSE_X)) {
        scale_x_f16_kernel<<<(unsigned)xl.tp, kXhThreads, 0, stream>>>(p->x, p->rows, p->k, xl);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return luce_status(err);
    }
    const uint8_t *w = static_cast<const uint8_t *>(p->w);
    const HalfArgs a{w, w + p->n * row_bytes, p->bias, p->y, xl, p->rows, p->n, row_bytes};
    switch (p->qtype) {
        case LUCE_QT_Q4_K: return launch_half_pick<ReaderQ4K>(a, p->tune, stream);
        case LUCE_QT_Q5_K: return launch_half_pick<ReaderQ5K>(a, p->tune, stream);
        case LUCE_QT_Q6_K: return launch_half_pick<ReaderQ6K>(a, p->tune, stream);
        case LUCE_QT_IQ4_XS: return launch_half_pick<ReaderIQ4XS>(a, p->tune, stream);
        case LUCE_QT_Q8_0: return launch_half_pick<ReaderQ80>(a, p->tune, stream);
        case LUCE_QT_Q5_0: return launch_half_pick<ReaderQ50>(a, p->tune, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
