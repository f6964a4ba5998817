// One-row matmul for the integer-scale block types (Q4_K, Q5_K, Q6_K, IQ4_XS), bitwise the
// tensor-core kernel's row (cuda/matmul.cu), for decode steps of one row: y [n] = x @ W^T.
//
// Why a second kernel: one row fills one of the eight token columns of an mma tile, and the
// tile kernel's 16-row warps with 128 registers leave few warps per SM to cover memory
// latency. Here every lane multiplies one 32-value group of the weights with 4-way byte dot
// products (dp4a) of the same exact integers, and keeps its group of x in registers for the
// whole launch: a lane's x is loaded once, the weights stream past (docs/PERF.md, session 6:
// the kernel before re-read 64 bytes of x per 18-26 bytes of weights and saturated L1).
//
// Same bits (DESIGN 5 rule 6): per (row, chunk) the integers
//   SH = sum_j scale_j * sum(q * xhi_j), SL = sum_j scale_j * sum(q * xlo_j), MS = sum_j min_j * s_j
// are exact whatever lanes add them, and the float steps are the tile kernel's:
//   c_ch = d * fma(SH, 256, SL) (+ negmin * MS); acc[ch % 4] = fma(xscale_ch, c_ch, acc[ch % 4])
//   in increasing ch; y = ((acc0 + acc1) + acc2) + acc3 (+ bias).
//
// Layout. Lane L of warp w takes group j = L % 8 of chunk (s * W + w) * CW + L / 8 for each of
// its CPL chunk slots s (CW = WARP_SIZE / 8 chunks per warp, W warps = all the chunks of k):
// a block covers the whole of k, so it owns whole rows. Rows go in batches of R (launch_gemv);
// block b takes batches b, b + grid, ... For a batch a lane multiplies its groups of the R rows
// (loaded the batch before), issues the next batch's loads, and the 8 lanes of a chunk add their R partial sums by a
// transposing butterfly (7 shuffles for 8 rows, not 24), after which lane j holds the sums of
// row j * R / 8 and writes that row's c into shared memory. The last warp of the block to
// finish a batch (a shared counter) runs the ordered chains of its R rows: thread 4r + kp
// takes acc[kp] of row r, and the four meet in order by shuffles. c lives in a ring of
// kGemvRing batches; the block synchronizes once per kGemvRing batches before reusing it.
#pragma once

#include "matmul_gemv_types.cuh"
#include "matmul_x.cuh"
#include "pdl.cuh"

namespace mm {

constexpr int kGemvMaxThreads = 512;
constexpr int kGemvRing = 4;                     // batches of c in flight per block
constexpr int kGemvChunksPerWarp = WARP_SIZE / 8;

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
    int warps;  // W: ceil(chunks / (CPL * CW))
};

// x operands of group g of token 0: the 4 quads' words and (kOffset) the group's integer sum.
struct GroupX {
    uint4 v[4];
    int s;
};

template <bool kOffset>
__device__ __forceinline__ void load_group_x(const XLayout &x, int64_t ch, int j, GroupX &gx) {
    const int64_t g = ch * kGroups + j;
#pragma unroll
    for (int q = 0; q < 4; ++q) gx.v[q] = __ldg(x.xq + g * 4 + q);
    gx.s = 0;
    if (kOffset) {  // byte planes of the chunk's 8 group sums (matmul_x.cuh)
        const uint32_t *pl = reinterpret_cast<const uint32_t *>(x.xqp + ch * x.tp * 2) + (j >> 2);
        const uint32_t p0 = byte_of(__ldg(pl), j & 3), p1 = byte_of(__ldg(pl + 2), j & 3);
        const int p2 = (int)(int8_t)byte_of(__ldg(pl + 4), j & 3);
        gx.s = p2 * 65536 + (int)(p1 * 256 + p0);
    }
}

// The three exact sums of one row's group j against x.
template <class G>
__device__ __forceinline__ void group_sums(const typename G::Raw &raw, int j, const GroupX &gx, int &sh, int &sl,
                                           int &ms) {
    GroupWords w;
    G::words(raw, j, w);
    int ph0 = 0, ph1 = 0, pl0 = 0, pl1 = 0;  // values 0..15 / 16..31, high / low x bytes
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        ph0 = dp4<false>(w.lo[q], gx.v[q].x, ph0);
        ph1 = dp4<false>(w.hi[q], gx.v[q].y, ph1);
        pl0 = dp4<true>(w.lo[q], gx.v[q].z, pl0);
        pl1 = dp4<true>(w.hi[q], gx.v[q].w, pl1);
    }
    int s[2], m;
    G::scales(raw, j, s, m);
    sh = s[0] * ph0 + s[1] * ph1;
    sl = s[0] * pl0 + s[1] * pl1;
    ms = m * gx.s;
}

// Sums of R rows over the 8 lanes of an aligned group, transposed: v[0] of lane j ends as the
// total of row j * R / 8 (lanes j, j + 1, ... j + 8 / R - 1 hold the same row). Integer adds:
// exact in any order.
template <int R>
__device__ __forceinline__ int rows8_sum(int (&v)[R]) {
#pragma unroll
    for (int t = 0; t < 3; ++t) {
        const int m = 4 >> t, held = R >> t;  // rows held before this step (0: one row, summed)
        const bool upper = (threadIdx.x & m) != 0;
        if (held > 1) {
#pragma unroll
            for (int i = 0; i < R / 2; ++i) {
                if (i < held / 2) {
                    const int send = upper ? v[i] : v[i + held / 2];
                    const int keep = upper ? v[i + held / 2] : v[i];
                    v[i] = keep + warp_shfl_xor(send, m);
                }
            }
        } else {
            v[0] += warp_shfl_xor(v[0], m);
        }
    }
    return v[0];
}

// Block: `warps` warps (all chunks of k, CPL chunk slots a lane); rows in batches of R.
// Dynamic shared memory: c [kGemvRing][R][chunks] floats, then the x scales [chunks].
template <class G, int CPL, int R>
__global__ void __launch_bounds__(kGemvMaxThreads) gemv_kernel(GemvArgs a) {
    constexpr int CW = kGemvChunksPerWarp;
    static_assert(R == 1 || R == 2 || R == 4 || R == 8, "rows8_sum takes 1, 2, 4 or 8 rows");
    extern __shared__ float c_s[];
    __shared__ unsigned arrived[kGemvRing];
    const int chunks = (int)a.x.chunks, W = a.warps;
    float *xd_s = c_s + kGemvRing * R * chunks;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, j = lane % 8;
    const int myrow = j * R / 8;                 // the row of a batch whose c this lane writes
    const bool writer = (j % (8 / R)) == 0;
    int ch[CPL];
    bool live[CPL];
#pragma unroll
    for (int s = 0; s < CPL; ++s) {
        ch[s] = (s * W + warp) * CW + lane / 8;
        live[s] = ch[s] < chunks;
        if (!live[s]) ch[s] = chunks - 1;  // loads stay inside the row; the sums are dropped
    }
    const int64_t batches = (a.n + R - 1) / R;
    typename G::Raw raw[CPL][R];
    auto load_batch = [&](int64_t b) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = b * R + r < a.n ? b * R + r : a.n - 1;
            const uint8_t *w_row = a.w + row * a.row_bytes;
#pragma unroll
            for (int s = 0; s < CPL; ++s) G::load(raw[s][r], w_row + (int64_t)ch[s] * G::Tensor::kChunkBytes, a.w_end, j);
        }
    };
    if (blockIdx.x < batches) load_batch(blockIdx.x);  // weights before the kernel ahead ends
    if (threadIdx.x < kGemvRing) arrived[threadIdx.x] = 0;
    wait_for_prior_kernels();  // x is written by the kernel ahead
    let_dependents_start();    // the kernel after may be scheduled (it waits for this one to end)
    GroupX gx[CPL];
#pragma unroll
    for (int s = 0; s < CPL; ++s) load_group_x<G::kOffset>(a.x, ch[s], j, gx[s]);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) xd_s[c] = __ldg(a.x.xd + (int64_t)c * a.x.tp);
    __syncthreads();
    int turn = 0;  // batches this block has done
    for (int64_t b = blockIdx.x; b < batches; b += gridDim.x, ++turn) {
        int sh[CPL][R], sl[CPL][R], ms[CPL][R];
        float d[CPL], negmin[CPL];
#pragma unroll
        for (int s = 0; s < CPL; ++s) {
            d[s] = negmin[s] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                group_sums<G>(raw[s][r], j, gx[s], sh[s][r], sl[s][r], ms[s][r]);
                if (r == myrow) {
                    d[s] = G::d(raw[s][r]);
                    negmin[s] = G::negmin(raw[s][r]);
                }
            }
        }
        if (b + gridDim.x < batches) load_batch(b + gridDim.x);  // in flight while this batch finishes
        const int slot = turn % kGemvRing;
        float *c_slot = c_s + slot * R * chunks;
#pragma unroll
        for (int s = 0; s < CPL; ++s) {
            const int SH = rows8_sum<R>(sh[s]), SL = rows8_sum<R>(sl[s]);
            const int MS = G::kOffset ? rows8_sum<R>(ms[s]) : 0;
            if (writer && live[s]) {
                float c = __fmul_rn(d[s], fmaf((float)SH, 256.0f, (float)SL));
                if (G::kOffset) c = fmaf(negmin[s], (float)MS, c);
                c_slot[myrow * chunks + ch[s]] = c;
            }
        }
        // The last warp to finish the batch runs its R rows' ordered chains.
        __threadfence_block();
        __syncwarp();
        unsigned before = 0;
        if (lane == 0) before = atomicAdd(&arrived[slot], 1u);
        before = warp_shfl(before, 0);
        if (before == (unsigned)W - 1) {
            __threadfence_block();
            const int r = lane / 4, kp = lane % 4;
            float acc = 0.0f;
            if (r < R)
                for (int c = kp; c < chunks; c += 4) acc = fmaf(xd_s[c], c_slot[r * chunks + c], acc);
            const float a1 = warp_shfl_xor(acc, 1), a2 = warp_shfl_xor(acc, 2), a3 = warp_shfl_xor(acc, 3);
            const int64_t row = b * R + r;
            if (r < R && kp == 0 && row < a.n) {
                float v = acc;
                v = v + a1;
                v = v + a2;
                v = v + a3;
                if (a.bias) v = v + a.bias[row];
                a.y[row] = v;
            }
            if (lane == 0) arrived[slot] = 0;
        }
        if (slot == kGemvRing - 1) __syncthreads();  // every chain of the ring is done before it refills
    }
}

// Blocks of `kernel` with `threads` threads and `smem` bytes resident at once on the device (0 if
// unknown); the tile kernel's one-wave grids use it too (cuda/matmul.cu).
template <class K>
int resident_blocks(K kernel, int threads, size_t smem) {
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
        return 0;
#ifdef __HIPCC__
    (void)kernel; (void)threads; (void)smem;
    per_sm = 2;
#else
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) return 0;
#endif
    return sms * per_sm;
}

template <class G, int CPL, int R>
int launch_gemv_cpl(GemvArgs a, cudaStream_t stream) {
    a.warps = (int)((a.x.chunks + CPL * kGemvChunksPerWarp - 1) / (CPL * kGemvChunksPerWarp));
    const int threads = a.warps * WARP_SIZE;
    const size_t smem = (size_t)(kGemvRing * R + 1) * a.x.chunks * sizeof(float);
    // Occupancy by block width, sized at its first call: widths differ in shared memory by a few
    // chunks' c at most, and registers, not shared memory, bound the blocks per SM.
    static int resident[kGemvMaxThreads / WARP_SIZE + 1] = {};
    auto kernel = gemv_kernel<G, CPL, R>;
    int &res = resident[a.warps];
    if (res == 0) res = resident_blocks(kernel, threads, smem);
    // A one-wave grid of balanced blocks: every block takes the same number of batches (+-1).
    const int64_t batches = (a.n + R - 1) / R;
    int64_t grid = res > 0 && res < batches ? res : batches;
    const int64_t per_block = (batches + grid - 1) / grid;
    grid = (batches + per_block - 1) / per_block;
    return luce_status(launch_overlapped(kernel, dim3((unsigned)grid), dim3(threads), smem, stream, true, a));
}

// Chunk slots per lane: one while every chunk of k fits one block of lanes, else two; 0: k too
// wide for this kernel (the tile kernel runs).
inline int gemv_slots(int64_t chunks) {
    const int64_t lanes_chunks = (int64_t)(kGemvMaxThreads / WARP_SIZE) * kGemvChunksPerWarp;
    return chunks <= lanes_chunks ? 1 : chunks <= 2 * lanes_chunks ? 2 : 0;
}

// Rows a batch: G::kRows a lane (half as many with two chunk slots), twice that with `deep`
// (more bytes in flight a warp, more registers: tune 6). The same bits either way.
template <class G>
int launch_gemv(const GemvArgs &a, bool deep, cudaStream_t stream) {
    constexpr int R1 = G::kRows, R2 = G::kRows / 2 > 0 ? G::kRows / 2 : 1;
    if (gemv_slots(a.x.chunks) == 1)
        return deep ? launch_gemv_cpl<G, 1, 2 * R1>(a, stream) : launch_gemv_cpl<G, 1, R1>(a, stream);
    return deep ? launch_gemv_cpl<G, 2, R1>(a, stream) : launch_gemv_cpl<G, 2, R2>(a, stream);
}

}  // namespace mm
