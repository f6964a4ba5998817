// One-row matmul for the integer-scale block types (Q4_K, Q5_K, Q6_K, IQ4_XS), bitwise the
// tensor-core kernel's row (cuda/matmul.cu), for decode steps of one row: y [n] = x @ W^T.
//
// Why a second kernel: one row fills one of the eight token columns of an mma tile, and the
// tile kernel's 16-row warps with 128 registers leave few warps per SM to cover memory
// latency (docs/PERF.md: 28-64% of copy bandwidth at one row). Here a lane takes one 32-value
// group of a 256-value chunk of two rows and multiplies it with 4-way byte dot products
// (dp4a) of the same exact integers; nothing is staged, few registers are live.
//
// Same bits (DESIGN 5 rule 6): per (row, chunk) the integers
//   SH = sum_j scale_j * sum(q * xhi_j), SL = sum_j scale_j * sum(q * xlo_j), MS = sum_j min_j * s_j
// are exact whatever lanes add them, and the float steps are the tile kernel's:
//   c_ch = d * fma(SH, 256, SL) (+ negmin * MS); acc[ch % 4] = fma(xscale_ch, c_ch, acc[ch % 4])
//   in increasing ch; y = ((acc0 + acc1) + acc2) + acc3 (+ bias).
// Lanes compute c_ch in any order into shared memory; one thread per row then runs the
// ordered chain. Layout: a block of kThreads lanes = 16 groups of 8 lanes takes RB rows
// (RB / 2 row pairs x chunks items, item = (pair, chunk), consecutive chunks on neighbouring
// groups); a group's lanes j = 0..7 take the chunk's groups, reduce the three sums over the
// 8 lanes, and lane 0 writes c for both rows. Each group loads its next item's weights
// before it multiplies the current one. x (token 0) is copied into shared memory once per
// block (blocks stay resident and take several row sets): read from L1 per row pair it made
// L1 the busiest unit (ncu, 2026-12-02: 77% L1/TEX at 35% DRAM), its 16-byte words 64 bytes
// apart in every load.
#pragma once

#include "matmul_gemv_types.cuh"
#include "matmul_x.cuh"
#include "pdl.cuh"

namespace mm {

constexpr int kGemvThreads = 128;
constexpr int kGemvGroups = kGemvThreads / 8;  // 8-lane groups per block

// c + sum of the 4 products of signed bytes of a with signed (kUnsignedB false) or unsigned
// bytes of b.
template <bool kUnsignedB>
__device__ __forceinline__ int dp4(uint32_t a, uint32_t b, int c) {
#ifdef __HIPCC__
    for (int i = 0; i < 4; ++i) {
        const int bv = kUnsignedB ? (int)((b >> (8 * i)) & 0xFF) : (int)(int8_t)(b >> (8 * i));
        c += (int)(int8_t)(a >> (8 * i)) * bv;
    }
    return c;
#else
    int d;
    if (kUnsignedB)
        asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else
        asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

struct GemvArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XLayout x;  // token 0 of it
    int64_t n, row_bytes;
};

// Token 0's x in shared memory: per group the 4 quads' words at a stride of 5 words (80 B:
// the 8 lanes of a lane group read 8 groups in one conflict-free pass), then per chunk the
// scale and (kOffset) the 8 group sums.
constexpr int kXStride = 5;

inline size_t gemv_smem_bytes(int64_t chunks, int rb) {
    return (size_t)chunks * (kGroups * kXStride * 16 + 4 + kGroups * 4 + (size_t)rb * 4);
}

struct GemvShared {
    uint4 *xq;   // [groups][kXStride]
    float *xd;   // [chunks]
    int *xsum;   // [chunks][8]: exact integer sum of each group's x (kOffset types)
    float *c;    // [RB][chunks]: c of each (row, chunk)
};

__device__ __forceinline__ GemvShared gemv_shared(void *smem, int chunks) {
    GemvShared sh;
    sh.xq = static_cast<uint4 *>(smem);
    sh.xd = reinterpret_cast<float *>(sh.xq + chunks * kGroups * kXStride);
    sh.xsum = reinterpret_cast<int *>(sh.xd + chunks);
    sh.c = reinterpret_cast<float *>(sh.xsum + chunks * kGroups);
    return sh;
}

// Copies token 0's x into shared memory (the whole block; x is final: after the wait).
template <bool kOffset>
__device__ __forceinline__ void stage_x(const XLayout &x, const GemvShared &sh, int chunks) {
    const int groups = chunks * kGroups;
    for (int i = threadIdx.x; i < groups * 4; i += blockDim.x) sh.xq[(i >> 2) * kXStride + (i & 3)] = __ldg(x.xq + i);
    for (int ch = threadIdx.x; ch < chunks; ch += blockDim.x) sh.xd[ch] = __ldg(x.xd + (int64_t)ch * x.tp);
    if (kOffset) {  // byte planes of the 8 group sums (matmul_x.cuh) to integers
        for (int i = threadIdx.x; i < groups; i += blockDim.x) {
            const int ch = i / kGroups, j = i % kGroups;
            const uint32_t *pl = reinterpret_cast<const uint32_t *>(x.xqp + (int64_t)ch * x.tp * 2) + (j >> 2);
            const uint32_t p0 = byte_of(__ldg(pl), j & 3), p1 = byte_of(__ldg(pl + 2), j & 3);
            const int p2 = (int)(int8_t)byte_of(__ldg(pl + 4), j & 3);
            sh.xsum[i] = p2 * 65536 + (int)(p1 * 256 + p0);
        }
    }
}

// The three exact sums of one row's group j against x (xv: the group's 4 quad words).
template <class G>
__device__ __forceinline__ void group_sums(const typename G::Raw &raw, int j, const uint4 (&xv)[4], int xsum,
                                           int &sh, int &sl, int &ms) {
    GroupWords w;
    G::words(raw, j, w);
    int ph0 = 0, ph1 = 0, pl0 = 0, pl1 = 0;  // values 0..15 / 16..31, high / low x bytes
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        ph0 = dp4<false>(w.lo[q], xv[q].x, ph0);
        ph1 = dp4<false>(w.hi[q], xv[q].y, ph1);
        pl0 = dp4<true>(w.lo[q], xv[q].z, pl0);
        pl1 = dp4<true>(w.hi[q], xv[q].w, pl1);
    }
    int s[2], m;
    G::scales(raw, j, s, m);
    sh = s[0] * ph0 + s[1] * ph1;
    sl = s[0] * pl0 + s[1] * pl1;
    ms = m * xsum;
}

__device__ __forceinline__ int group8_sum(int v) {  // over the 8 lanes of an aligned group
    v += warp_shfl_xor(v, 1);
    v += warp_shfl_xor(v, 2);
    v += warp_shfl_xor(v, 4);
    return v;
}

// A block takes row sets (RB rows) blockIdx.x, + gridDim.x, ...; per set, items (row pair,
// chunk) go round-robin to the 16 lane groups in block-uniform rounds, each group loading
// its next round's weights (the next set's first, across a set's end) before it multiplies;
// then the set's ordered chains run on 4 threads per row.
template <class G, int RB>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvArgs a) {
    extern __shared__ uint4 gemv_words[];
    const int lane = threadIdx.x % 8, grp = threadIdx.x / 8;
    const int chunks = (int)a.x.chunks, items = (RB / 2) * chunks;
    const int rounds = (items + kGemvGroups - 1) / kGemvGroups;
    const int64_t sets = (a.n + RB - 1) / RB;
    const GemvShared sh = gemv_shared(gemv_words, chunks);
    auto row_ptr = [&](int64_t r) { return a.w + (r < a.n ? r : a.n - 1) * a.row_bytes; };
    // Round t of the block's sequence: set blockIdx.x + (t / rounds) * gridDim.x, round t % rounds.
    auto load = [&](int64_t set, int round, typename G::Raw (&raw)[2]) {
        int it = round * kGemvGroups + grp;
        it = it < items ? it : items - 1;  // a group past the last item loads the last one again
        const int pair = it / chunks, ch = it % chunks;
#pragma unroll
        for (int r = 0; r < 2; ++r)
            G::load(raw[r], row_ptr(set * RB + 2 * pair + r) + (int64_t)ch * G::Tensor::kChunkBytes, a.w_end, lane);
    };
    typename G::Raw cur[2], nxt[2];
    if ((int64_t)blockIdx.x < sets) load(blockIdx.x, 0, cur);
    wait_for_prior_kernels();  // x is written by the kernel ahead
    stage_x<G::kOffset>(a.x, sh, chunks);
    __syncthreads();
    for (int64_t set = blockIdx.x; set < sets; set += gridDim.x) {
        for (int round = 0; round < rounds; ++round) {
            if (round + 1 < rounds) load(set, round + 1, nxt);
            else if (set + gridDim.x < sets) load(set + gridDim.x, 0, nxt);
            const int it = round * kGemvGroups + grp;
            const int at = it < items ? it : items - 1, pair = at / chunks, ch = at % chunks;
            uint4 xv[4];
            const uint4 *xg = sh.xq + (ch * kGroups + lane) * kXStride;
#pragma unroll
            for (int q = 0; q < 4; ++q) xv[q] = xg[q];
            const int xsum = G::kOffset ? sh.xsum[ch * kGroups + lane] : 0;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                int s_hi, s_lo, ms;
                group_sums<G>(cur[r], lane, xv, xsum, s_hi, s_lo, ms);
                s_hi = group8_sum(s_hi);
                s_lo = group8_sum(s_lo);
                if (G::kOffset) ms = group8_sum(ms);
                if (lane == 0 && it < items) {
                    float c = __fmul_rn(G::d(cur[r]), fmaf((float)s_hi, 256.0f, (float)s_lo));
                    if (G::kOffset) c = fmaf(G::negmin(cur[r]), (float)ms, c);
                    sh.c[(2 * pair + r) * chunks + ch] = c;
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) cur[r] = nxt[r];
        }
        __syncthreads();
        // The ordered chain: thread 4 r + kp runs acc[kp] of row r over chunks kp, kp + 4, ...;
        // the row's first thread adds the four in order.
        __shared__ float acc_s[4 * RB];
        const int r = threadIdx.x / 4, kp = threadIdx.x % 4;
        if (r < RB) {
            const float *c_row = sh.c + r * chunks;
            float acc = 0.0f;
#pragma unroll 4
            for (int ch = kp; ch < chunks; ch += 4) acc = fmaf(sh.xd[ch], c_row[ch], acc);
            acc_s[threadIdx.x] = acc;
            __syncwarp();  // a row's four threads are in one warp
            const int64_t row = set * RB + r;
            if (kp == 0 && row < a.n) {
                float v = acc_s[4 * r];
#pragma unroll
                for (int s = 1; s < 4; ++s) v = v + acc_s[4 * r + s];
                if (a.bias) v = v + a.bias[row];
                a.y[row] = v;
            }
        }
        __syncthreads();  // the set's c and acc_s are read before the next set writes them
    }
}

template <class G, int RB>
int launch_gemv_rb(const GemvArgs &a, cudaStream_t stream) {
    const size_t smem = gemv_smem_bytes(a.x.chunks, RB);
    auto kernel = gemv_kernel<G, RB>;
    static int per_sm = -1;  // blocks per SM, once per kernel at its largest shared memory
    static size_t raised = 0;
    if (smem > raised) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        raised = smem;
        per_sm = -1;
    }
    if (per_sm < 0) {
#ifdef __HIPCC__
        per_sm = 4;
#else
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads, smem) != cudaSuccess) per_sm = 4;
#endif
    }
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        sms = 132;
    const int64_t sets = (a.n + RB - 1) / RB, resident = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
    const unsigned blocks = (unsigned)(sets < resident ? sets : resident);
    return luce_status(launch_overlapped(kernel, dim3(blocks), dim3(kGemvThreads), smem, stream, true, a));
}

// Rows per block set: 16 for short rows (fewer than 8 chunks: rounds stay busy), else 8; fewer
// while there would be under 2 sets per SM (`sms` 0: unknown).
inline int gemv_rows_per_block(int64_t n, int64_t chunks, int sms) {
    int rb = chunks < 8 ? 16 : 8;
    while (rb > 2 && sms > 0 && (n + rb - 1) / rb < 2 * sms) rb /= 2;
    return rb;
}

template <class G>
int launch_gemv(const GemvArgs &a, int sms, cudaStream_t stream) {
    switch (gemv_rows_per_block(a.n, a.x.chunks, sms)) {
        case 2: return launch_gemv_rb<G, 2>(a, stream);
        case 4: return launch_gemv_rb<G, 4>(a, stream);
        case 8: return launch_gemv_rb<G, 8>(a, stream);
        default: return launch_gemv_rb<G, 16>(a, stream);
    }
}

}  // namespace mm
