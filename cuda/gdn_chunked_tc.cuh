// Gated DeltaNet chunked prefill on tensor cores (TF32 mma, f32 accumulation, f32 state): the
// WY / UT-transform chunk form. Reference: luce/ref/gdn_chunked.py. Entry point and params:
// luce_gdn_chunked (cuda/gdn_chunked.cu): q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv],
// out [T, Hv, Dv] f32; state [n_slots, Hv, Dk, Dv] f32 updated in place.
//
// Grid (Dv / BV, Hv, segments), 256 threads (8 warps): a block owns BV columns of one head's
// state S [Dk, BV] (f32, shared memory) for one segment. Chunks are cut at absolute multiples
// of 64 (DESIGN 5 rule 3); a one-token chunk runs gdn_step (the recurrent arithmetic). A chunk
// of L tokens (rows L..63 zero: they add exact zeros), G = inclusive cumsum of g:
//   A[t, s] = beta_t exp(G_t - G_s) k_t.k_s (s < t)       KK^T on tensor cores
//   QK[t, s] = exp(G_t - G_s) q_t.k_s (s <= t)             QK^T
//   R = beta (V - exp(G) K S);  O0 = exp(G) Q S            KS, QS
//   T = (I + A)^-1                                         f32, CUDA cores: 16 x 16 diagonal
//                                                          blocks by substitution, then row blocks
//   V' = T R (= U - W S with U = T beta V, W = T beta exp(G) K)
//   O = O0 + QK V';  S = exp(G_L) S + K^T (exp(G_L - G) V')
// Every product and sum runs in an order fixed by the chunk alone, so a segment cut on chunk
// multiples, or run among other segments, gives bitwise the same outputs and state.
//
// SP (3xTF32, the default): every product as hi/lo tf32 terms, three mma each (cuda/gdn_mma.cuh),
// f32-class results; SP false: one TF32 pass (~5e-4 relative error).
// Per chunk and block (Dk = Dv = 128, BV = 64): 2,496 m16n8k8 products (5.1 MFLOP; x3 with SP;
// KK^T / QK^T are computed by both column blocks of a head) and ~50 KFLOP of f32 inversion.
// The 27B layer, 4,096 tokens: 48 heads x 64 chunks x 2 blocks -> 31 GFLOP of TF32 (94 with
// SP; the chunk form proper is 35 GFLOP by tests/kernels/bench_gdn_chunked.py's count, which
// includes QS/KS at full Dv and the solve as a product); bytes: q, k, v read and out written
// once (402 MB; q and k read by 2 blocks, the second mostly from L2) plus the state (6 MB):
// 94 us at 4.3 TB/s. The chunks of one head are sequential: the floor is the per-chunk latency
// (load, 5 phases, 12 barriers) x 64, not FLOPs or bytes.
// Shared memory (layouts: cuda/gdn_chunked_tc_smem.cuh; one block per SM), Dk, BV -> bytes and
// the devices that take it (cuda/gdn_chunked.cu picks the first that fits):
//   Smem         128, 64: 165,120  H200 (227 KB), A100 (163 KB): the 27B's configuration
//                128, 32: 140,544  the same where Dv is not a multiple of 64
//                 64, 64: 113,920  H200, A100
//                 64, 32:  97,536  Dv not a multiple of 64; RTX 3090 / 4090 / 5090 (99 KB)
//                256, 32: 226,560  H200
//   SmemCompact  128, 64:  94,464  RTX 3090 / 4090 / 5090 (sm_86 / sm_89 / sm_120): the 27B there
//                128, 32:  69,888  the same where Dv is not a multiple of 64
//                128, 16:  57,600  RDNA3/4 (64 KB LDS; HIP runs the f32 kernel unless told)
//                 64, 32:  59,648  RDNA3/4
//                256, 64: 131,328  A100
//                256, 32:  90,368  RTX 3090 / 4090 / 5090; Dk 256 does not fit 64 KB (16
//                                  columns: 69,888 B)
// SmemCompact costs more per chunk: q and k pass through the Gram in Dk slices of 64 and k is
// read again (from L2) for the state update, with 2 barriers a slice; with BV 16 the Gram KK^T
// / QK^T is computed by 8 column blocks of a head instead of 2.
#pragma once

#include "gdn_chunked_tc_smem.cuh"
#include "gdn_mma.cuh"

namespace gdntc {

// Warps w and w + 4 share a scheduler (SM sub-partition): row blocks pair up as (rb, 3 - rb)
// so each sub-partition gets the same number of products on the triangular tiles.
__device__ __forceinline__ int paired_row_block(int warp) { return warp < 4 ? warp : 7 - warp; }

// Gram products over W dims (k0 = 0, 8, .., W - 8 in order) of rows [16 rb, 16 rb + 16) of x
// (k or q, rows of `stride`): gacc[j] += x keys^T on the tiles j <= 2 rb + 1, sacc += x S over
// s_rows (the state rows of these dims).
template <class S, bool SP, int W>
__device__ __forceinline__ void gram_products(const float *x, const float *keys, int stride, const float *s_rows, int rb,
                                              float (&gacc)[8][4], float (&sacc)[S::kBv / 8][4]) {
    using namespace gdnmma;
    const int r0 = 16 * rb;
    for (int k0 = 0; k0 < W; k0 += 8) {
        Frag<4, SP> a;
        Frag<2, SP> b;
        load_a(a, x, stride, r0, k0);
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (j <= 2 * rb + 1) {  // tiles on or below the diagonal (warp-uniform)
                load_b_nk(b, keys, stride, k0, 8 * j);
                mma(gacc[j], a, b);
            }
#pragma unroll
        for (int n = 0; n < S::kBv / 8; ++n) {
            load_b_kn(b, s_rows, S::SS, k0, 8 * n);
            mma(sacc[n], a, b);
        }
    }
}

// Warps 0-3 (row block w of K): A and R. Warps 4-7 (row block 7 - w of Q): QK and, in o,
// the output's first term exp(G) Q S. SmemCompact loads k and q here, KC dims at a time (the
// products keep their order over Dk), and writes A and QK over the spent slices.
template <class S, bool SP>
__device__ void gram(S &sm, float (&o)[S::kBv / 8][4], const luce_gdn_chunked_params &p, int64_t begin, int L,
                     int head) {
    using namespace gdnmma;
    constexpr int DK = S::kDk, BV = S::kBv;
    const int warp = threadIdx.x / WARP_SIZE, rb = paired_row_block(warp), r0 = 16 * rb;
    const bool qside = warp >= 4;
    float gacc[8][4] = {}, sacc[BV / 8][4] = {};
    if constexpr (!S::kCompact) {
        gram_products<S, SP, DK>(qside ? sm.q : sm.k, sm.k, S::KS, sm.s, rb, gacc, sacc);
    } else {
        for (int d0 = 0; d0 < DK; d0 += S::KC) {
            load_key_rows<DK, S::KC, true>(sm.kmat(), sm.qmat(), S::KS, p, begin, L, head, d0);
            __syncthreads();
            gram_products<S, SP, S::KC>(qside ? sm.qmat() : sm.kmat(), sm.kmat(), S::KS, sm.s + d0 * S::SS, rb,
                                        gacc, sacc);
            __syncthreads();  // the next slice, or A and QK, take the slices' place
        }
    }
    float *amat = sm.amat(), *qkmat = sm.qkmat();
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int t = r0 + frag_row(e);
        const float gt = sm.gcum[t], bt = sm.beta[t], egt = sm.eg[t];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (j > 2 * rb + 1) continue;
            const int s = 8 * j + frag_col(e);
            const float decay = s <= t ? expf(gt - sm.gcum[s]) : 0.0f;
            if (qside) qkmat[t * S::TS + s] = decay * gacc[j][e];
            else amat[t * S::AS + s] = s < t ? bt * decay * gacc[j][e] : 0.0f;
        }
#pragma unroll
        for (int n = 0; n < BV / 8; ++n) {
            const int c = 8 * n + frag_col(e);
            if (qside) o[n][e] = egt * sacc[n][e];
            else sm.v[t * S::SS + c] = bt * (sm.v[t * S::SS + c] - egt * sacc[n][e]);
        }
    }
    __syncthreads();
}

// T = (I + A)^-1 (row-major [64][TS]; blocks above the diagonal unwritten): in q's place (Smem)
// or over A itself (SmemCompact: a block of A is read for the last time just before its T
// block is written). Diagonal 16 x 16 blocks: one column a thread (threads 0-63), forward
// substitution. Then row blocks i = 1..3: P = A[i, <i] T[<i, <i], T[i, <i] = -T[i, i] P.
// f32, fixed order.
template <class S, bool SP>
__device__ void invert(S &sm) {
    static_assert(!S::kCompact || S::AS == S::TS, "T overwrites A row for row");
    const float *A = sm.amat();
    float *T = sm.tmat(), *P = sm.pmat();
    const int tid = threadIdx.x;
    const int o = 16 * (tid / 16), c = tid % 16;
    float x[16];
    if (tid < kChunk) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float acc = 0.0f;
#pragma unroll
            for (int s = 0; s < r; ++s) acc = fmaf(A[(o + r) * S::AS + o + s], x[s], acc);
            x[r] = r < c ? 0.0f : (r == c ? 1.0f : -acc);
        }
        if constexpr (!S::kCompact) {
#pragma unroll
            for (int r = 0; r < 16; ++r) T[(o + r) * S::TS + o + c] = x[r];
        }
    }
    if constexpr (S::kCompact) {
        __syncthreads();  // every column of a diagonal block has read it
        if (tid < kChunk) {
#pragma unroll
            for (int r = 0; r < 16; ++r) T[(o + r) * S::TS + o + c] = x[r];
        }
    }
    __syncthreads();
    for (int n = 16; n < kChunk; n += 16) {  // row block n / 16, columns [0, n)
        for (int item = tid; item < 16 * n; item += GDN_THREADS) {
            const int r = item / n, c = item % n;
            float acc = 0.0f;
            for (int s = c & ~15; s < n; ++s) acc = fmaf(A[(n + r) * S::AS + s], T[s * S::TS + c], acc);
            P[r * S::PS + c] = acc;
        }
        __syncthreads();
        for (int item = tid; item < 16 * n; item += GDN_THREADS) {
            const int r = item / n, c = item % n;
            float acc = 0.0f;
            for (int s = 0; s <= r; ++s) acc = fmaf(T[(n + r) * S::TS + n + s], P[s * S::PS + c], acc);
            T[(n + r) * S::TS + c] = -acc;
        }
        __syncthreads();
    }
}

// V' = T R ([64][SS], in a's place for Smem, over R for SmemCompact once every warp has read
// R): warp w, row block paired_row_block(w), column half w / 4.
template <class S, bool SP>
__device__ void solve(S &sm) {
    using namespace gdnmma;
    constexpr int NT = S::kBv / 16;
    const int warp = threadIdx.x / WARP_SIZE, rb = paired_row_block(warp), n0 = (warp >> 2) * NT;
    const float *T = sm.tmat();
    float acc[NT][4] = {};
    for (int k0 = 0; k0 < 16 * rb + 16; k0 += 8) {
        Frag<4, SP> a;
        Frag<2, SP> b;
        load_a(a, T, S::TS, 16 * rb, k0);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            load_b_kn(b, sm.v, S::SS, k0, 8 * (n0 + n));
            mma(acc[n], a, b);
        }
    }
    if constexpr (S::kCompact) __syncthreads();
    float *vn = sm.vprime();
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) vn[(16 * rb + frag_row(e)) * S::SS + 8 * (n0 + n) + frag_col(e)] = acc[n][e];
    __syncthreads();
}

// Rows [16 rb, 16 rb + 16) of S = decay S + (K exp(G_L - G))^T V' (one warp). keys: rows of
// `stride` floats holding dims [d_off, ..) of the chunk's keys.
template <class S, bool SP>
__device__ __forceinline__ void update_state_rows(S &sm, const float *keys, int stride, int d_off, int rb,
                                                  float decay, const float *vn) {
    using namespace gdnmma;
    constexpr int BV = S::kBv;
    const int lane = threadIdx.x % WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    float acc[BV / 8][4];
#pragma unroll
    for (int n = 0; n < BV / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = decay * sm.s[(16 * rb + frag_row(e)) * S::SS + 8 * n + frag_col(e)];
    for (int k0 = 0; k0 < kChunk; k0 += 8) {
        const int d = 16 * rb + grp - d_off, t = k0 + quad;
        const float t0 = sm.tail[t], t4 = sm.tail[t + 4];
        Frag<4, SP> a;
        a.set(0, keys[t * stride + d] * t0);
        a.set(1, keys[t * stride + d + 8] * t0);
        a.set(2, keys[(t + 4) * stride + d] * t4);
        a.set(3, keys[(t + 4) * stride + d + 8] * t4);
#pragma unroll
        for (int n = 0; n < BV / 8; ++n) {
            Frag<2, SP> b;
            load_b_kn(b, vn, S::SS, k0, 8 * n);
            mma(acc[n], a, b);
        }
    }
#pragma unroll
    for (int n = 0; n < BV / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sm.s[(16 * rb + frag_row(e)) * S::SS + 8 * n + frag_col(e)] = acc[n][e];
}

// Warps 4-7: O = O0 + QK V' for their row block (as in gram), written for rows < L. Every warp:
// row blocks w, w + 8, .. of S = exp(G_L) S + (K exp(G_L - G))^T V' (SmemCompact: keys reloaded
// FC dims at a time over QK and T, spent by then).
template <class S, bool SP>
__device__ void finish(S &sm, float (&o)[S::kBv / 8][4], const luce_gdn_chunked_params &p, int64_t begin, int L,
                       int head, int64_t col0) {
    using namespace gdnmma;
    constexpr int DK = S::kDk, BV = S::kBv;
    const int warp = threadIdx.x / WARP_SIZE;
    const float *vn = sm.vprime();
    if (warp >= 4) {
        const int rb = paired_row_block(warp);
        const float *qk = sm.qkmat();
        for (int k0 = 0; k0 < 16 * rb + 16; k0 += 8) {
            Frag<4, SP> a;
            Frag<2, SP> b;
            load_a(a, qk, S::TS, 16 * rb, k0);
#pragma unroll
            for (int n = 0; n < BV / 8; ++n) {
                load_b_kn(b, vn, S::SS, k0, 8 * n);
                mma(o[n], a, b);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = 16 * rb + frag_row(e);
            if (t >= L) continue;
            float *dst = p.out + ((begin + t) * p.n_heads + head) * p.dv + col0;
#pragma unroll
            for (int n = 0; n < BV / 8; ++n) dst[8 * n + frag_col(e)] = o[n][e];
        }
    }
    const float decay = sm.eg[kChunk - 1];
    if constexpr (!S::kCompact) {
        for (int rb = warp; rb < DK / 16; rb += kWarps) update_state_rows<S, SP>(sm, sm.k, S::KS, 0, rb, decay, vn);
    } else {
        for (int d0 = 0; d0 < DK; d0 += S::FC) {
            __syncthreads();  // QK (first pass) or the previous keys are spent
            load_key_rows<DK, S::FC, false>(sm.w.k_rows, nullptr, S::FS, p, begin, L, head, d0);
            __syncthreads();
            for (int rb = d0 / 16 + warp; rb < (d0 + S::FC) / 16; rb += kWarps)
                update_state_rows<S, SP>(sm, sm.w.k_rows, S::FS, d0, rb, decay, vn);
        }
    }
    __syncthreads();  // before the next chunk overwrites k, q, v and reads s
}

// One-token chunk: gdn_step on each 32-column part of the block (lanes past BV = 16 take
// part in the barriers only), the recurrent kernel's arithmetic.
template <class S, bool SP>
__device__ void one_token(S &sm, const luce_gdn_chunked_params &p, int64_t t, int head, int64_t col0) {
    constexpr int DK = S::kDk, BV = S::kBv, ROWS = DK / GDN_KGROUPS;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t th = t * p.n_heads + head;
    float k[ROWS], q[ROWS];
    gdn_load_rows<ROWS>(p.k + th * DK + kgroup * ROWS, k);
    gdn_load_rows<ROWS>(p.q + th * DK + kgroup * ROWS, q);
    for (int half = 0; half < (BV + WARP_SIZE - 1) / WARP_SIZE; ++half) {
        const int c = half * WARP_SIZE + lane;
        const bool live = BV % WARP_SIZE == 0 || c < BV;
        float h[ROWS], u;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) h[r] = live ? sm.s[(kgroup * ROWS + r) * S::SS + c] : 0.0f;
        const float o = gdn_step<ROWS>(h, k, q, live ? p.v[th * p.dv + col0 + c] : 0.0f, expf(p.g[th]), p.beta[th],
                                       sm.scr(), &u);
        if (kgroup == 0 && live) p.out[th * p.dv + col0 + c] = o;
        if (live) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) sm.s[(kgroup * ROWS + r) * S::SS + c] = h[r];
        }
    }
    __syncthreads();
}

// The body of cuda/gdn_chunked.cu's gdn_chunked_tc_kernel<S, SP> (which owns the dynamic shared
// memory declaration) for one (column block, head, segment).
template <class S, bool SP>
__device__ void run_block(S &sm, const luce_gdn_chunked_params &p) {
    constexpr int DK = S::kDk, BV = S::kBv;
    const int seg = blockIdx.z, head = blockIdx.y;
    const int64_t col0 = (int64_t)blockIdx.x * BV;
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg], r1 = p.qo_indptr[seg + 1];
    if (slot < 0 || r1 <= r0) return;  // padding segment: nothing written
    const int64_t H = p.n_heads, dv = p.dv;
    if (slot >= p.n_slots) {           // bad slot: poison the outputs, leave every state alone
        if (threadIdx.x < BV)
            for (int64_t t = r0; t < r1; ++t) p.out[(t * H + head) * dv + col0 + threadIdx.x] = __int_as_float(0x7fc00000);
        return;
    }
    float *hp = p.state + (slot * H + head) * DK * dv + col0;
    for (int i = threadIdx.x; i < DK * BV; i += GDN_THREADS) sm.s[(i / BV) * S::SS + i % BV] = hp[(i / BV) * dv + i % BV];
    __syncthreads();

    const int64_t pos0 = p.start_pos[seg];
    int64_t begin = r0, end = r0 + (kChunk - pos0 % kChunk);  // first cut: next chunk multiple
    while (begin < r1) {
        if (end > r1) end = r1;
        const int L = (int)(end - begin);
        if (L == 1) {
            one_token<S, SP>(sm, p, begin, head, col0);
        } else {
            float o[BV / 8][4];
            load_chunk(sm, p, begin, L, head, col0);
            gram<S, SP>(sm, o, p, begin, L, head);
            invert<S, SP>(sm);
            solve<S, SP>(sm);
            finish<S, SP>(sm, o, p, begin, L, head, col0);
        }
        begin = end;
        end = begin + kChunk;
    }
    for (int i = threadIdx.x; i < DK * BV; i += GDN_THREADS) hp[(i / BV) * dv + i % BV] = sm.s[(i / BV) * S::SS + i % BV];
}

}  // namespace gdntc
