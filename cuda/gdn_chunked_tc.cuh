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
// Shared memory: sizeof(Smem<DK, BV>) = 165,120 B (128, 64), 226,560 B (256, 32), 113,920 B
// (64, 64): one block per SM; above the 99 KB of sm_86/89/120 for Dk 128 (as the f32 kernel).
#pragma once

#include "gdn_common.cuh"
#include "gdn_mma.cuh"

namespace gdntc {

constexpr int kChunk = LUCE_GDN_CHUNK;
constexpr int kWarps = GDN_THREADS / WARP_SIZE;
static_assert(kChunk == 64 && kWarps == 8, "the warp roles below assume 64-token chunks and 8 warps");

template <int DK, int BV>
struct Smem {
    static constexpr int KS = DK + 4;  // k, q rows (stride 4 mod 32: fragment reads conflict-free)
    static constexpr int SS = BV + 8;  // s, v, V' rows, read as B [k][n] (stride 8 mod 32)
    static constexpr int AS = 72;      // A, then V' (64 x SS fits)
    static constexpr int TS = 68;      // T (in q's place once q is spent) and QK
    static constexpr int PS = 52;      // inversion scratch: 16 rows x up to 48 columns
    float k[kChunk * KS];
    float q[kChunk * KS];
    float s[DK * SS];
    float a[kChunk * AS];
    float qk[kChunk * TS];
    float v[kChunk * SS];              // V tile, then R
    float p[16 * PS];
    float gcum[kChunk], eg[kChunk], tail[kChunk], beta[kChunk];
    GdnScratch scratch;
    static_assert(kChunk * TS <= kChunk * KS && kChunk * SS <= kChunk * AS, "aliases must fit");
};

// Load chunk rows [begin, begin + L) of q, k, v (this block's columns), g, beta; rows past L
// are zero. Warp 0 also forms G (a warp scan, two tokens a lane), exp(G), exp(G_last - G).
template <int DK, int BV, bool SP>
__device__ void load_chunk(Smem<DK, BV> &sm, const luce_gdn_chunked_params &p, int64_t begin, int L,
                           int head, int64_t col0) {
    using S = Smem<DK, BV>;
    const int64_t H = p.n_heads;
    if (threadIdx.x < WARP_SIZE) {
        const int lane = threadIdx.x, t0 = 2 * lane;
        const int64_t th = (begin + t0) * H + head;
        const float g0 = t0 < L ? p.g[th] : 0.0f, g1 = t0 + 1 < L ? p.g[th + H] : 0.0f;
        sm.beta[t0] = t0 < L ? p.beta[th] : 0.0f;
        sm.beta[t0 + 1] = t0 + 1 < L ? p.beta[th + H] : 0.0f;
        float pair = g0 + g1;  // inclusive scan of the pair sums over lanes
#pragma unroll
        for (int d = 1; d < WARP_SIZE; d <<= 1) {
            const int src = lane >= d ? lane - d : lane;
            const float x = warp_shfl_xor(pair, lane ^ src);
            if (lane >= d) pair += x;
        }
        const float last = warp_shfl_xor(pair, lane ^ (WARP_SIZE - 1));
        const float G1 = pair, G0 = pair - g1;
        sm.gcum[t0] = G0; sm.gcum[t0 + 1] = G1;
        sm.eg[t0] = expf(G0); sm.eg[t0 + 1] = expf(G1);
        sm.tail[t0] = expf(last - G0); sm.tail[t0 + 1] = expf(last - G1);
    }
    // Loads in flight together (unrolled batches of 8 float4 of k and of q a thread), then stores.
    constexpr int D4 = DK / 4, PER_THREAD = kChunk * D4 / GDN_THREADS, BATCH = PER_THREAD < 8 ? PER_THREAD : 8;
    static_assert(PER_THREAD % BATCH == 0 && (kChunk * BV) % GDN_THREADS == 0, "whole batches");
    for (int b0 = 0; b0 < PER_THREAD; b0 += BATCH) {
        float4 kv[BATCH], qv[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int i = threadIdx.x + (b0 + b) * GDN_THREADS, t = i / D4, d = 4 * (i % D4);
            kv[b] = qv[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < L) {
                const int64_t off = ((begin + t) * H + head) * DK + d;
                kv[b] = *reinterpret_cast<const float4 *>(p.k + off);
                qv[b] = *reinterpret_cast<const float4 *>(p.q + off);
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int i = threadIdx.x + (b0 + b) * GDN_THREADS, t = i / D4, d = 4 * (i % D4);
            *reinterpret_cast<float4 *>(&sm.k[t * S::KS + d]) = kv[b];
            *reinterpret_cast<float4 *>(&sm.q[t * S::KS + d]) = qv[b];
        }
    }
    constexpr int VPT = kChunk * BV / GDN_THREADS;
    float vv[VPT];
#pragma unroll
    for (int b = 0; b < VPT; ++b) {
        const int i = threadIdx.x + b * GDN_THREADS, t = i / BV, c = i % BV;
        vv[b] = t < L ? p.v[((begin + t) * H + head) * p.dv + col0 + c] : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < VPT; ++b) {
        const int i = threadIdx.x + b * GDN_THREADS;
        sm.v[(i / BV) * S::SS + i % BV] = vv[b];
    }
    __syncthreads();
}

// Warps w and w + 4 share a scheduler (SM sub-partition): row blocks pair up as (rb, 3 - rb)
// so each sub-partition gets the same number of products on the triangular tiles.
__device__ __forceinline__ int paired_row_block(int warp) { return warp < 4 ? warp : 7 - warp; }

// Warps 0-3 (row block w of K): A and R. Warps 4-7 (row block 7 - w of Q): QK and, in o,
// the output's first term exp(G) Q S.
template <int DK, int BV, bool SP>
__device__ void gram(Smem<DK, BV> &sm, float (&o)[BV / 8][4]) {
    using namespace gdnmma;
    using S = Smem<DK, BV>;
    const int warp = threadIdx.x / WARP_SIZE, rb = paired_row_block(warp), r0 = 16 * rb;
    const bool qside = warp >= 4;
    const float *x = qside ? sm.q : sm.k;
    float gacc[8][4] = {}, sacc[BV / 8][4] = {};
    for (int k0 = 0; k0 < DK; k0 += 8) {
        Frag<4, SP> a;
        Frag<2, SP> b;
        load_a(a, x, S::KS, r0, k0);
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (j <= 2 * rb + 1) {  // tiles on or below the diagonal (warp-uniform)
                load_b_nk(b, sm.k, S::KS, k0, 8 * j);
                mma(gacc[j], a, b);
            }
#pragma unroll
        for (int n = 0; n < BV / 8; ++n) {
            load_b_kn(b, sm.s, S::SS, k0, 8 * n);
            mma(sacc[n], a, b);
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int t = r0 + frag_row(e);
        const float gt = sm.gcum[t], bt = sm.beta[t], egt = sm.eg[t];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (j > 2 * rb + 1) continue;
            const int s = 8 * j + frag_col(e);
            const float decay = s <= t ? expf(gt - sm.gcum[s]) : 0.0f;
            if (qside) sm.qk[t * S::TS + s] = decay * gacc[j][e];
            else sm.a[t * S::AS + s] = s < t ? bt * decay * gacc[j][e] : 0.0f;
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

// T = (I + A)^-1 into q's place (row-major [64][TS]; blocks above the diagonal unwritten).
// Diagonal 16 x 16 blocks: one column a thread (threads 0-63), forward substitution. Then row
// blocks i = 1..3: P = A[i, <i] T[<i, <i], T[i, <i] = -T[i, i] P. f32, fixed order.
template <int DK, int BV, bool SP>
__device__ void invert(Smem<DK, BV> &sm) {
    using S = Smem<DK, BV>;
    float *T = sm.q;
    const int tid = threadIdx.x;
    if (tid < kChunk) {
        const int o = 16 * (tid / 16), c = tid % 16;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float acc = 0.0f;
#pragma unroll
            for (int s = 0; s < r; ++s) acc = fmaf(sm.a[(o + r) * S::AS + o + s], x[s], acc);
            x[r] = r < c ? 0.0f : (r == c ? 1.0f : -acc);
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) T[(o + r) * S::TS + o + c] = x[r];
    }
    __syncthreads();
    for (int n = 16; n < kChunk; n += 16) {  // row block n / 16, columns [0, n)
        for (int item = tid; item < 16 * n; item += GDN_THREADS) {
            const int r = item / n, c = item % n;
            float acc = 0.0f;
            for (int s = c & ~15; s < n; ++s) acc = fmaf(sm.a[(n + r) * S::AS + s], T[s * S::TS + c], acc);
            sm.p[r * S::PS + c] = acc;
        }
        __syncthreads();
        for (int item = tid; item < 16 * n; item += GDN_THREADS) {
            const int r = item / n, c = item % n;
            float acc = 0.0f;
            for (int s = 0; s <= r; ++s) acc = fmaf(T[(n + r) * S::TS + n + s], sm.p[s * S::PS + c], acc);
            T[(n + r) * S::TS + c] = -acc;
        }
        __syncthreads();
    }
}

// V' = T R into a's place ([64][SS]): warp w, row block paired_row_block(w), column half w / 4.
template <int DK, int BV, bool SP>
__device__ void solve(Smem<DK, BV> &sm) {
    using namespace gdnmma;
    using S = Smem<DK, BV>;
    constexpr int NT = BV / 16;
    const int warp = threadIdx.x / WARP_SIZE, rb = paired_row_block(warp), n0 = (warp >> 2) * NT;
    float acc[NT][4] = {};
    for (int k0 = 0; k0 < 16 * rb + 16; k0 += 8) {
        Frag<4, SP> a;
        Frag<2, SP> b;
        load_a(a, sm.q, S::TS, 16 * rb, k0);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            load_b_kn(b, sm.v, S::SS, k0, 8 * (n0 + n));
            mma(acc[n], a, b);
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sm.a[(16 * rb + frag_row(e)) * S::SS + 8 * (n0 + n) + frag_col(e)] = acc[n][e];
    __syncthreads();
}

// Warps 4-7: O = O0 + QK V' for their row block (as in gram), written for rows < L. Every warp: row blocks
// w, w + 8, .. of S = exp(G_L) S + (K exp(G_L - G))^T V'.
template <int DK, int BV, bool SP>
__device__ void finish(Smem<DK, BV> &sm, float (&o)[BV / 8][4], const luce_gdn_chunked_params &p,
                       int64_t begin, int L, int head, int64_t col0) {
    using namespace gdnmma;
    using S = Smem<DK, BV>;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int grp = lane >> 2, quad = lane & 3;
    const float *vn = sm.a;
    if (warp >= 4) {
        const int rb = paired_row_block(warp);
        for (int k0 = 0; k0 < 16 * rb + 16; k0 += 8) {
            Frag<4, SP> a;
            Frag<2, SP> b;
            load_a(a, sm.qk, S::TS, 16 * rb, k0);
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
    for (int rb = warp; rb < DK / 16; rb += kWarps) {
        float acc[BV / 8][4];
#pragma unroll
        for (int n = 0; n < BV / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] = decay * sm.s[(16 * rb + frag_row(e)) * S::SS + 8 * n + frag_col(e)];
        for (int k0 = 0; k0 < kChunk; k0 += 8) {
            const int d = 16 * rb + grp, t = k0 + quad;
            const float t0 = sm.tail[t], t4 = sm.tail[t + 4];
            Frag<4, SP> a;
            a.set(0, sm.k[t * S::KS + d] * t0);
            a.set(1, sm.k[t * S::KS + d + 8] * t0);
            a.set(2, sm.k[(t + 4) * S::KS + d] * t4);
            a.set(3, sm.k[(t + 4) * S::KS + d + 8] * t4);
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
    __syncthreads();  // before the next chunk overwrites k, q, v and reads s
}

// One-token chunk: gdn_step on each 32-column half, the recurrent kernel's arithmetic.
template <int DK, int BV, bool SP>
__device__ void one_token(Smem<DK, BV> &sm, const luce_gdn_chunked_params &p, int64_t t, int head,
                          int64_t col0) {
    using S = Smem<DK, BV>;
    constexpr int ROWS = DK / GDN_KGROUPS;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t th = t * p.n_heads + head;
    float k[ROWS], q[ROWS];
    gdn_load_rows<ROWS>(p.k + th * DK + kgroup * ROWS, k);
    gdn_load_rows<ROWS>(p.q + th * DK + kgroup * ROWS, q);
    for (int half = 0; half < BV / WARP_SIZE; ++half) {
        const int c = half * WARP_SIZE + lane;
        float h[ROWS], u;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) h[r] = sm.s[(kgroup * ROWS + r) * S::SS + c];
        const float o = gdn_step<ROWS>(h, k, q, p.v[th * p.dv + col0 + c], expf(p.g[th]), p.beta[th],
                                       sm.scratch, &u);
        if (kgroup == 0) p.out[th * p.dv + col0 + c] = o;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) sm.s[(kgroup * ROWS + r) * S::SS + c] = h[r];
    }
    __syncthreads();
}

// The body of cuda/gdn_chunked.cu's gdn_chunked_tc_kernel<DK, BV> (which owns the dynamic shared
// memory declaration) for one (column block, head, segment).
template <int DK, int BV, bool SP>
__device__ void run_block(Smem<DK, BV> &sm, const luce_gdn_chunked_params &p) {
    using S = Smem<DK, BV>;
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
            one_token<DK, BV, SP>(sm, p, begin, head, col0);
        } else {
            float o[BV / 8][4];
            load_chunk<DK, BV, SP>(sm, p, begin, L, head, col0);
            gram<DK, BV, SP>(sm, o);
            invert<DK, BV, SP>(sm);
            solve<DK, BV, SP>(sm);
            finish<DK, BV, SP>(sm, o, p, begin, L, head, col0);
        }
        begin = end;
        end = begin + kChunk;
    }
    for (int i = threadIdx.x; i < DK * BV; i += GDN_THREADS) hp[(i / BV) * dv + i % BV] = sm.s[(i / BV) * S::SS + i % BV];
}

}  // namespace gdntc
