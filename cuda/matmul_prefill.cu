// Prompt-row GEMM (DESIGN 5 rule 1: prefill rows only): y [rows, n] f32 = x [rows, k] f32 @
// W^T (+ bias [n]), W [n, k] GGUF blocks (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q5_0; the readers of
// matmul_kquants.cuh / matmul_blocks.cuh). Reference: luce/ref/matmul_prefill.py (x quantized
// to 8 bits per 32 values, matmul_prefill_x.cuh, then luce/ref/matmul.py on the dequantized
// weights). ABI: luce_matmul_prefill in luce_ops_weights.h.
//
// Arithmetic: per 32-value group b, weight row r and token t, the int8 tensor-core product
// (mma m16n8k32, exact int32) D = sum(qw * qx) of the weight's small integers and x's int8,
// then in f32, for b = 0, 1, ... in order (k alone fixes it):
//   acc = fma(s_rb * d_tb, D, acc)            s_rb: the group's (or 16-value half's) weight scale
//   acc = fma(o_rb, xs_tb, acc)               types with an offset (Q4_K/Q5_K mins, Q5_0's -16)
// y = acc (+ bias). Every output element is one thread's chain over k; no split-K, no
// reduction across threads, so a row's bits never depend on the row count, its position,
// the other rows or the launch shape (kWarps).
//
// Tiles: a block is kWarps warps x 16 weight rows by 64 tokens (matmul_prefill_x.cuh
// kTokTile); a k step is one 256-value chunk (a K-quant super-block, 8 blocks of Q8_0/Q5_0).
// Per step, each warp's 16 rows of weight bytes (LaneCopier, matmul_stage.cuh) and the
// block's 64 tokens of int8 x plus {d, xs} go to shared memory by cp.async, double-buffered
// (only the 8-token sub-tiles holding a live token: a call's last tile is partly padding).
// A warp decodes each group's weights once into A fragments and multiplies them by 8 B
// fragments (8 tokens each, one 8-byte shared load per lane).
// Counted per k step of a 128 x 64 block (kWarps 8, IQ4_XS): 2 * 128 * 64 * 256 = 4.2 MFLOP
// for 17 KB of weights + 16 KB of int8 x + 4 KB of {d, xs} from L2 (~112 FLOP/B: 250 TFLOP/s
// needs ~2.2 TB/s of L2). Per warp and group, 8 mma against ~28 shared-memory wavefronts (B
// fragments 16, {d, xs} 8, weights ~4: ~3.5 clocks per mma at one wavefront per clock) and
// ~15-19 issue slots per mma (the f32 combine: 3-4 ops on each of 4 elements per lane, plus
// loads and the weight decode shared by 8 mma): ~4.75 clocks per mma at 4 issues per clock.
// An SM's int8 peak is ~0.9 m16n8k32 per clock, so the bound is ~20% of the int8 peak
// (~400 TOPS on an H200); expect 200-300 TFLOP/s measured.
#include "matmul_kquants.cuh"
#include "matmul_blocks.cuh"
#include "matmul_stage.cuh"
#include "matmul_prefill_x.cuh"
#include "pdl.cuh"
#include <stdlib.h>
#include <string.h>

// The f16 tensor-core GEMM (cuda/matmul_prefill_f16.cu), taken unless LUCE_PREFILL_GEMM=int8 in
// the environment (read at each call).
extern "C" int luce_matmul_prefill_f16(const luce_matmul_params *p, void *stream);
extern "C" int64_t luce_matmul_prefill_f16_workspace_bytes(int64_t rows, int64_t k);
extern "C" int luce_matmul_prefill_f16_split_k(int32_t qtype, int64_t n, int64_t k);

namespace {

// The f16 GEMM unless LUCE_PREFILL_GEMM=int8 (read per call: tests and benchmarks time both in
// one process; a prompt GEMM is long beside a getenv). f16 is the default since the H200 run of
// 2026-12-03 (docs/PERF.md, session 10): its GPU tests pass, it is faster on every measured
// shape and closer to the f32 product.
bool prefill_gemm_f16() {
    const char *v = getenv("LUCE_PREFILL_GEMM");
    return v == nullptr || strcmp(v, "int8") != 0;
}

using namespace mm;
using namespace mmp;

constexpr int kStagesP = 2;

__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }
constexpr int kXRowBytes = kChunk + 32;  // a token's chunk in shared memory (8-byte loads hit 16 banks)

struct PrefillArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    X8Layout x;
    int64_t rows, n, row_bytes;
};

template <class Q, int kWarps>
struct PrefillSmem {
    static constexpr int kW = kWarps * kStagesP * Stage<Q>::kBytes;  // [warp][stage] weight chunks
    static constexpr int kX = kTokTile * kXRowBytes;                  // per stage: int8 x
    static constexpr int kD = kChunkGroups * kTokTile * 8;            // per stage: {d, xs} [group][token]
    static constexpr int kBytes = kW + kStagesP * (kX + kD);
};

// Group j of the chunk `rd` reads: A fragments, the f32 scale s[h][r] of half h (one half
// unless Q::kHalves) of row r (0: grp, 1: grp + 8), and the offset o[r] per unit of xs.
template <class Q>
__device__ __forceinline__ void group_ops(const Q &rd, int j, int quad, uint32_t a[4], float s[2][2], float o[2]) {
    if constexpr (Q::kIntScale) {
        rd.weights(j, quad, a);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            s[0][r] = __fmul_rn(rd.d[r], (float)rd.scale(j, 0, r));
            s[1][r] = Q::kHalves ? __fmul_rn(rd.d[r], (float)rd.scale(j, 1, r)) : 0.0f;
            if constexpr (Q::kOffset) o[r] = __fmul_rn(rd.negmin[r], (float)ubyte(rd.mn[r][j >> 2], j & 3));
            else o[r] = 0.0f;
        }
    } else {
        GroupOperands op;
        rd.group(j, quad, op);
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = op.a[i];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            s[0][r] = op.scale[0][r];
            s[1][r] = 0.0f;
            o[r] = op.offset[0][r];
        }
    }
}

__device__ __forceinline__ float magic_to_f32(int v) { return __int_as_float(v) - kMagicFloat; }

template <class Q, int kWarps>
__global__ void __launch_bounds__(kWarps * WARP_SIZE, kWarps >= 8 ? 2 : 4 / kWarps + 2) mmp_kernel(PrefillArgs a) {
    using Sm = PrefillSmem<Q, kWarps>;
    constexpr int NT = kTokTile / 8, kThreads = kWarps * WARP_SIZE;
    extern __shared__ uint4 smem_words[];  // 16-byte aligned
    uint8_t *smem = reinterpret_cast<uint8_t *>(smem_words);
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const int64_t tile = ((int64_t)blockIdx.x * kWarps + warp) * 16;  // the warp's first weight row
    const int64_t t0 = (int64_t)blockIdx.y * kTokTile;
    const bool live = tile < a.n;  // warps past the last row still copy x and meet every barrier
    // 8-token sub-tiles holding a live token (the last tile of a call is partly padding: a DFlash
    // C5 pass's 80 rows fill 2 of the second tile's 8). The rest are neither copied nor multiplied:
    // each output is still its one chain over k, so the bits are those of the whole tile.
    const int live_nt = (int)imin64((a.rows - t0 + 7) / 8, NT);
    const int64_t chunks = a.x.chunks;
    uint8_t *wst = smem + warp * kStagesP * Stage<Q>::kBytes;
    uint8_t *xst = smem + Sm::kW;  // stage s at xst + s * (kX + kD)
    LaneCopier<Q, kStagesP> copier(wst, a.w, a.w_end, a.row_bytes, a.n, lane);

    auto copy_x = [&](int s, int64_t ch) {
        uint8_t *xs = xst + s * (Sm::kX + Sm::kD);
        const uint8_t *src = reinterpret_cast<const uint8_t *>(a.x.xq) + t0 * a.x.kp + ch * kChunk;
        for (int i = threadIdx.x; i < 8 * live_nt * (kChunk / 16); i += kThreads) {
            const int tok = i / (kChunk / 16), word = i % (kChunk / 16);
            cp_async16(xs + tok * kXRowBytes + 16 * word, src + tok * a.x.kp + 16 * word, 16);
        }
        uint8_t *ds = xs + Sm::kX;
        for (int i = threadIdx.x; i < kChunkGroups * 4 * live_nt; i += kThreads) {  // 2 float2 per word
            const int j = i / (4 * live_nt), word = i % (4 * live_nt);
            const float2 *g = a.x.xd + (ch * kChunkGroups + j) * a.x.tp + t0;
            cp_async16(ds + j * kTokTile * 8 + 16 * word, reinterpret_cast<const uint8_t *>(g) + 16 * word, 16);
        }
    };

#pragma unroll
    for (int s = 0; s < kStagesP - 1; ++s)
        if (live && s < chunks) copier.copy(s, tile, s, lane);
    wait_for_prior_kernels();  // x is written by quantize_x8 (the kernel ahead)
#pragma unroll
    for (int s = 0; s < kStagesP - 1; ++s) {
        if (s < chunks) copy_x(s, s);
        cp_async_commit();
    }

    const uint8_t *w0 = a.w + imin64(tile + grp, a.n - 1) * a.row_bytes;
    const uint8_t *w1 = a.w + imin64(tile + grp + 8, a.n - 1) * a.row_bytes;
    float acc[NT][4] = {};
    for (int64_t ch = 0; ch < chunks; ++ch) {
        cp_async_wait<kStagesP - 2>();
        __syncthreads();  // stage ch landed for every thread; everyone is done with stage ch - 1
        {
            const int64_t next = ch + kStagesP - 1;
            const int s = (int)(next % kStagesP);
            if (next < chunks) {
                if (live) copier.copy(s, tile, next, lane);
                copy_x(s, next);
            }
            cp_async_commit();
        }
        if (!live) continue;
        const int s = (int)(ch % kStagesP);
        const uint8_t *wsd = wst + s * Stage<Q>::kBytes;
        const uint8_t *xs = xst + s * (Sm::kX + Sm::kD);
        const float4 *ds = reinterpret_cast<const float4 *>(xs + Sm::kX);
        const int ng = Q::kGroupBytes && a.x.groups - ch * kChunkGroups < kChunkGroups
                           ? (int)(a.x.groups - ch * kChunkGroups) : kChunkGroups;
        Q rd;
        rd.load(staged_row<Q>(wsd, grp, w0 + ch * Q::kChunkBytes), staged_row<Q>(wsd, grp + 8, w1 + ch * Q::kChunkBytes),
                quad, ng);
#pragma unroll
        for (int j = 0; j < kChunkGroups; ++j) {
            if (j >= ng) break;
            uint32_t av[4];
            float sc[2][2], off[2];
            group_ops(rd, j, quad, av, sc, off);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (nt >= live_nt) break;
                const uint2 b = *reinterpret_cast<const uint2 *>(xs + (8 * nt + grp) * kXRowBytes + 32 * j + 8 * quad);
                const float4 dd = ds[j * (kTokTile / 2) + 4 * nt + quad];  // {d, xs} of tokens 2 quad, 2 quad + 1
                int dot[2][4];
                if constexpr (Q::kHalves) {
                    mma_k16<false>(av[0], av[1], b.x, kMagicSeed, dot[0]);
                    mma_k16<false>(av[2], av[3], b.y, kMagicSeed, dot[1]);
                } else {
                    mma_k32<false>(av, b.x, b.y, kMagicSeed, dot[0]);
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e >> 1;
                    const float xd = (e & 1) ? dd.z : dd.x, xsum = (e & 1) ? dd.w : dd.y;
                    float v = fmaf(__fmul_rn(sc[0][r], xd), magic_to_f32(dot[0][e]), acc[nt][e]);
                    if constexpr (Q::kHalves) v = fmaf(__fmul_rn(sc[1][r], xd), magic_to_f32(dot[1][e]), v);
                    if constexpr (Q::kOffset) v = fmaf(off[r], xsum, v);
                    acc[nt][e] = v;
                }
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int64_t row = tile + grp + 8 * (e >> 1), tok = t0 + 8 * nt + 2 * quad + (e & 1);
            if (row < a.n && tok < a.rows) {
                float v = acc[nt][e];
                if (a.bias) v = v + a.bias[row];
                a.y[tok * a.n + row] = v;
            }
        }
}

template <class Q, int kWarps>
int launch_prefill_warps(const PrefillArgs &a, cudaStream_t stream) {
    constexpr int kSmem = PrefillSmem<Q, kWarps>::kBytes;
    auto kernel = mmp_kernel<Q, kWarps>;
    static bool ready = false;  // raise the dynamic shared-memory limit once per kernel
    if (!ready) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return luce_status(err);
        ready = true;
    }
    const dim3 grid((unsigned)((a.n + 16 * kWarps - 1) / (16 * kWarps)), (unsigned)(a.x.tp / kTokTile));
    return luce_status(launch_overlapped(kernel, grid, dim3(kWarps * WARP_SIZE), kSmem, stream, true, a));
}

// 8 warps (128 weight rows) per block when that still gives two blocks per SM and its shared
// memory fits (up to 120 KB: not on sm_86 / sm_89, 99 KB), else 4 (more blocks for small n or
// few tokens), else 2 (64 KB LDS of RDNA). Every shape gives the same bits (see the header).
// tune 2, 4 or 8: that many warps per block (tests: the bits of every shape).
template <class Q>
int launch_prefill(const PrefillArgs &a, int tune, cudaStream_t stream) {
    if (tune == 8) return launch_prefill_warps<Q, 8>(a, stream);
    if (tune == 4) return launch_prefill_warps<Q, 4>(a, stream);
    if (tune == 2) return launch_prefill_warps<Q, 2>(a, stream);
    const int64_t blocks8 = (a.n + 127) / 128 * (a.x.tp / kTokTile);
    const mm::DeviceShape &d = mm::device_shape();
    auto fits = [&](int bytes) { return d.smem <= 0 || bytes <= d.smem; };
    if (fits(PrefillSmem<Q, 8>::kBytes) && !(d.sms > 0 && blocks8 < 2 * (int64_t)d.sms))
        return launch_prefill_warps<Q, 8>(a, stream);
    if (fits(PrefillSmem<Q, 4>::kBytes)) return launch_prefill_warps<Q, 4>(a, stream);
    return launch_prefill_warps<Q, 2>(a, stream);
}

}  // namespace

// Enough for either GEMM (the f16 one needs more: 2 bytes per value).
extern "C" int64_t luce_matmul_prefill_workspace_bytes(int64_t rows, int64_t k) {
    if (rows <= 0 || k <= 0) return 0;
    const int64_t f16 = luce_matmul_prefill_f16_workspace_bytes(rows, k), int8 = x8_bytes(rows, k);
    return f16 > int8 ? f16 : int8;
}

extern "C" int luce_matmul_prefill_split_k(int32_t qtype, int64_t n, int64_t k) {
    const int parts = luce_matmul_prefill_f16_split_k(qtype, n, k);  // 0: not a block matrix
    return prefill_gemm_f16() || parts == 0 ? parts : 1;
}

extern "C" int luce_matmul_prefill(const luce_matmul_params *p_in, void *stream_ptr) {
    if (p_in->rows == 0) return 0;
    if (prefill_gemm_f16()) return luce_matmul_prefill_f16(p_in, stream_ptr);
    luce_matmul_params tuned = *p_in;
    // the f16 GEMM's split k (the DFlash draft's own rows) is this GEMM's own choice here
    if (tuned.tune == LUCE_PREFILL_TUNE_SPLIT_K) tuned.tune = 0;
    const luce_matmul_params *p = &tuned;
    const int64_t row_bytes = luce_matmul_row_bytes(p->qtype, p->k);
    if (p->rows < 0 || p->n <= 0 || row_bytes < 0 || !p->x || !p->w || !p->y || !p->workspace ||
        p->workspace_bytes < x8_bytes(p->rows, p->k) || (reinterpret_cast<uintptr_t>(p->x) & 15) ||
        (reinterpret_cast<uintptr_t>(p->workspace) & 15) || p->rows > 65535LL * kTokTile ||
        (p->tune != 0 && p->tune != 2 && p->tune != 4 && p->tune != 8))
        return (int)cudaErrorInvalidValue;
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const X8Layout xl = x8_layout(p->workspace, p->rows, p->k);
    if (!(p->flags & LUCE_MATMUL_REUSE_X)) {
        const int64_t warps = xl.tp * xl.chunks;
        const int per_block = 256 / WARP_SIZE;
        quantize_x8_kernel<<<(unsigned)((warps + per_block - 1) / per_block), 256, 0, stream>>>(p->x, p->rows, p->k, xl);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return luce_status(err);
    }
    const uint8_t *w = static_cast<const uint8_t *>(p->w);
    const PrefillArgs a{w, w + p->n * row_bytes, p->bias, p->y, xl, p->rows, p->n, row_bytes};
    switch (p->qtype) {
        case LUCE_QT_Q4_K: return launch_prefill<ReaderQ4K>(a, p->tune, stream);
        case LUCE_QT_Q5_K: return launch_prefill<ReaderQ5K>(a, p->tune, stream);
        case LUCE_QT_Q6_K: return launch_prefill<ReaderQ6K>(a, p->tune, stream);
        case LUCE_QT_IQ4_XS: return launch_prefill<ReaderIQ4XS>(a, p->tune, stream);
        case LUCE_QT_Q8_0: return launch_prefill<ReaderQ80>(a, p->tune, stream);
        case LUCE_QT_Q5_0: return launch_prefill<ReaderQ50>(a, p->tune, stream);
        default: return (int)cudaErrorInvalidValue;  // float types: luce_matmul
    }
}
