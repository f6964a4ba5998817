// The tile kernel of the quantized matmul (cuda/matmul.cu, its header says the integers and the order):
// mmq_kernel and its launch shapes (kRing, kRingWide, kLegacy), for decode calls the wide-token and
// few-row kernels do not take and for the prefill path's block types. In the anonymous namespace of
// the one file that includes it (matmul.cu): its launch statics are per library, as matmul_rows.cuh's.
#pragma once

#include "matmul_chunk.cuh"
#include "matmul_stage.cuh"
#include "pdl.cuh"

namespace {

using namespace mm;

constexpr int kKSplit = 4;  // k parts: warps sharing a row tile (fixes the reduction order)

__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

// Block: 4 * WM * TS warps = 4 k parts x WM row tiles of 16 rows x TS token sets of 8 * NT
// tokens. A block multiplies block tiles (WM row tiles) blockIdx.x, + gridDim.x, ...; each
// warp multiplies its row tile's chunks kw, kw + 4, ... for its tokens, with the weight
// chunks staged kStages deep in its own shared memory (matmul_stage.cuh). The ring runs on
// across tiles: the next tile's first chunks are in flight while a tile ends. Weights are
// read before wait_for_prior_kernels (pdl.cuh), activations and outputs only after it.
// kEven: one row (only even token columns are live).
// Launch shapes of the same kernel (results are the same bits): kRing (a one-wave grid whose
// blocks stream several tiles, overlapped with the kernel ahead); kRingWide (the same with
// shallower stages and registers for 5 blocks of 4 warps per SM at one token column: more
// warps to hide latency); kLegacy (one block per tile, not overlapped: the launch before).
enum Shape { kRing, kRingWide, kLegacy };

__host__ __device__ constexpr int clamp_stages(int s) { return s > 4 ? 4 : s < 2 ? 2 : s; }

// Stages per warp: kRing about 14.6 KB of chunks in flight per warp with one token set (2 with
// several: shared memory), kRingWide about 10 KB; kLegacy 3 or 4 at one token column, else 2.
template <class Q, int NT, int TS, Shape S>
__host__ __device__ constexpr int stages() {
    return S == kLegacy ? (NT > 1 ? 2 : Stage<Q>::kBytes > 3000 ? 3 : 4)
           : TS > 1     ? 2
                        : clamp_stages((S == kRingWide ? 10240 : 14600) / Stage<Q>::kBytes);
}

// Blocks per SM the compiler must leave registers for.
template <int NT, int WM, int TS, Shape S>
__host__ __device__ constexpr int min_blocks() {
    return S == kRingWide && NT == 1 && WM == 1 && TS == 1 ? 5 : 512 / (kKSplit * WM * TS * WARP_SIZE);
}

template <class Q, int WM, int TS, int kStages>
__host__ __device__ constexpr int stage_smem_bytes() { return kKSplit * WM * TS * kStages * Stage<Q>::kBytes; }

template <class Q, int NT, int WM, int TS, bool kEven, int kStages, int kMinBlocks>
__global__ void __launch_bounds__(kKSplit * WM * TS * WARP_SIZE, kMinBlocks)
mmq_kernel(MmqArgs a) {
    constexpr int KS = kKSplit;
    extern __shared__ uint4 stage_words[];  // 16-byte aligned
    uint8_t *stage_mem = reinterpret_cast<uint8_t *>(stage_words);
    __shared__ float partial[2][KS - 1][WM * TS][NT * 4][WARP_SIZE];  // two tiles' worth
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int kw = warp % KS, mw = (warp / KS) % WM, ts = warp / (KS * WM);
    const int slot = warp / KS, grp = lane >> 2, quad = lane & 3;
    const int64_t block_tiles = (a.n + 16 * WM - 1) / (16 * WM);
    const int tiles = blockIdx.x < block_tiles ? (int)((block_tiles - 1 - blockIdx.x) / gridDim.x + 1) : 0;
    auto tile_row = [&](int t) { return (((int64_t)blockIdx.x + (int64_t)t * gridDim.x) * WM + mw) * 16; };
    const int count = a.x.chunks > kw ? (int)((a.x.chunks - kw + KS - 1) / KS) : 0;
    uint8_t *stages_of_warp = stage_mem + warp * kStages * Stage<Q>::kBytes;
    LaneCopier<Q, kStages> copier(stages_of_warp, a.w, a.w_end, a.row_bytes, a.n, lane);
    int fill_t = 0, fill_c = 0;  // the next chunk to copy: tile fill_t, chunk kw + KS * fill_c
    auto copy_next = [&](int s) {
        if (fill_t < tiles) {
            copier.copy(s, tile_row(fill_t), kw + (int64_t)KS * fill_c, lane);
            if (++fill_c == count) { fill_c = 0; ++fill_t; }
        }
        copier.commit();
    };
    if (count == 0) fill_t = tiles;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) copy_next(s);
    wait_for_prior_kernels();  // x is written by the kernel ahead (quantize_x or another)
    let_dependents_start();
    const int64_t t_first = ((int64_t)blockIdx.y * TS + ts) * 8 * NT;
    int fill = kStages - 1, use = 0;  // the stages of the next copy and of the next chunk used
    for (int t = 0; t < tiles; ++t) {
        const int64_t tile = tile_row(t);
        const uint8_t *w0 = a.w + imin64(tile + grp, a.n - 1) * a.row_bytes;
        const uint8_t *w1 = a.w + imin64(tile + grp + 8, a.n - 1) * a.row_bytes;
        XTile xt[NT];
#pragma unroll
        for (int n = 0; n < NT; ++n) {  // at chunk kw
            const int64_t live = a.rows - (t_first + 8 * n);  // real tokens in the tile
            const int64_t tb = imin64(t_first + 8 * n, a.x.tp - 8);  // clamped into the padded rows
            xt[n].xb = a.x.xq + (tb + grp) * a.x.groups * 4 + quad;
            xt[n].xd = a.x.xd + tb + 2 * quad;
            xt[n].xqp = a.x.xqp + (tb + 2 * quad) * 2;
            xt[n].xs = a.x.xs + tb / 2 + quad;
            xt[n].b_live = grp < live;
            xt[n].s_live = 2 * quad < live;
            xt[n].advance(a.x, kw);
        }
        float acc[NT][4] = {};
        for (int i = 0; i < count; ++i) {
            copy_next(fill);
            copier.wait();  // the chunk in stage `use` has landed, for every lane
            const int64_t ch = kw + (int64_t)KS * i;
            const uint8_t *st = stages_of_warp + use * Stage<Q>::kBytes;
            fill = fill + 1 == kStages ? 0 : fill + 1;
            use = use + 1 == kStages ? 0 : use + 1;
            Q rd;
            rd.load(staged_row<Q>(st, grp, w0 + ch * Q::kChunkBytes), staged_row<Q>(st, grp + 8, w1 + ch * Q::kChunkBytes),
                    quad, chunk_groups<Q>(a.x, ch));
            if constexpr (Q::kIntScale)
                mmq_chunk_int<Q, NT, kEven>(&rd, xt, quad, &acc);
            else
                mmq_chunk_float<Q, NT, (NT > 1)>(&rd, a.x, ch, xt, quad, &acc);
#pragma unroll
            for (int n = 0; n < NT; ++n) xt[n].advance(a.x, KS);
            __syncwarp();  // every lane is done with the stage before a later iteration refills it
        }
        float (*part)[WM * TS][NT * 4][WARP_SIZE] = partial[t & 1];
        if (kw != 0) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[kw - 1][slot][n * 4 + e][lane] = acc[n][e];
        }
        __syncthreads();
        if (kw != 0) continue;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (kEven && (e & 1)) continue;
                float v = acc[n][e];
#pragma unroll
                for (int s = 0; s < KS - 1; ++s) v = v + part[s][slot][n * 4 + e][lane];
                const int64_t row = tile + grp + 8 * (e >> 1), tok = t_first + 8 * n + 2 * quad + (e & 1);
                if (row < a.n && tok < a.rows) {
                    if (a.bias) v = v + a.bias[row];
                    a.y[tok * a.n + row] = v;
                }
            }
    }
}

// Blocks: one per block tile up to what the device holds at once; past that, that many
// blocks, block b taking tiles b, b + grid, ... (the ring runs on across them). `single`
// keeps one block per tile (the launch before).
inline unsigned grid_x(int64_t block_tiles, int64_t grid_y, int resident, bool single) {
    const int64_t room = resident > 0 ? resident / grid_y : 0;
    if (single || room <= 0 || block_tiles <= room) return (unsigned)block_tiles;
    return (unsigned)room;
}

template <class Q, int NT, int WM, int TS, bool kEven = false, Shape S = kRing>
int launch_mmq(const MmqArgs &a, cudaStream_t stream) {
    constexpr int kStages = stages<Q, NT, TS, S>(), kMinBlocks = min_blocks<NT, WM, TS, S>();
    constexpr bool single = S == kLegacy, overlap = S != kLegacy;
    constexpr int kTokens = 8 * NT * TS, kSmem = stage_smem_bytes<Q, WM, TS, kStages>();
    constexpr int kThreads = kKSplit * WM * TS * WARP_SIZE;
    auto kernel = mmq_kernel<Q, NT, WM, TS, kEven, kStages, kMinBlocks>;
    static int resident = -1;  // raise the dynamic shared-memory limit and size the wave once per kernel
    if (resident < 0) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return luce_status(err);
        resident = resident_blocks(kernel, kThreads, kSmem);
    }
    const int64_t grid_y = (a.rows + kTokens - 1) / kTokens, block_tiles = (a.n + 16 * WM - 1) / (16 * WM);
    const dim3 grid(grid_x(block_tiles, grid_y, resident, single), (unsigned)grid_y);
    return luce_status(launch_overlapped(kernel, grid, dim3(kThreads), kSmem, stream, overlap, a));
}

inline int device_sms() {
    static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
    return sms;
}

// Shared memory of a launch shape (its stages plus the static partials) fits one block of this
// device (RTX 30/40/50: 99 KB; H200: 227 KB; RDNA3/4: 64 KB). Where four token sets do not, two
// do, and where two do not (64 KB: Q8_0 90,112 B, Q6_K 73,728 B), one: the same bits (every
// launch shape computes the same per-element order).
template <class Q, int NT, int WM, int TS, Shape S>
bool fits_device() {
    static const int limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    constexpr int kStatic = 2 * (kKSplit - 1) * WM * TS * NT * 4 * WARP_SIZE * (int)sizeof(float);
    return limit == 0 || stage_smem_bytes<Q, WM, TS, stages<Q, NT, TS, S>()>() + kStatic <= limit;
}

}  // namespace
