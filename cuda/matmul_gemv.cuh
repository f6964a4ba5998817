// One-row matmul for the block types (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q5_0), bitwise the
// tensor-core kernel's row (cuda/matmul.cu), for decode steps of one row: y [n] = x @ W^T.
// This is its register form; IQ4_XS takes a staged form by default (weights through shared
// memory, cuda/matmul_gemv_staged.cuh) and this one where that cannot run or at tune 7.
//
// Why a second kernel: one row fills one of the eight token columns of an mma tile, and the
// tile kernel's 16-row warps with 128 registers leave few warps per SM to cover memory
// latency. Here every lane multiplies one 32-value group of the weights with 4-way byte dot
// products (dp4a) of the same exact integers, and keeps its group of x in registers for the
// whole launch: a lane's x is loaded once, the weights stream past (docs/PERF.md, session 6:
// the kernel before re-read 64 bytes of x per 18-26 bytes of weights and saturated L1).
//
// Same bits (DESIGN 5 rule 6): the integer group sums are exact whatever lanes add them, and
// the float steps are the tile kernel's (matmul_chunk.cuh), in two forms (matmul_gemv_c.cuh):
// integer scales, per (row, chunk)
//   SH = sum_j scale_j * sum(q * xhi_j), SL = sum_j scale_j * sum(q * xlo_j), MS = sum_j min_j * s_j,
//   c_ch = d * fma(SH, 256, SL) (+ negmin * MS); acc[ch % 4] = fma(xscale_ch, c_ch, acc[ch % 4]);
// f16 scales per group (Q8_0, Q5_0), per chunk cacc = fma(scale_j, f32(group sum_j), cacc) and
//   (Q5_0) acc[ch % 4] = fma(offset_j, S_j, acc[ch % 4]) over the chunk's groups j in order, then
//   acc[ch % 4] = fma(xscale_ch, cacc, acc[ch % 4]);
// chunks in increasing ch; y = ((acc0 + acc1) + acc2) + acc3 (+ bias). k of the 32-value types
// need not be whole chunks: the last chunk's groups past k are neither loaded from x nor summed.
//
// Layout. Lane L of warp w takes group j = L % 8 of chunk (s * W + w) * CW + L / 8 for each of its
// CPL chunk slots s (CW = WARP_SIZE / 8 chunks per warp, W warps = all the chunks of k): a block
// covers the whole of k, so it owns whole rows (a reader with kOwnLayout, IQ4_XS, splits its
// chunk's 8 groups over the chunk's 8 lanes its own way: cuda/matmul_gemv_iq4.cuh). Rows go in
// batches of R (launch_gemv); block b takes batches b, b + grid, ... For a batch a lane multiplies
// its groups of the R rows (loaded the batch before), issues the next batch's loads, and puts its
// share into shared memory: integer scales, the 8 lanes of a chunk add their R partial sums by a
// transposing butterfly (7 shuffles for 8 rows, not 24), after which lane j holds the sums of row
// j * R / 8 and writes that row's c; f16 scales, every lane writes its (group sum, scale) of each
// row. The last warp of the block to finish a batch (a shared counter) runs the ordered chains of
// its R rows: thread 4r + kp takes acc[kp] of row r, and the four meet in order by shuffles. c
// lives in a ring of C::kRing batches; the block synchronizes once per kRing batches before reusing
// it: 16 for the integer-scale types (one float a chunk and row), so a block of a 27B FFN matrix
// (3-7 batches) never waits there (ncu had 25% of the warps' time at a ring of 4's barrier;
// removing it left the time as it was, docs/PERF.md session 12).
#pragma once

#include "matmul_gemv_c.cuh"
#include "matmul_gemv_x.cuh"
#include "pdl.cuh"

namespace mm {

constexpr int kGemvMaxThreads = 512;
constexpr int kGemvChunksPerWarp = WARP_SIZE / 8;

struct GemvArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XLayout x;  // token 0 of it (with xf: its chunks and groups only)
    int64_t n, row_bytes;
    int warps;  // W: ceil(chunks / (CPL * CW))
    const float *xf;  // token 0's f32 x where the kernel quantizes it in lane (matmul_gemv_x.cuh), else null
};

// Block: `warps` warps (all chunks of k, CPL chunk slots a lane); rows in batches of R.
// Dynamic shared memory (gemv_smem_bytes): c [C::kRing][R][chunks][C::kFloatsPerChunk], the x
// scales [chunks], then for GroupFloatC with offsets the f32 sums of x's groups [groups].
// kX: x quantized in lane from a.xf (matmul_gemv_x.cuh), else read from the workspace a.x.
// The block's work. kShare: as block `block` of `grid`, its share of a launch over two weights
// (gemv_pair_kernel); else as blockIdx.x of gridDim.x (gemv_kernel: the registers it had as a
// kernel of its own).
template <class G, int CPL, int R, bool kX, bool kShare = false>
__device__ __forceinline__ void gemv_block(const GemvArgs &a, unsigned block = 0, unsigned grid = 0) {
    using C = GemvC<G, CPL, R>;
    const auto block_id = [&]() -> unsigned { if constexpr (kShare) return block; else return blockIdx.x; };
    const auto blocks = [&]() -> unsigned { if constexpr (kShare) return grid; else return gridDim.x; };
    constexpr int CW = kGemvChunksPerWarp, FC = C::kFloatsPerChunk, kRing = C::kRing;
    static_assert(R == 1 || R == 2 || R == 4 || R == 8, "rows8_sum takes 1, 2, 4 or 8 rows");
    extern __shared__ float c_s[];
    __shared__ unsigned arrived[kRing];
    const int chunks = (int)a.x.chunks, groups = (int)a.x.groups, W = a.warps;
    float *xd_s = c_s + kRing * R * FC * chunks, *xs_s = xd_s + chunks;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, j = lane % 8;
    int ch[CPL], jg[CPL];  // the lane's chunk and group in it (inside the row where past k)
    bool live[CPL];        // the lane's group is one of k's
#pragma unroll
    for (int s = 0; s < CPL; ++s) {
        ch[s] = (s * W + warp) * CW + lane / 8;
        live[s] = ch[s] < chunks;
        if (!live[s]) ch[s] = chunks - 1;  // loads stay inside the row; the sums are dropped
        jg[s] = j;
        if (G::kGroupScale) {  // 32-value blocks: a last chunk may hold fewer than 8 groups
            const int last = groups - 1 - ch[s] * kGroups;
            live[s] = live[s] && j <= last;
            jg[s] = j <= last ? j : last;
        }
    }
    const int64_t batches = (a.n + R - 1) / R;
    typename G::Raw raw[CPL][R];
    // Weight addresses: the lane's chunks of row 0 once; a batch's first row as a 64-bit offset
    // (b * R * row_bytes, the same for the block's lanes), its rows r as 32-bit offsets past it (a
    // row is far below 4 GiB); rows past n re-read row n - 1 (the last batch only).
    const uint8_t *w_ch[CPL];
#pragma unroll
    for (int s = 0; s < CPL; ++s) w_ch[s] = a.w + (int64_t)ch[s] * G::Tensor::kChunkBytes;
    const uint32_t rb = (uint32_t)a.row_bytes;
    auto load_batch = [&](int64_t b) {
        const int64_t boff = b * R * a.row_bytes;
        uint32_t off[R];
#pragma unroll
        for (int r = 0; r < R; ++r) off[r] = r * rb;
        if (b * R + R > a.n) {
            const int last = (int)(a.n - 1 - b * R);
#pragma unroll
            for (int r = 1; r < R; ++r) off[r] = (uint32_t)(r < last ? r : last) * rb;
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int s = 0; s < CPL; ++s) {
                if constexpr (G::kOwnLayout)
                    G::load_at(raw[s][r], w_ch[s] + boff, off[r], jg[s]);
                else
                    G::load(raw[s][r], w_ch[s] + boff + off[r], a.w_end, jg[s]);
            }
    };
    if (block_id() < batches) load_batch(block_id());  // weights before the kernel ahead ends
    if (threadIdx.x < kRing) arrived[threadIdx.x] = 0;
    wait_for_prior_kernels();  // x is written by the kernel ahead
    let_dependents_start();    // the kernel after may be scheduled (it waits for this one to end)
    GroupX gx[CPL];
    if constexpr (kX) {  // a live lane j = 0 stores its chunk's scale, a live lane its group's S_j
#pragma unroll
        for (int s = 0; s < CPL; ++s) {
            float xd, xs;
            gemv_quantize_x<G>(a.xf, ch[s], jg[s], gx[s], xd, xs);
            if (live[s] && j == 0) xd_s[ch[s]] = xd;
            if (G::kGroupScale && G::kOffset && live[s]) xs_s[ch[s] * kGroups + j] = xs;
        }
    } else {
#pragma unroll
        for (int s = 0; s < CPL; ++s) gemv_load_x<G>(a.x, ch[s], jg[s], gx[s]);
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) xd_s[c] = __ldg(a.x.xd + (int64_t)c * a.x.tp);
        if (G::kGroupScale && G::kOffset)  // S_j of token 0 as mmq_chunk_float adds it
            for (int g = threadIdx.x; g < groups; g += blockDim.x) {
                const float4 xs = __ldg(a.x.xs + (int64_t)g * (a.x.tp / 2));
                xs_s[g] = xs.x + xs.z;
            }
    }
    __syncthreads();
    int turn = 0;  // batches this block has done
    for (int64_t b = block_id(); b < batches; b += blocks(), ++turn) {
        C form;
        form.take(raw, jg, gx, j);
        if (b + blocks() < batches) load_batch(b + blocks());  // in flight while this batch finishes
        const int slot = turn % kRing;
        float *c_slot = c_s + slot * R * FC * chunks;
        form.put(c_slot, ch, live, j, chunks);
        // The last warp to finish the batch runs its R rows' ordered chains.
        __threadfence_block();
        __syncwarp();
        unsigned before = 0;
        if (lane == 0) before = atomicAdd(&arrived[slot], 1u);
        before = warp_shfl(before, 0);
        if (before == (unsigned)W - 1) {
            __threadfence_block();
            const int r = lane / 4, kp = lane % 4;
            const float acc = r < R ? C::chain(c_slot + r * FC * chunks, xd_s, xs_s, kp, chunks, groups) : 0.0f;
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
        if (slot == kRing - 1) __syncthreads();  // every chain of the ring is done before it refills
    }
}

template <class G, int CPL, int R, bool kX>
__global__ void __launch_bounds__(kGemvMaxThreads) gemv_kernel(GemvArgs a) {
    gemv_block<G, CPL, R, kX>(a);
}


// Dynamic shared memory of gemv_kernel<G, CPL, R, kX> (see there).
template <class G, int CPL, int R>
size_t gemv_smem_bytes(const XLayout &x) {
    constexpr bool kXs = G::kGroupScale && G::kOffset;
    using C = GemvC<G, CPL, R>;
    return ((size_t)(C::kRing * R * C::kFloatsPerChunk + 1) * x.chunks + (kXs ? x.groups : 0)) *
           sizeof(float);
}

// A one-wave grid of balanced blocks for `batches` within `cap` resident blocks (0: unknown, one
// block a batch): every block takes the same number of batches (+-1).
inline int64_t balanced_grid(int64_t batches, int64_t cap) {
    const int64_t grid = cap > 0 && cap < batches ? cap : batches;
    const int64_t per_block = (batches + grid - 1) / grid;
    return (batches + per_block - 1) / per_block;
}

template <class G, int CPL, int R, bool kX>
int launch_gemv_cpl(GemvArgs a, cudaStream_t stream) {
    a.warps = (int)((a.x.chunks + CPL * kGemvChunksPerWarp - 1) / (CPL * kGemvChunksPerWarp));
    const int threads = a.warps * WARP_SIZE;
    const size_t smem = gemv_smem_bytes<G, CPL, R>(a.x);
    // Occupancy by block width, sized at its first call: widths differ in shared memory by a few
    // chunks' c at most (3 * R * 256 B for GroupFloatC), and registers, not shared memory,
    // bound the blocks per SM.
    static int resident[kGemvMaxThreads / WARP_SIZE + 1] = {};
    auto kernel = gemv_kernel<G, CPL, R, kX>;
    int &res = resident[a.warps];
    if (res == 0) res = resident_blocks(kernel, threads, smem);
    const int64_t grid = balanced_grid((a.n + R - 1) / R, res);
    return luce_status(launch_overlapped(kernel, dim3((unsigned)grid), dim3(threads), smem, stream, true, a));
}

// Chunk slots per lane: one while every chunk of k fits one block of lanes, else two; 0: k too
// wide for this kernel (the tile kernel runs).
inline int gemv_slots(int64_t chunks) {
    const int64_t lanes_chunks = (int64_t)(kGemvMaxThreads / WARP_SIZE) * kGemvChunksPerWarp;
    return chunks <= lanes_chunks ? 1 : chunks <= 2 * lanes_chunks ? 2 : 0;
}

// The launch of x's k: chunk slots (gemv_slots) and rows a batch, G::kRows a lane (half as many
// with two chunk slots), twice that with `deep` (more bytes in flight a warp, more registers:
// tune 6). The same bits either way. F(CPL, R) is called with the pair as constants.
template <class G, class F>
auto with_gemv_shape(const XLayout &x, bool deep, F f) {
    constexpr int R1 = G::kRows, R2 = G::kRows / 2 > 0 ? G::kRows / 2 : 1;
    using std::integral_constant;
    if (gemv_slots(x.chunks) == 1)
        return deep ? f(integral_constant<int, 1>(), integral_constant<int, 2 * R1>())
                    : f(integral_constant<int, 1>(), integral_constant<int, R1>());
    return deep ? f(integral_constant<int, 2>(), integral_constant<int, R1>())
                : f(integral_constant<int, 2>(), integral_constant<int, R2>());
}

// The launch's shared memory fits without raising the kernel's limit (48 KiB), else the tile
// kernel runs. Always for ChunkIntC; GroupFloatC holds 256 B a chunk and row of a batch in the
// ring: Q5_0 / Q8_0 run at k up to 11,776 / 12,032 at 4 rows a batch (5,888 at 8, tune 6) and,
// with two chunk slots a lane (k over 16,384) and 2 rows a batch, up to 22,784 / 24,320 (not at
// tune 6 there).
template <class G>
bool gemv_fits(const XLayout &x, bool deep) {
    return with_gemv_shape<G>(x, deep, [&](auto cpl, auto r) {
        return gemv_smem_bytes<G, decltype(cpl)::value, decltype(r)::value>(x) <= (48 << 10);
    });
}

// The one-row kernel of type G quantizes x in lane at this shape (`deep`: twice the rows a batch,
// where G::kDeepInLane; sm_90 spilled registers for the others).
template <class G>
bool gemv_x_in_lane(bool deep) { return !deep || G::kDeepInLane; }

// a.xf set: x quantized in lane (the workspace neither read nor written; gemv_x_in_lane).
template <class G>
int launch_gemv(const GemvArgs &a, bool deep, cudaStream_t stream) {
    return with_gemv_shape<G>(a.x, deep, [&](auto cpl, auto r) {
        constexpr int C = decltype(cpl)::value, R = decltype(r)::value;
        constexpr bool kDeep = C == 1 ? R == 2 * G::kRows : R == G::kRows;
        if constexpr (kDeep && !G::kDeepInLane) {
            return a.xf ? (int)cudaErrorInvalidValue : launch_gemv_cpl<G, C, R, false>(a, stream);
        } else {
            return a.xf ? launch_gemv_cpl<G, C, R, true>(a, stream) : launch_gemv_cpl<G, C, R, false>(a, stream);
        }
    });
}

}  // namespace mm
