// The f16 prompt-row GEMM on Hopper warpgroup MMAs (sm_90a; tune 32 of
// cuda/matmul_prefill_f16.cu, whose header gives the arithmetic: the same weight decode, the
// same f16 x, one f32 accumulator chain per output element over k in increasing 16-value
// steps, no split-K). Per block: 2 warpgroups x kMT m64 tiles of weight rows by 128 tokens.
//
// Per k step (one 256-value chunk), double-buffered by cp.async like mmh_kernel: each warp's
// 16-row weight chunks (LaneCopier) and the block's 128 tokens x 256 f16 of x, stored as four
// 128-byte-swizzled 64-value tiles [atom][token][128 B] (cuda/wgmma_f16.cuh) for the B operand.
// Per 32-value group a warp decodes its rows into A fragments (registers, as mmh_kernel), then
// its warpgroup issues kMT x 2 wgmma m64n128k16 (A registers, B shared) and commits them; the
// next group's decode runs while they do (two A buffers; wait<1> before a buffer is reused).
// All MMAs of a chunk end (wait<0>) before the barrier after which its stage is refilled.
// Counted (IQ4_XS, kMT 1: 128 rows x 128 tokens): per k step 8.4 MFLOP for 22 KB of weights and
// 64 KB of x from L2; kMT 2 (256 x 128) 16.8 MFLOP for 44 + 64 KB. Shared memory: 2 x 64 KB of x
// plus 2 stages of every warp's weight chunks (kMT 1: IQ4_XS 45 KB, Q8_0 78 KB).
#pragma once

#include "matmul_prefill_f16_decode.cuh"
#include "matmul_prefill_xh.cuh"
#include "matmul_stage.cuh"
#include "pdl.cuh"
#include "wgmma_f16.cuh"

namespace mmh {

constexpr int kWgTok = 128;                          // tokens per block (the B tile's N)
constexpr int kWgAtom = kWgTok * 128;                // one 64-value swizzled tile of x: 16 KB
constexpr int kWgXStage = (kChunk / 64) * kWgAtom;   // a chunk of x: 64 KB

template <class Q, int kMT>
struct WgSmem {
    static constexpr int kWarpW = kMT * 2 * Stage<Q>::kBytes;  // per warp: [stage][m tile]
    static constexpr int kBytes = 1024 + 2 * kWgXStage + 8 * kWarpW;  // 1 KB: aligning the x tiles
};

// Whether this build holds the sm_90a kernel for the current device (CUDA 9.0 devices only).
template <class K>
bool wgmma_ready(K kernel) {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
}

template <class Q, int kMT, class Args>
__global__ void __launch_bounds__(256, 1) mmw_kernel(Args a) {
#ifdef LUCE_WGMMA
    extern __shared__ float4 smem4[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(smem4);
    {  // the x tiles start 1,024-byte aligned in the shared window (the swizzle's period)
        const uint32_t at = (uint32_t)__cvta_generic_to_shared(smem);
        smem += ((at + 1023u) & ~1023u) - at;
    }
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const int g = warp / 4, wq = warp % 4;  // warpgroup, warp within it
    const int64_t t0 = (int64_t)blockIdx.x * kWgTok;
    int64_t row0[kMT];  // first of the warp's 16 rows in m tile m
#pragma unroll
    for (int m = 0; m < kMT; ++m) row0[m] = (int64_t)blockIdx.y * 128 * kMT + (g * kMT + m) * 64 + wq * 16;
    const int64_t chunks = a.x.chunks;
    uint8_t *xst = smem;
    uint8_t *wst = smem + 2 * kWgXStage + warp * WgSmem<Q, kMT>::kWarpW;
    LaneCopier<Q, kMT * 2> copier(wst, a.w, a.w_end, a.row_bytes, a.n, lane);

    auto copy_w = [&](int s, int64_t ch) {
#pragma unroll
        for (int m = 0; m < kMT; ++m)
            if (row0[m] < a.n) copier.copy(kMT * s + m, row0[m], ch, lane);
    };
    auto copy_x = [&](int s, int64_t ch) {  // 128 tokens x 32 units of 16 bytes
        uint8_t *xs = xst + s * kWgXStage;
        const uint8_t *src = reinterpret_cast<const uint8_t *>(a.x.xh + t0 * a.x.kp + ch * kChunk);
        for (int i = threadIdx.x; i < kWgTok * 32; i += 256) {
            const int tok = i / 32, unit = i % 32;
            cp_async16(xs + (unit / 8) * kWgAtom + wg::swizzle_unit(tok, unit % 8), src + tok * a.x.kp * 2 + 16 * unit, 16);
        }
    };

    copy_w(0, 0);
    wait_for_prior_kernels();  // xh is written by scale_x_f16_kernel (the kernel ahead)
    copy_x(0, 0);
    cp_async_commit();

    const uint8_t *wrow[kMT][2];
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int64_t row = row0[m] + grp + 8 * r;
            wrow[m][r] = a.w + (row < a.n ? row : a.n - 1) * a.row_bytes;
        }
    float acc[kMT][16][4] = {};
    for (int64_t ch = 0; ch < chunks; ++ch) {
        cp_async_wait<0>();
        __syncthreads();  // stage ch landed for every thread; every MMA of chunk ch - 1 has ended
        if (ch + 1 < chunks) {
            copy_w((int)((ch + 1) & 1), ch + 1);
            copy_x((int)((ch + 1) & 1), ch + 1);
        }
        cp_async_commit();
        const int s = (int)(ch & 1);
        const uint8_t *xs = xst + s * kWgXStage;
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
                const uint64_t b = wg::desc_sw128(xs + (j / 2) * kWgAtom + 64 * (j & 1) + 32 * h);
#pragma unroll
                for (int m = 0; m < kMT; ++m) wg::mma_64x128x16(acc[m], av[j & 1][m][h], b);
            }
            wg::commit();
            wg::wait<1>();  // group j - 1's MMAs have ended: its A buffer may be decoded into
        }
        wg::wait<0>();
#pragma unroll
        for (int m = 0; m < kMT; ++m) wg::fence_operands(acc[m]);
    }
    store_tiles(acc, a, row0, t0, grp, quad);
#else
    (void)a;
#endif
}

// Launch of mmw_kernel<Q, kMT>: blocks (token tiles of 128, weight tiles of 128 kMT rows);
// cudaErrorInvalidDeviceFunction where this build has no sm_90a code for the device.
template <class Q, int kMT, class Args>
int launch_wgmma(const Args &a, cudaStream_t stream) {
    constexpr int kSmem = WgSmem<Q, kMT>::kBytes;
    auto kernel = mmw_kernel<Q, kMT, Args>;
    static int ready = 0;  // 1: runs here; -1: not (checked and the shared-memory limit raised once)
    if (ready == 0) {
        ready = wgmma_ready(kernel) &&
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) == cudaSuccess
                    ? 1
                    : -1;
        (void)cudaGetLastError();
    }
    if (ready < 0) return (int)cudaErrorInvalidDeviceFunction;
    const dim3 grid((unsigned)(a.x.tp / kWgTok), (unsigned)((a.n + 128 * kMT - 1) / (128 * kMT)));
    return luce_status(launch_overlapped(kernel, grid, dim3(256), kSmem, stream, true, a));
}

}  // namespace mmh
