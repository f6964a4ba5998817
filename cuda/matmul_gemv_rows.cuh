// Few-row decode matmul (IQ4_XS, Q5_K, Q4_K, Q6_K, Q8_0; 2..8 rows of x): y [M, n] = x [M, k] @ W^T
// (+ bias), the same integers and float steps as the tile kernel (cuda/matmul.cu mmq_kernel,
// matmul_chunk.cuh mmq_chunk_int, and for Q8_0 mmq_chunk_float) and as the one-row kernels (matmul_gemv.cuh,
// matmul_gemv_staged.cuh), so every row of x gets bitwise the row it gets alone or in any other
// call (DESIGN 5 rule 6).
//
// Why (docs/PERF.md, session 13): 2..16-row decode calls (concurrency, chain verify) took the
// tile kernel, whose 16-row warps re-read x from L1 for every row tile and hold 128 registers;
// the 27B at 5 rows spent 12.31 ms a step against 7.76 at one row though the weights (read
// once) dominate both. dp4a over M rows would multiply the one-row kernel's dot products by M
// (16-bit x: 4 dp4a a weight word and row); the tensor cores take the M rows for the same cost.
//
// Layout. Weight rows go in batches of 16 (one mma row tile; the last batch starts at row n - 16
// and stores only its rows past the batch before, as the staged form's), each copied into one of S
// stages (2 or 3): on sm_90 and later thread 0 issues one bulk copy a row (cp.async.bulk; one a
// batch where its rows sit back to back) completing on the stage's mbarrier; elsewhere (sm_80-89, HIP, LUCE_GEMV_COOPERATIVE) every thread copies
// 16-byte words with cp.async. Rows of a multiple of 16 bytes sit `stride` bytes apart in a stage:
// row_bytes, + 16 where that would put the 8 rows of an mma fragment on the same banks (stride / 4
// = 0 mod 8 words). Other rows (Q6_K at k = 5120: 4,200 B; IQ4_XS at an odd chunk count: 8 mod 16)
// sit back to back (stride = row_bytes), as do unpadded ones, and a batch is one copy: batch b starts at
// byte 16 b row_bytes, the last one at (n - 16) row_bytes, 16-byte aligned where n row_bytes is.
// Warp w owns chunk w of k (W = chunks warps: k <= 24 chunks = 6,144, the 27B's gate/up, qkv and
// out) and holds its B fragments for the whole launch: x's 8 groups of token grp (lane = 4 grp +
// quad; tokens >= M zero), 32 registers (Q4_K / Q5_K: the byte planes of x's group sums, for the
// min term, in shared memory; zero past M). For a batch a warp multiplies its chunk of the 16 rows
// (A from the stage: the tile kernel's reader Q) with the 8 token columns: per group j, int32 sums hi, lo (mma m16n8k32 with x's high and low bytes; Q6_K
// two m16n8k16 a group, one a 16-value half h), SH += scale_jh * hi, SL += scale_jh * lo, then per
// (row, token) c = d * fma(SH, 256, SL), for Q4_K / Q5_K c = fma(negmin, MS, c) with MS = sum_j
// min_j * sum(xq_j) (min_sum), into c [2][chunks][16][8] (shared). Q8_0 and Q5_0 (an f16 scale a 32-value
// group; k a multiple of 32: the last chunk may hold fewer groups) take mmq_chunk_float's steps instead:
// c = sum_j scale_j * float(256 hi_j + lo_j) in group order (gemv_rows_group_float); Q5_0's offset terms
// offset_j * sum(x_j) meet acc group by group before a chunk's c, as in the tile kernel: the chain reads
// them from off [2][chunks][16][8] (the rows' offsets) and x's group sums s32 [8][groups].
//
// Per batch t (one block barrier): __syncthreads (turn t - 1 done everywhere: its stage may refill,
// its c is whole), wait for batch t's copy, threads 4 * (M r + m) + kp (r < 16 rows, m < M tokens,
// kp < 4: warps 0 .. 2 M - 1) run the chains of batch t - 1: acc_kp = fma(xscale_ch, c_ch, acc_kp)
// over chunks kp, kp + 4, ... in order, y = ((acc0 + acc1) + acc2) + acc3 (+ bias) by shuffles (the
// tile kernel's order); batch t + S - 1's copy is issued; batch t's sums.
//
// Shapes (27B): gate/up 17408 x 5120 (20 warps, 1,088 batches), qkv 10240 x 5120, out 5120 x 6144
// (24 warps). Shared memory at k = 5120 (IQ4_XS): 16 x 2,736 B a stage, c 20,480 B: 108 KB at 2
// stages, 152 KB at 3; at k = 6144, 126 / 178 KB (Q5_K 196 KB at 3 stages at k = 5120, 167 KB at 2
// at 6144 where 3 do not fit; Q4_K 165 / 198 KB at 3; Q6_K 187 KB at 2 at 6144): 227 KB
// devices (H100/H200) only, the tile kernel elsewhere (99 KB: RTX 30/40/50). Down (k = 17,408: x
// would not fit in registers) takes the large-k form, matmul_gemv_rows_k.cuh.
#pragma once

#include "matmul_blocks.cuh"
#include "matmul_chunk.cuh"
#include "matmul_gemv_staged.cuh"
#include "matmul_kquants.cuh"

namespace mm {

constexpr int kRowsTile = 16;        // weight rows a batch (the mma's rows)
constexpr int kRowsMaxTokens = 8;    // rows of x (the mma's token columns)
constexpr int kRowsMaxChunks = 24;   // a warp a chunk: k <= 6,144
constexpr int kRowsThreads = kRowsMaxChunks * WARP_SIZE;

struct GemvRowsArgs {
    const uint8_t *w;
    const float *bias;
    float *y;
    XLayout x;
    int64_t n, row_bytes;
    int tokens;       // M, 2..8
    int stages;       // S, 2..kStagedMaxStages
    uint32_t stride;  // bytes between a stage's rows
};

// Stage row stride: row_bytes, + 16 where row_bytes / 4 is 0 mod 8 words (the 8 rows grp of a
// fragment's 4-byte loads at one offset would meet on 4 banks: 2-way conflicts; 16 B apart they
// take 32 distinct banks). row_bytes a multiple of 16: row_bytes / 4 = 4 * (row_bytes / 16). Other
// rows: row_bytes (back to back: a batch is one contiguous copy).
inline uint32_t gemv_rows_stride(int64_t row_bytes) {
    return (uint32_t)row_bytes + (row_bytes % 16 == 0 && (row_bytes / 16) % 2 == 0 ? 16u : 0u);
}

// x's per-(token, chunk) scales xd_s [8][chunks] and, for the types with mins, the byte planes
// xp_s [chunks][8][2] of its group sums (zero past M); for Q5_0 in xp_s's place the float sums of its
// groups, s32 [M][groups] (mmq_chunk_float's S0 + S1); staged by threads tid, tid + blockDim.x, ...
template <class Q>
__device__ __forceinline__ void gemv_rows_stage_x(const XLayout &x, int M, int chunks, float *xd_s, uint4 *xp_s,
                                                  int tid) {
    for (int i = tid; i < M * chunks; i += blockDim.x) {
        const int m = i / chunks, c = i - m * chunks;
        xd_s[i] = __ldg(x.xd + (int64_t)c * x.tp + m);
    }
    if constexpr (Q::kOffset && Q::kIntScale) {
        for (int i = tid; i < 2 * kRowsMaxTokens * chunks; i += blockDim.x) {
            const int c = i / (2 * kRowsMaxTokens), m = (i >> 1) % kRowsMaxTokens;
            xp_s[i] = m < M ? __ldg(x.xqp + ((int64_t)c * x.tp + m) * 2 + (i & 1)) : make_uint4(0, 0, 0, 0);
        }
    } else if constexpr (Q::kOffset) {
        float *s32_s = reinterpret_cast<float *>(xp_s);
        const int groups = (int)x.groups;
        for (int i = tid; i < M * groups; i += blockDim.x) {
            const int m = i / groups, g = i - m * groups;
            const float4 s = __ldg(x.xs + (int64_t)g * (x.tp / 2) + m / 2);
            s32_s[i] = (m & 1) ? s.y + s.w : s.x + s.z;
        }
    }
}

// A lane's 4 c values of chunk ch (rows grp, grp + 8; tokens 2 quad, 2 quad + 1) from its integer
// sums: mmq_chunk_int's float steps, into c_ch [16][8].
template <class Q>
__device__ __forceinline__ void gemv_rows_store_c(const Q &rd, const int (&sh)[4], const int (&sl)[4],
                                                  const uint4 *xp_s, int ch, int grp, int quad, float *c_ch) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float c = __fmul_rn(rd.d[r], fmaf((float)sh[e], 256.0f, (float)sl[e]));
        if constexpr (Q::kOffset) {
            const uint4 *p = xp_s + (ch * kRowsMaxTokens + 2 * quad + (e & 1)) * 2;
            const uint4 pb = p[1];
            c = fmaf(rd.negmin[r], (float)min_sum(rd.mn[r], p[0], make_uint2(pb.x, pb.y)), c);
        }
        c_ch[(grp + 8 * r) * kRowsMaxTokens + 2 * quad + (e & 1)] = c;
    }
}

// An integer-scale type's chunk ch: a lane's 4 c values from its sums over the chunk's groups (rows grp,
// grp + 8; tokens 2 quad, 2 quad + 1), into c_ch [16][8].
template <class Q>
__device__ __forceinline__ void gemv_rows_int_c(const Q &rd, const uint4 (&xb)[kGroups], const uint4 *xp_s, int ch,
                                                int grp, int quad, float *c_ch) {
    int sh[4] = {}, sl[4] = {};
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
        uint32_t w[4];
        rd.weights(j, quad, w);
        int hi[4], lo[4];
        if constexpr (!Q::kHalves) {
            mma_k32<false>(w, xb[j].x, xb[j].y, 0, hi);
            mma_k32<true>(w, xb[j].z, xb[j].w, 0, lo);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int s = rd.scale(j, 0, e >> 1);
                sh[e] += s * hi[e];
                sl[e] += s * lo[e];
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mma_k16<false>(w[2 * h], w[2 * h + 1], h ? xb[j].y : xb[j].x, 0, hi);
                mma_k16<true>(w[2 * h], w[2 * h + 1], h ? xb[j].w : xb[j].z, 0, lo);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int s = rd.scale(j, h, e >> 1);
                    sh[e] += s * hi[e];
                    sl[e] += s * lo[e];
                }
            }
        }
    }
    gemv_rows_store_c(rd, sh, sl, xp_s, ch, grp, quad, c_ch);
}

// Q8_0's / Q5_0's group j: the tile kernel's step of mmq_chunk_float, cacc += scale_j * float(256 hi + lo),
// for a lane's rows grp, grp + 8 (e >> 1) and tokens 2 quad, 2 quad + 1 (e & 1); Q5_0: the rows' offsets
// into off_ch [16][8] (group j; quad 0's lanes); returns hi[0] ^ lo[0] (the products are done:
// matmul_gemv_rows_k.cuh's ldg_after).
template <class Q>
__device__ __forceinline__ int gemv_rows_group_float(const Q &rd, int j, int grp, int quad, const uint4 &b,
                                                     float (&cacc)[4], float *off_ch = nullptr) {
    GroupOperands op;
    rd.group(j, quad, op);
    int hi[4], lo[4];
    mma_k32<false>(op.a, b.x, b.y, 0, hi);
    mma_k32<true>(op.a, b.z, b.w, 0, lo);
#pragma unroll
    for (int e = 0; e < 4; ++e) cacc[e] = fmaf(op.scale[0][e >> 1], group_sum<false>(hi[e], lo[e]), cacc[e]);
    if constexpr (Q::kOffset)
        if (quad == 0)
#pragma unroll
            for (int r = 0; r < 2; ++r) off_ch[(grp + 8 * r) * kGroups + j] = op.offset[0][r];
    return hi[0] ^ lo[0];
}

// A lane's 4 c values of a chunk (Q8_0: its cacc) into c_ch [16][8].
__device__ __forceinline__ void gemv_rows_put_c(const float (&c)[4], int grp, int quad, float *c_ch) {
#pragma unroll
    for (int e = 0; e < 4; ++e) c_ch[(grp + 8 * (e >> 1)) * kRowsMaxTokens + 2 * quad + (e & 1)] = c[e];
}

// Chain item i = 4 (M r + m) + kp of a batch's c_b [chunks][16][8]: acc_kp over chunks kp, kp + 4, ...
// in order, and at kp = 0 ((acc0 + acc1) + acc2) + acc3 (the tile kernel's order); whole warps call.
// kOffsets (Q5_0): before each chunk's c its groups' offset terms, off_b [chunks][16][8] x s32 [8][groups].
template <bool kOffsets = false>
__device__ __forceinline__ float gemv_rows_chain(const float *c_b, const float *xd_s, int i, int M, int chunks,
                                                 const float *off_b = nullptr, const float *s32_s = nullptr,
                                                 int groups = 0) {
    const int item = i >> 2, kp = i & 3, r = item / M, m = item - r * M;
    const float *c_rm = c_b + r * kRowsMaxTokens + m, *xd = xd_s + m * chunks;
    float acc = 0.0f;
    for (int c = kp; c < chunks; c += 4) {
        if constexpr (kOffsets) {
            const float *off = off_b + (c * kRowsTile + r) * kGroups, *s32 = s32_s + m * groups + c * kGroups;
            const int ng = groups_in_chunk(groups, c);
            for (int j = 0; j < ng; ++j) acc = fmaf(off[j], s32[j], acc);
        }
        acc = fmaf(xd[c], c_rm[c * kRowsTile * kRowsMaxTokens], acc);
    }
    const float a1 = warp_shfl_xor(acc, 1), a2 = warp_shfl_xor(acc, 2), a3 = warp_shfl_xor(acc, 3);
    float v = acc;
    v = v + a1;
    v = v + a2;
    v = v + a3;
    return v;
}

// Shared memory past the x scales: for the types with mins the byte planes [chunks][8] of x's group sums
// (2 uint4 a token, matmul_x.cuh); for Q5_0 s32 [8][groups] and off [2][chunks][16][8] (floats).
template <class Q>
size_t gemv_rows_x_bytes(const XLayout &x) {
    if (!Q::kOffset) return 0;
    if (Q::kIntScale) return (size_t)kRowsMaxTokens * x.chunks * 2 * sizeof(uint4);
    return (size_t)(kRowsMaxTokens * x.groups + 2 * x.chunks * kRowsTile * kGroups) * sizeof(float);
}

// Dynamic shared memory: S stages, c [2][chunks][16][8], xscale [8][chunks] (floats), then x_bytes
// (gemv_rows_x_bytes).
inline size_t gemv_rows_smem_bytes(const XLayout &x, int64_t row_bytes, int stages, size_t x_bytes) {
    return (size_t)stages * kRowsTile * gemv_rows_stride(row_bytes) +
           (size_t)(2 * kRowsTile + 1) * kRowsMaxTokens * x.chunks * sizeof(float) + x_bytes;
}

#if defined(__HIPCC__)
#define LUCE_GEMV_ROWS_BOUNDS __launch_bounds__(kRowsThreads)
#else
#define LUCE_GEMV_ROWS_BOUNDS __launch_bounds__(kRowsThreads, 1)
#endif

#if LUCE_GEMV_BULK
// A stage's copies: thread 0 arms the mbarrier for `bytes` in all, then copies row by row.
#ifdef LUCE_MM_PORTABLE
__device__ __forceinline__ void bulk_expect(uint64_t *bar, uint32_t bytes) { mbar_step(bar, 1, bytes); }
__device__ __forceinline__ void bulk_copy_part(uint8_t *dst, const uint8_t *src, uint32_t bytes, uint64_t *bar) {
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) != 0) abort();
    std::memcpy(dst, src, bytes);
    mbar_step(bar, 0, -(int64_t)bytes);
}
#else
__device__ __forceinline__ void bulk_expect(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy_part(uint8_t *dst, const uint8_t *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
#endif
#endif

template <class Q>
__global__ void LUCE_GEMV_ROWS_BOUNDS gemv_rows_kernel(GemvRowsArgs a) {
    static_assert(Q::kIntScale != (Q::kGroupBytes != 0), "integer-scale chunks, or Q8_0's / Q5_0's scaled groups");
    constexpr bool kOffsets = Q::kOffset && !Q::kIntScale;  // Q5_0
    extern __shared__ uint4 gemv_rows_words[];  // 16-byte aligned
    uint8_t *stages = reinterpret_cast<uint8_t *>(gemv_rows_words);
    const int chunks = (int)a.x.chunks, n = (int)a.n, S = a.stages, M = a.tokens;
    const uint32_t rb = (uint32_t)a.row_bytes, stride = a.stride, stage_bytes = kRowsTile * stride;
    float *c_s = reinterpret_cast<float *>(stages + (size_t)S * stage_bytes);  // [2][chunks][16][8]
    float *xd_s = c_s + 2 * chunks * kRowsTile * kRowsMaxTokens;               // [8][chunks]
    uint4 *xp_s = reinterpret_cast<uint4 *>(xd_s + kRowsMaxTokens * chunks);   // [chunks][8][2] (kOffset)
    const float *s32_s = reinterpret_cast<const float *>(xp_s);                   // [8][groups] (Q5_0)
    float *off_s = reinterpret_cast<float *>(xp_s) + kRowsMaxTokens * a.x.groups;  // [2][chunks][16][8] (Q5_0)
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, ch = tid / WARP_SIZE, grp = lane >> 2, quad = lane & 3;

    // The block's batches blockIdx.x, + gridDim.x, ... (turn t: the t-th); a batch's first row b * 16,
    // or n - 16 for a last batch past n.
    const int batches = (n + kRowsTile - 1) / kRowsTile, row_step = (int)gridDim.x * kRowsTile;
    const int turns = (int)blockIdx.x < batches ? (batches - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    auto first_row = [&](int row) { return row + kRowsTile <= n ? row : n - kRowsTile; };  // n >= 16
    int issue_row = (int)blockIdx.x * kRowsTile, issue_slot = 0;
#if LUCE_GEMV_BULK
    __shared__ uint64_t full[kStagedMaxStages];  // stage s's copy has landed (phase parity: its uses, & 1)
    if (tid == 0) {
        for (int s = 0; s < kStagedMaxStages; ++s) mbar_init(&full[s], 1);
        mbar_fence_init();
    }
    auto issue = [&](int t) {
        if (tid == 0 && t < turns) {
            uint8_t *dst = stages + issue_slot * stage_bytes;
            const uint8_t *src = a.w + (size_t)first_row(issue_row) * rb;
            bulk_expect(&full[issue_slot], kRowsTile * rb);
            if (stride == rb)  // back to back: the batch in one copy
                bulk_copy_part(dst, src, kRowsTile * rb, &full[issue_slot]);
            else
                for (int r = 0; r < kRowsTile; ++r)
                    bulk_copy_part(dst + r * stride, src + (size_t)r * rb, rb, &full[issue_slot]);
        }
        issue_row += row_step;
        issue_slot = issue_slot + 1 == S ? 0 : issue_slot + 1;
    };
#else
    // Copies: 16-byte word i of a batch (row i / words, word i % words; rows back to back: one row of
    // the batch's 16 row_bytes) by thread i % blockDim.x.
    const bool whole = stride == rb;
    const int words = (int)(whole ? rb : rb / 16), total = (whole ? 1 : kRowsTile) * words;
    auto issue = [&](int t) {
        if (t < turns) {
            const uint8_t *src = a.w + (size_t)first_row(issue_row) * rb;
            uint8_t *dst = stages + issue_slot * stage_bytes;
            for (int i = tid; i < total; i += blockDim.x) {
                const int r = i / words, c = i - r * words;
                cp_async16(dst + r * stride + 16 * c, src + (size_t)r * rb + 16 * c, 16);
            }
        }
        cp_async_commit();  // one group a turn, empty or not: the wait for S - 2 pending counts turns
        issue_row += row_step;
        issue_slot = issue_slot + 1 == S ? 0 : issue_slot + 1;
    };
#endif
    for (int t = 0; t < S - 1; ++t) issue(t);  // weights before the kernel ahead ends
    wait_for_prior_kernels();                  // x is written by the kernel ahead
    let_dependents_start();
    const int ng = chunk_groups<Q>(a.x, ch);  // kGroups but in a last chunk of Q8_0
    uint4 xb[kGroups];  // B fragments of chunk ch: token grp's quad of each group (zero past M and ng)
#pragma unroll
    for (int j = 0; j < kGroups; ++j)
        xb[j] = grp < M && j < ng ? __ldg(a.x.xq + ((int64_t)grp * a.x.groups + (int64_t)ch * kGroups + j) * 4 + quad)
                                  : make_uint4(0, 0, 0, 0);
    gemv_rows_stage_x<Q>(a.x, M, chunks, xd_s, xp_s, tid);

    // Chains of a batch: item i = 4 * (M r + m) + kp (r < 16 rows, m < M tokens, kp < 4) takes acc_kp
    // of row r, token m; 64 M items (whole warps), threads tid, tid + blockDim.x, ...
    int chain_row = (int)blockIdx.x * kRowsTile;
    auto chains = [&](int t) {
        const float *c_b = c_s + (t & 1) * chunks * kRowsTile * kRowsMaxTokens;
        for (int i = tid; i < 4 * kRowsTile * M; i += blockDim.x) {
            float v = gemv_rows_chain<kOffsets>(c_b, xd_s, i, M, chunks, off_s + (t & 1) * chunks * kRowsTile * kGroups,
                                                s32_s, (int)a.x.groups);
            const int item = i >> 2, r = item / M, m = item - r * M, row = first_row(chain_row) + r;
            if ((i & 3) == 0 && row >= chain_row) {  // rows before chain_row: the batch before stores them
                if (a.bias) v = v + a.bias[row];
                a.y[(int64_t)m * n + row] = v;
            }
        }
        chain_row += row_step;
    };

    const uint8_t *warp_chunk = stages + (uint32_t)ch * Q::kChunkBytes;
    int slot = 0;
    uint32_t parity = 0;  // of the stages' current phase (bulk copies): flips when the ring wraps
    for (int t = 0; t < turns; ++t) {
#if LUCE_GEMV_BULK
        __syncthreads();  // every warp is done with turn t - 1: its stage refills, its c is whole
        mbar_wait(&full[slot], parity);
#else
        if (S == 2)  // this thread's copies of turn t
            cp_async_wait<0>();
        else
            cp_async_wait<kStagedMaxStages - 2>();
        __syncthreads();  // everyone's; every warp is done with turn t - 1
#endif
        if (t > 0) chains(t - 1);
        issue(t + S - 1);
        const uint8_t *c0 = warp_chunk + slot * stage_bytes;
        Q rd;
        rd.load(c0 + grp * stride, c0 + (grp + 8) * stride, quad, kGroups);
        float *c_ch = c_s + ((t & 1) * chunks + ch) * kRowsTile * kRowsMaxTokens;
        if constexpr (Q::kIntScale) {
            gemv_rows_int_c(rd, xb, xp_s, ch, grp, quad, c_ch);
        } else {
            float cacc[4] = {};
#pragma unroll
            for (int j = 0; j < kGroups; ++j)
                if (j < ng)
                    gemv_rows_group_float(rd, j, grp, quad, xb[j], cacc,
                                          off_s + ((t & 1) * chunks + ch) * kRowsTile * kGroups);
            gemv_rows_put_c(cacc, grp, quad, c_ch);
        }
        if (++slot == S) {
            slot = 0;
            parity ^= 1;
        }
    }
    __syncthreads();
    if (turns > 0) chains(turns - 1);
}

// The few-row kernel can run: 2..8 rows of x, weights 16-byte aligned and n row_bytes a multiple of
// 16 (every batch's first row 16-byte aligned: Q6_K at k = 5120 needs n even), n >= 16, up to
// kRowsMaxChunks chunks, and two stages' shared memory within the device's opt-in limit (0: unknown,
// 48 KiB; x_bytes: gemv_rows_x_bytes).
inline bool gemv_rows_runs(const uint8_t *w, int64_t rows, int64_t n, const XLayout &x, int64_t row_bytes,
                           size_t x_bytes, int smem_limit) {
    return rows >= 2 && rows <= kRowsMaxTokens && is_aligned16(w) && n >= kRowsTile &&
           n < ((int64_t)1 << 30) && (n * row_bytes) % 16 == 0 && x.chunks <= kRowsMaxChunks &&
           gemv_rows_smem_bytes(x, row_bytes, 2, x_bytes) <= (size_t)(smem_limit > 0 ? smem_limit : 48 << 10);
}

}  // namespace mm
