// The f16 prompt-row GEMM on Hopper warpgroup MMAs (sm_90a; tunes 32, 64, 48 and 80 of
// cuda/matmul_prefill_f16.cu, whose header gives the arithmetic: the same weight decode, the
// same f16 x, one f32 accumulator chain per output element over k in increasing 16-value
// steps, no split-K). Per block: 2 warpgroups x kMT m64 tiles of weight rows by kTok tokens
// (128; 80 or 48 for a few rows, as a DFlash pass's 80: a 128-token tile would multiply 48 pad
// tokens and bring 60% more x from L2 per weight tile).
//
// Per k step (one 256-value chunk), double-buffered by cp.async like mmh_kernel: each warp's
// 16-row weight chunks (LaneCopier) and the block's kTok tokens x 256 f16 of x, stored as four
// 128-byte-swizzled 64-value tiles [atom][token][128 B] (cuda/wgmma_f16.cuh) for the B operand.
// Per 32-value group a warp decodes its rows into A fragments (registers, as mmh_kernel), then
// its warpgroup issues kMT x 2 wgmma m64nk16 (N = kTok; A registers, B shared) and commits them;
// the next group's decode runs while they do (two A buffers; wait<1> before a buffer is reused).
// All MMAs of a chunk end (wait<0>) before the barrier after which its stage is refilled.
// Counted (IQ4_XS, kMT 1: 128 rows x 128 tokens): per k step 8.4 MFLOP for 22 KB of weights and
// 64 KB of x from L2; kMT 2 (256 x 128) 16.8 MFLOP for 44 + 64 KB. Shared memory: 2 x 64 KB of x
// plus 2 stages of every warp's weight chunks (kMT 1: IQ4_XS 45 KB, Q8_0 78 KB). At 80 tokens x
// is 2 x 40 KB, so kMT 2 fits for Q6_K (the LM head: 204 KB) where 128 tokens do not (260 KB).
// The bits of an output do not depend on kTok or kMT: each is the same chain of k16 steps over
// the same A and B values (the GPU test test_f16_wgmma_bits_are_the_mma_bits).
// Split k (gridDim.z = Z > 1, a cluster of Z blocks along z; tune 81): block z runs the chunks
// [chunks z / Z, chunks (z + 1) / Z) into its own chain, writes it to its shared memory, and after
// a cluster barrier block z sums elements z, z + Z, .. as ((p0 + p1) + p2) + .. in rank order from
// the cluster's blocks, then stores them: other bits than Z = 1 (Z more f32 roundings, within the
// reference's bound), the same for every row count, for the 5,120-row matrices whose 27 row
// blocks leave 4 of 5 SMs idle at a DFlash pass's 80 rows.
#pragma once

#include "matmul_prefill_f16_decode.cuh"
#include "matmul_prefill_xh.cuh"
#include "matmul_stage.cuh"
#include "cluster.cuh"
#include "pdl.cuh"
#include "wgmma_f16.cuh"

namespace mmh {

template <class Q, int kMT, int kTok = 128, int kWG = 2>
struct WgSmem {
    static_assert(kTok == 128 || kTok == 80 || kTok == 48, "token tiles: 128, 80, 48 (wg::mma_64xnx16)");
    static constexpr int kAtom = kTok * 128;             // one 64-value swizzled tile of x (a multiple of 1 KB)
    static constexpr int kXStage = (kChunk / 64) * kAtom;  // a chunk of x: 64 KB at 128 tokens
    static constexpr int kWarpW = kMT * 2 * Stage<Q>::kBytes;  // per warp: [stage][m tile]
    static constexpr int kBytes = 1024 + 2 * kXStage + 4 * kWG * kWarpW;  // 1 KB: aligning the x tiles
};

// Whether this build holds the sm_90a kernel for the current device (CUDA 9.0 devices only;
// the host emulator runs it).
template <class K>
bool wgmma_ready(K kernel) {
#ifdef LUCE_WGMMA_HOST
    (void)kernel;
    return true;
#else
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
#endif
}

template <class Q, int kMT, int kTok, int kWG, class Args>
__global__ void __launch_bounds__(128 * kWG, 1) mmw_kernel(Args a) {
    using Sm = WgSmem<Q, kMT, kTok, kWG>;
    constexpr int kWarps = 4 * kWG;
#if defined(LUCE_WGMMA) || defined(LUCE_WGMMA_HOST)
    extern __shared__ float4 smem4[];
    uint8_t *smem = wg::align_1024(reinterpret_cast<uint8_t *>(smem4));  // the x tiles' base
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const int g = warp / 4, wq = warp % 4;  // warpgroup, warp within it
    const int64_t t0 = (int64_t)blockIdx.x * kTok;
    int64_t row0[kMT];  // first of the warp's 16 rows in m tile m
#pragma unroll
    for (int m = 0; m < kMT; ++m) row0[m] = (int64_t)blockIdx.y * 64 * kMT * kWG + (g * kMT + m) * 64 + wq * 16;
    const int Z = (int)gridDim.z, rank = (int)blockIdx.z;
    const int64_t ch_first = a.x.chunks * rank / Z, ch_end = a.x.chunks * (rank + 1) / Z;  // this block's k part
    uint8_t *xst = smem;
    uint8_t *wst = smem + 2 * Sm::kXStage + warp * Sm::kWarpW;
    LaneCopier<Q, kMT * 2> copier(wst, a.w, a.w_end, a.row_bytes, a.n, lane);

    auto copy_w = [&](int s, int64_t ch) {
#pragma unroll
        for (int m = 0; m < kMT; ++m)
            if (row0[m] < a.n) copier.copy(kMT * s + m, row0[m], ch, lane);
    };
    // x: warp w copies 16-byte unit `lane` of tokens w, w + kWarps, ... (one base address a
    // thread; at 8 warps swizzle_unit(w + 8 i, u) = swizzle_unit(w, u) + 1,024 i); a tile past the
    // padded rows (kTok not dividing kRowPad) takes zeros there.
    const uint8_t *x_lane = reinterpret_cast<const uint8_t *>(a.x.xh + (t0 + warp) * a.x.kp) + 16 * lane;
    const int x_dst = (lane / 8) * Sm::kAtom + wg::swizzle_unit(warp, lane % 8);
    auto copy_x = [&](int s, int64_t ch) {
        uint8_t *xs = xst + s * Sm::kXStage;
        const uint8_t *src = x_lane + ch * kChunk * 2;
#pragma unroll
        for (int i = 0; i < (kTok + kWarps - 1) / kWarps; ++i) {
            const int tok = warp + kWarps * i;
            if (kTok % kWarps != 0 && tok >= kTok) break;
            const int dst = kWarps % 8 == 0 ? x_dst + 128 * kWarps * i
                                            : (lane / 8) * Sm::kAtom + wg::swizzle_unit(tok, lane % 8);
            if constexpr (kRowPad % kTok == 0) {
                cp_async16(xs + dst, src + i * 2 * kWarps * a.x.kp, 16);
            } else {
                const bool in = t0 + tok < a.x.tp;
                cp_async16(xs + dst, in ? src + i * 2 * kWarps * a.x.kp : src, in ? 16 : 0);
            }
        }
    };

    copy_w(0, ch_first);
    wait_for_prior_kernels();  // xh is written by scale_x_f16_kernel (the kernel ahead)
    copy_x(0, ch_first);
    cp_async_commit();

    const uint8_t *wrow[kMT][2];
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int64_t row = row0[m] + grp + 8 * r;
            wrow[m][r] = a.w + (row < a.n ? row : a.n - 1) * a.row_bytes;
        }
    float acc[kMT][kTok / 8][4] = {};
    for (int64_t ch = ch_first; ch < ch_end; ++ch) {
        cp_async_wait<0>();
        __syncthreads();  // stage ch landed for every thread; every MMA of chunk ch - 1 has ended
        const int s = (int)((ch - ch_first) & 1);
        if (ch + 1 < ch_end) {
            copy_w(s ^ 1, ch + 1);
            copy_x(s ^ 1, ch + 1);
        }
        cp_async_commit();
        const uint8_t *xs = xst + s * Sm::kXStage;
        Q rd[kMT];
        const int ng = load_chunk(rd, [&](int m) { return wst + (kMT * s + m) * Stage<Q>::kBytes; }, wrow, a.x.groups, ch,
                                  grp, quad);
        uint32_t av[2][kMT][2][4];  // [buffer][m tile][half][fragment]
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (j >= ng) break;
#pragma unroll
            for (int m = 0; m < kMT; ++m) decode_group_f16(rd[m], j, quad, av[j & 1][m]);
            wg::fence();  // the decode's registers are written before the MMAs read them
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint64_t b = wg::desc_sw128(xs + (j / 2) * Sm::kAtom + 64 * (j & 1) + 32 * h);
#pragma unroll
                for (int m = 0; m < kMT; ++m) wg::mma_64xnx16(acc[m], av[j & 1][m][h], b);
            }
            wg::commit();
            wg::wait<1>();  // group j - 1's MMAs have ended: its A buffer may be decoded into
        }
        wg::wait<0>();
#pragma unroll
        for (int m = 0; m < kMT; ++m) wg::fence_operands(acc[m]);
    }
    if (Z == 1) {
        store_tiles(acc, a, row0, t0, grp, quad);
        return;
    }
    // Split k: every thread's chain to the x stages (free: the last chunk's MMAs have ended), element
    // i of thread t at part[i * threads + t]; block z then sums and stores elements z, z + Z, ..
    constexpr int kNT = kTok / 8, kElems = kMT * kNT * 4, kThreads = 128 * kWG;
    static_assert(kElems * kThreads * 4 <= 2 * Sm::kXStage, "the k parts' sums fit the x stages");
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages
    float *part = reinterpret_cast<float *>(xst) + threadIdx.x;
    const float *flat = &acc[0][0][0];  // element (m, nt, e) at (m * kNT + nt) * 4 + e
#pragma unroll
    for (int i = 0; i < kElems; ++i) part[i * kThreads] = flat[i];
    cluster::sync();  // every block's k-part sums are in its shared memory
    for (int i = rank; i < kElems; i += Z) {
        float v = cluster::map(part, 0)[i * kThreads];
        for (int r = 1; r < Z; ++r) v = v + cluster::map(part, (unsigned)r)[i * kThreads];
        const int m = i / (kNT * 4), nt = (i / 4) % kNT, e = i % 4;
        store_element(v, a, row0[m], t0, grp, quad, nt, e);
    }
    cluster::sync();  // no block leaves (its shared memory) before the others have read it
#else
    (void)a;
#endif
}

// Whether mmw_kernel<Q, kMT, kTok, kWG> runs on this device (sm_90a code for it), its shared-memory
// limit raised (checked once).
template <class Q, int kMT, int kTok, int kWG, class Args>
bool wgmma_runs_here() {
    constexpr int kSmem = WgSmem<Q, kMT, kTok, kWG>::kBytes;
    static_assert(kSmem <= 227 * 1024, "an H100/H200 block's shared memory");
    static const bool ready = [] {
        auto kernel = mmw_kernel<Q, kMT, kTok, kWG, Args>;
        const bool ok = wgmma_ready(kernel) &&
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) == cudaSuccess;
        (void)cudaGetLastError();
        return ok;
    }();
    return ready;
}

// The k parts mmw_kernel<Q, kMT, kTok, kWG> runs for z asked (1 <= z <= the chunks): z where this device
// launches clusters of z of its blocks, else 1.
template <class Q, int kMT, int kTok, int kWG, class Args>
int wgmma_parts_here(int z) {
    constexpr int kSmem = WgSmem<Q, kMT, kTok, kWG>::kBytes;
    const bool fits = z > 1 && cluster::launches() &&
                      cluster::fits<mmw_kernel<Q, kMT, kTok, kWG, Args>>((unsigned)z, 128 * kWG, kSmem);
    return fits ? z : 1;
}

// Launch of mmw_kernel<Q, kMT, kTok, kWG>: blocks of kWG warpgroups (token tiles of kTok holding
// live rows, weight tiles of 64 kMT kWG rows), k split over clusters of wgmma_parts_here(z) blocks;
// cudaErrorInvalidDeviceFunction where this build has no sm_90a code for the device.
template <class Q, int kMT, int kTok = 128, int kWG = 2, class Args>
int launch_wgmma(const Args &a, cudaStream_t stream, int z = 1) {
    if (!wgmma_runs_here<Q, kMT, kTok, kWG, Args>()) return (int)cudaErrorInvalidDeviceFunction;
    constexpr int kSmem = WgSmem<Q, kMT, kTok, kWG>::kBytes, kRowsBlock = 64 * kMT * kWG;
    auto kernel = mmw_kernel<Q, kMT, kTok, kWG, Args>;
    const unsigned tiles = (unsigned)((a.rows + kTok - 1) / kTok);
    const unsigned row_blocks = (unsigned)((a.n + kRowsBlock - 1) / kRowsBlock);
    z = wgmma_parts_here<Q, kMT, kTok, kWG, Args>(z);
    if (z > 1)
        return luce_status(cluster::launch(kernel, dim3(tiles, row_blocks, (unsigned)z), dim3(128 * kWG), kSmem, stream,
                                           true, (unsigned)z, a));
    return luce_status(launch_overlapped(kernel, dim3(tiles, row_blocks), dim3(128 * kWG), kSmem, stream, true, a));
}

}  // namespace mmh
