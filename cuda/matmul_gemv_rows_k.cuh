// Few-row decode matmul at large k (IQ4_XS, 2..8 rows of x, k > 6,144: the 27B's down projection,
// 5120 x 17408): the few-row kernel of matmul_gemv_rows.cuh with k in slices, the same integers,
// c values and chains (the tile kernel's float order: acc_kp = fma(xscale_ch, c_ch, acc_kp) over
// chunks kp, kp + 4, ... in order, y = ((acc0 + acc1) + acc2) + acc3 (+ bias)), so every row gets
// bitwise the tile kernel's and the one-row kernel's row (DESIGN 5 rule 6). The slices only decide
// which warp computes a chunk's c and when; the chains run over all chunks of k once a batch's c is
// whole, so the order depends on k alone, never on the row count, the slices or the launch shape.
//
// Why: at k = 17,408 (68 chunks) one warp a chunk would need 68 warps and a batch of 16 rows 148 KB
// of stage; the tile kernel took the down projection at 38-40 us for 2..8 rows against 18.6 us for
// one row (H200, docs/PERF.md).
//
// Layout. W warps (even, <= kRowsMaxChunks) and P = ceil(chunks / W) slices: slice s holds chunks
// s W .. s W + W - 1 (the last slice fewer: chunks and W even, so every slice row is 16-byte aligned);
// W = ceil(chunks / ceil(chunks / 24)) rounded up to even (68 chunks: 24 warps, slices 24, 24, 20).
// A turn is one (batch of 16 rows, slice): its 16 row slices are copied into one of S stages (bulk
// copies on an mbarrier on sm_90 and later, else cp.async words, as matmul_gemv_rows.cuh), rows
// `stride` bytes apart (slice bytes, + 16 where the fragment rows would meet on the same banks).
// Warp w of turn (t, s) takes chunk s W + w: it loads x's B fragments of that chunk (tokens >= M
// zero; from L2 / L1, as the tile kernel does for each of its row tiles; issued before the turn's
// barrier and copy wait) and stores c of its chunk
// in c [2][chunks][16][8]. At turn (t, 0) the threads run batch t - 1's chains (its c is whole: every
// slice of t - 1 came before the turn's barrier) as matmul_gemv_rows.cuh does.
//
// Shared memory at k = 17,408: 16 x 3,280 B a stage, c 69,632 B, x scales 2,176 B: 229,248 B at 3
// stages, 176,768 at 2: 227 KB devices (H100/H200) only; the tile kernel elsewhere (99 KB: RTX
// 30/40/50; gemv_rows_k_runs).
#pragma once

#include "matmul_gemv_rows.cuh"

namespace mm {

// Warps of the large-k form: W = ceil(chunks / P) for P = ceil(chunks / kRowsMaxChunks) slices,
// rounded up to even (<= kRowsMaxChunks since chunks > kRowsMaxChunks (P - 1) >= W (P - 1)).
inline int gemv_rows_k_warps(int64_t chunks) {
    const int64_t slices = (chunks + kRowsMaxChunks - 1) / kRowsMaxChunks, w = (chunks + slices - 1) / slices;
    return (int)(w + (w & 1));
}

inline uint32_t gemv_rows_k_stride(int64_t chunks) {
    return gemv_rows_stride((int64_t)gemv_rows_k_warps(chunks) * ReaderIQ4XS::kChunkBytes);
}

// Dynamic shared memory: S stages of 16 row slices, c [2][chunks][16][8], xscale [8][chunks].
inline size_t gemv_rows_k_smem_bytes(const XLayout &x, int stages) {
    return (size_t)stages * kRowsTile * gemv_rows_k_stride(x.chunks) +
           (size_t)(2 * kRowsTile + 1) * kRowsMaxTokens * x.chunks * sizeof(float);
}

__global__ void LUCE_GEMV_ROWS_BOUNDS gemv_rows_k_kernel(GemvRowsArgs a) {
    extern __shared__ uint4 gemv_rows_k_words[];  // 16-byte aligned
    uint8_t *stages = reinterpret_cast<uint8_t *>(gemv_rows_k_words);
    const int chunks = (int)a.x.chunks, n = (int)a.n, S = a.stages, M = a.tokens;
    const int W = (int)blockDim.x / WARP_SIZE, slices = (chunks + W - 1) / W;
    const uint32_t rb = (uint32_t)a.row_bytes, stride = a.stride, stage_bytes = kRowsTile * stride;
    float *c_s = reinterpret_cast<float *>(stages + (size_t)S * stage_bytes);  // [2][chunks][16][8]
    float *xd_s = c_s + 2 * chunks * kRowsTile * kRowsMaxTokens;               // [8][chunks]
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, grp = lane >> 2, quad = lane & 3;

    // The block's batches blockIdx.x, + gridDim.x, ... (t: the t-th), each in `slices` turns.
    const int batches = (n + kRowsTile - 1) / kRowsTile, row_step = (int)gridDim.x * kRowsTile;
    const int turns = (int)blockIdx.x < batches ? (batches - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = turns * slices;
    auto first_row = [&](int row) { return row + kRowsTile <= n ? row : n - kRowsTile; };  // n >= 16
    auto slice_bytes = [&](int s) {
        const int left = chunks - s * W;
        return (uint32_t)((left < W ? left : W) * ReaderIQ4XS::kChunkBytes);
    };
    int issue_u = 0, issue_s = 0, issue_row = (int)blockIdx.x * kRowsTile, issue_slot = 0;
    auto advance_issue = [&]() {
        ++issue_u;
        if (++issue_s == slices) {
            issue_s = 0;
            issue_row += row_step;
        }
        issue_slot = issue_slot + 1 == S ? 0 : issue_slot + 1;
    };
#if LUCE_GEMV_BULK
    __shared__ uint64_t full[kStagedMaxStages];  // stage s's copy has landed (phase parity: its uses, & 1)
    if (tid == 0) {
        for (int s = 0; s < kStagedMaxStages; ++s) mbar_init(&full[s], 1);
        mbar_fence_init();
    }
    auto issue = [&]() {
        if (tid == 0 && issue_u < total) {
            const uint32_t bytes = slice_bytes(issue_s);
            uint8_t *dst = stages + issue_slot * stage_bytes;
            const uint8_t *src = a.w + (size_t)first_row(issue_row) * rb + (size_t)issue_s * W * ReaderIQ4XS::kChunkBytes;
            bulk_expect(&full[issue_slot], kRowsTile * bytes);
            for (int r = 0; r < kRowsTile; ++r) bulk_copy_part(dst + r * stride, src + (size_t)r * rb, bytes, &full[issue_slot]);
        }
        advance_issue();
    };
#else
    // Copies: 16-byte word i of a turn (row i / words, word i % words) by thread i % blockDim.x.
    auto issue = [&]() {
        if (issue_u < total) {
            const int words = (int)(slice_bytes(issue_s) / 16), all = kRowsTile * words;
            const uint8_t *src = a.w + (size_t)first_row(issue_row) * rb + (size_t)issue_s * W * ReaderIQ4XS::kChunkBytes;
            uint8_t *dst = stages + issue_slot * stage_bytes;
            for (int i = tid; i < all; i += blockDim.x) {
                const int r = i / words, c = i - r * words;
                cp_async16(dst + r * stride + 16 * c, src + (size_t)r * rb + 16 * c, 16);
            }
        }
        cp_async_commit();  // one group a turn, empty or not: the wait for S - 2 pending counts turns
        advance_issue();
    };
#endif
    for (int u = 0; u < S - 1; ++u) issue();  // weights before the kernel ahead ends
    wait_for_prior_kernels();                 // x is written by the kernel ahead
    let_dependents_start();
    for (int i = tid; i < M * chunks; i += blockDim.x) {
        const int m = i / chunks, c = i - m * chunks;
        xd_s[i] = __ldg(a.x.xd + (int64_t)c * a.x.tp + m);
    }

    // Chains of a batch (as matmul_gemv_rows.cuh): item i = 4 * (M r + m) + kp takes acc_kp of row r,
    // token m over chunks kp, kp + 4, ...; 64 M items (whole warps).
    int chain_row = (int)blockIdx.x * kRowsTile;
    auto chains = [&](int t) {
        const float *c_b = c_s + (t & 1) * chunks * kRowsTile * kRowsMaxTokens;
        for (int i = tid; i < 4 * kRowsTile * M; i += blockDim.x) {
            const int item = i >> 2, kp = i & 3, r = item / M, m = item - r * M;
            const float *c_rm = c_b + r * kRowsMaxTokens + m, *xd = xd_s + m * chunks;
            float acc = 0.0f;
            for (int c = kp; c < chunks; c += 4) acc = fmaf(xd[c], c_rm[c * kRowsTile * kRowsMaxTokens], acc);
            const float a1 = warp_shfl_xor(acc, 1), a2 = warp_shfl_xor(acc, 2), a3 = warp_shfl_xor(acc, 3);
            const int row = first_row(chain_row) + r;
            if (kp == 0 && row >= chain_row) {  // rows before chain_row: the batch before stores them
                float v = acc;
                v = v + a1;
                v = v + a2;
                v = v + a3;
                if (a.bias) v = v + a.bias[row];
                a.y[(int64_t)m * n + row] = v;
            }
        }
        chain_row += row_step;
    };

    const uint8_t *warp_chunk = stages + (uint32_t)warp * ReaderIQ4XS::kChunkBytes;
    int slot = 0, t = 0, s = 0;
    uint32_t parity = 0;  // of the stages' current phase (bulk copies): flips when the ring wraps
    for (int u = 0; u < total; ++u) {
        const int ch = s * W + warp;
        uint4 xb[kGroups];  // B fragments of chunk ch: token grp's quad of each group (zero past M), loaded
        if (ch < chunks) {  // before the waits below (L2 latency under the copy's)
#pragma unroll
            for (int j = 0; j < kGroups; ++j)
                xb[j] = grp < M ? __ldg(a.x.xq + ((int64_t)grp * a.x.groups + (int64_t)ch * kGroups + j) * 4 + quad)
                                : make_uint4(0, 0, 0, 0);
        }
#if LUCE_GEMV_BULK
        __syncthreads();  // every warp is done with turn u - 1: its stage refills, its c is whole
        mbar_wait(&full[slot], parity);
#else
        if (S == 2)  // this thread's copies of turn u
            cp_async_wait<0>();
        else
            cp_async_wait<kStagedMaxStages - 2>();
        __syncthreads();  // everyone's; every warp is done with turn u - 1
#endif
        if (s == 0 && t > 0) chains(t - 1);
        issue();
        if (ch < chunks) {  // whole warps
            const uint8_t *c0 = warp_chunk + slot * stage_bytes;
            ReaderIQ4XS rd;
            rd.load(c0 + grp * stride, c0 + (grp + 8) * stride, quad, kGroups);
            int sh[4] = {}, sl[4] = {};
#pragma unroll
            for (int j = 0; j < kGroups; ++j) {
                uint32_t w[4];
                rd.weights(j, quad, w);
                int hi[4], lo[4];
                mma_k32<false>(w, xb[j].x, xb[j].y, 0, hi);
                mma_k32<true>(w, xb[j].z, xb[j].w, 0, lo);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int sc = rd.scale(j, 0, e >> 1);
                    sh[e] += sc * hi[e];
                    sl[e] += sc * lo[e];
                }
            }
            float *c_b = c_s + ((t & 1) * chunks + ch) * kRowsTile * kRowsMaxTokens;
#pragma unroll
            for (int e = 0; e < 4; ++e)  // row grp + 8 (e >> 1), token 2 quad + (e & 1)
                c_b[(grp + 8 * (e >> 1)) * kRowsMaxTokens + 2 * quad + (e & 1)] =
                    __fmul_rn(rd.d[e >> 1], fmaf((float)sh[e], 256.0f, (float)sl[e]));
        }
        if (++slot == S) {
            slot = 0;
            parity ^= 1;
        }
        if (++s == slices) {
            s = 0;
            ++t;
        }
    }
    __syncthreads();
    if (turns > 0) chains(turns - 1);
}

// The large-k form can run: 2..8 rows of x, IQ4_XS weights 16-byte aligned, n >= 16, an even chunk
// count over kRowsMaxChunks (below it matmul_gemv_rows.cuh's form), and two stages' shared memory
// within the device's opt-in limit (0: unknown, 48 KiB).
inline bool gemv_rows_k_runs(const uint8_t *w, int64_t rows, int64_t n, const XLayout &x, int smem_limit) {
    return rows >= 2 && rows <= kRowsMaxTokens && (reinterpret_cast<uintptr_t>(w) & 15) == 0 && n >= kRowsTile &&
           n < ((int64_t)1 << 30) && x.chunks % 2 == 0 && x.chunks > kRowsMaxChunks && x.chunks < ((int64_t)1 << 16) &&
           gemv_rows_k_smem_bytes(x, 2) <= (size_t)(smem_limit > 0 ? smem_limit : 48 << 10);
}

// Launch (the caller checked gemv_rows_k_runs): 3 stages where they fit, else 2; a one-wave grid of
// every resident block, block b taking batches b, b + grid, ...
inline int launch_gemv_rows_k(GemvRowsArgs a, int smem_limit, cudaStream_t stream) {
    const int threads = gemv_rows_k_warps(a.x.chunks) * WARP_SIZE;
    const size_t limit = (size_t)(smem_limit > 0 ? smem_limit : 48 << 10);
    a.stride = gemv_rows_k_stride(a.x.chunks);
    a.stages = gemv_rows_k_smem_bytes(a.x, 3) <= limit ? 3 : 2;
    const size_t smem = gemv_rows_k_smem_bytes(a.x, a.stages);
    static size_t smem_set = 48 << 10;  // the kernel's shared-memory limit, raised to the largest launch so far
    if (smem > smem_set) {
        const cudaError_t err = cudaFuncSetAttribute(gemv_rows_k_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        smem_set = smem;
    }
    static struct { size_t smem; int threads, blocks; } seen[8] = {};  // resident blocks by launch size
    int res = 0;
    for (auto &e : seen) {
        if (e.smem == smem && e.threads == threads) { res = e.blocks; break; }
        if (e.smem == 0) {
            e = {smem, threads, resident_blocks(gemv_rows_k_kernel, threads, smem)};
            res = e.blocks;
            break;
        }
    }
    if (res == 0) res = resident_blocks(gemv_rows_k_kernel, threads, smem);
    const int64_t batches = (a.n + kRowsTile - 1) / kRowsTile;
    const int64_t grid = res > 0 && res < batches ? res : batches;
    return luce_status(launch_overlapped(gemv_rows_k_kernel, dim3((unsigned)grid), dim3(threads), smem, stream, true, a));
}

}  // namespace mm
