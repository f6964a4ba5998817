// Gated DeltaNet chunked prefill on CUDA cores, f32 (the f32 variant of luce_gdn_chunked in
// cuda/gdn_chunked.cu, which says what it computes; reference: luce/ref/gdn_chunked.py).
//
// Grid (Dv / WARP_SIZE, Hv, segments), GDN_THREADS threads: a block owns WARP_SIZE columns of
// one head's state S for one segment, kept in shared memory for the whole segment. Two
// layouts, the same sums in the same order (bitwise the same outputs and states;
// tests/kernels/test_gdn_chunked_emulated.py): cuda/gdn_chunked.cu takes the first that fits.
//   ChunkSmem<Dk>: 86,016 B (Dk 64), 126,976 B (Dk 128), 208,896 B (Dk 256): k and q of the
//     whole chunk on chip. Dk 64 fits the 99 KB of sm_86 / sm_89 / sm_120; all fit sm_90.
//   ChunkSmemCompact<Dk>: 34,304 B (Dk 64), 42,496 B (Dk 128), 58,880 B (Dk 256): fits the
//     64 KB LDS of RDNA3/4 at every Dk (A and QK packed in one square: without that Dk 256 would
//     need 75 KB).
#pragma once

#include "gdn_common.cuh"

namespace gdnf32 {

constexpr int kChunk = LUCE_GDN_CHUNK;
constexpr int kTile = WARP_SIZE;                 // state columns per block
constexpr int kWarps = GDN_THREADS / WARP_SIZE;  // == GDN_KGROUPS
constexpr int kMicro = 4;                        // A / QK micro-tile edge per thread
constexpr int kGrid = kChunk / kMicro;           // micro-tiles per edge

template <int DK>
struct ChunkSmem {
    static constexpr bool kCompact = false;
    static constexpr int kDk = DK;
    float ks[kChunk][DK + 1];        // chunk keys (padded rows: no bank conflicts)
    float qs[kChunk][DK + 1];        // chunk queries
    float s[DK][kTile];              // state tile S[:, columns]
    float a[kChunk][kChunk + 1];     // strictly lower A
    float qk[kChunk][kChunk + 1];    // lower QK (diagonal included)
    float u[kChunk][kTile];          // right-hand side, then U
    float gcum[kChunk];              // G_t
    float egcum[kChunk];             // exp(G_t)
    float tail[kChunk];              // exp(G_L - G_t)
    float beta[kChunk];
    GdnScratch scratch;
    __device__ GdnScratch &scr() { return scratch; }
};

// The compact layout (devices whose opt-in shared memory per block is below ChunkSmem's): the
// same sums in the same order on less memory. k and q pass through the A / QK and K S / Q S
// products in Dk slices of KC; A and QK then share one square in their place (A strictly
// below the diagonal, QK transposed on and above it; each is read only there); the state
// update reloads the chunk's keys from global memory (L2), SC rows at a time.
template <int DK>
struct ChunkSmemCompact {
    static constexpr bool kCompact = true;
    static constexpr int kDk = DK;
    static constexpr int KC = 32;                                    // Dk slice of ks, qs
    static constexpr int SC = DK <= 64 ? 64 : (DK <= 128 ? 32 : 16);  // key rows a state-update pass
    static_assert(DK % KC == 0 && kChunk % SC == 0, "whole slices");
    union Work {
        struct { float ks[kChunk][KC + 1], qs[kChunk][KC + 1]; } slice;
        float aqk[kChunk][kChunk + 1];  // A[t][s] at [t][s] (s < t), QK[t][s] at [s][t] (s <= t)
        float keys[SC][DK + 1];
        GdnScratch scratch;             // one-token chunks
    };
    float s[DK][kTile];
    float u[kChunk][kTile];
    float gcum[kChunk], egcum[kChunk], tail[kChunk], beta[kChunk];
    Work w;
    __device__ GdnScratch &scr() { return w.scratch; }
};

template <class S>
__device__ void one_token(S &sm, const luce_gdn_chunked_params &p, int64_t t, int head, int64_t col) {
    constexpr int DK = S::kDk, ROWS = DK / GDN_KGROUPS;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t th = t * p.n_heads + head;
    float h[ROWS], k[ROWS], q[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) h[r] = sm.s[kgroup * ROWS + r][lane];
    gdn_load_rows<ROWS>(p.k + th * DK + kgroup * ROWS, k);
    gdn_load_rows<ROWS>(p.q + th * DK + kgroup * ROWS, q);
    float u;
    const float o = gdn_step<ROWS>(h, k, q, p.v[th * p.dv + col], expf(p.g[th]), p.beta[th],
                                   sm.scr(), &u);
    if (kgroup == 0) p.out[th * p.dv + col] = o;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sm.s[kgroup * ROWS + r][lane] = h[r];
    __syncthreads();
}

template <int DK>
__device__ void run_chunk(ChunkSmem<DK> &sm, const luce_gdn_chunked_params &p, int64_t begin, int L,
                          int head, int64_t col) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t H = p.n_heads, dv = p.dv;

    for (int i = threadIdx.x; i < L * DK; i += GDN_THREADS) {
        const int t = i / DK, d = i % DK;
        const int64_t th = (begin + t) * H + head;
        sm.ks[t][d] = p.k[th * DK + d];
        sm.qs[t][d] = p.q[th * DK + d];
    }
    for (int t = threadIdx.x; t < L; t += GDN_THREADS) {
        sm.gcum[t] = p.g[(begin + t) * H + head];
        sm.beta[t] = p.beta[(begin + t) * H + head];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int t = 0; t < L; ++t) { acc += sm.gcum[t]; sm.gcum[t] = acc; }
        for (int t = 0; t < L; ++t) {
            sm.egcum[t] = expf(sm.gcum[t]);
            sm.tail[t] = expf(acc - sm.gcum[t]);
        }
    }
    __syncthreads();

    // A and QK: thread micro-tile rows tt + kGrid * i, columns ss + kGrid * j.
    for (int tile = threadIdx.x; tile < kGrid * kGrid; tile += GDN_THREADS) {
        const int tt = tile / kGrid, ss = tile % kGrid;
        float kk[kMicro][kMicro] = {}, qk[kMicro][kMicro] = {};
        for (int d = 0; d < DK; ++d) {
            float kt[kMicro], qt[kMicro], kc[kMicro];
#pragma unroll
            for (int i = 0; i < kMicro; ++i) {
                kt[i] = sm.ks[tt + kGrid * i][d];
                qt[i] = sm.qs[tt + kGrid * i][d];
                kc[i] = sm.ks[ss + kGrid * i][d];
            }
#pragma unroll
            for (int i = 0; i < kMicro; ++i)
#pragma unroll
                for (int j = 0; j < kMicro; ++j) {
                    kk[i][j] = fmaf(kt[i], kc[j], kk[i][j]);
                    qk[i][j] = fmaf(qt[i], kc[j], qk[i][j]);
                }
        }
#pragma unroll
        for (int i = 0; i < kMicro; ++i)
#pragma unroll
            for (int j = 0; j < kMicro; ++j) {
                const int t = tt + kGrid * i, s = ss + kGrid * j;
                if (t >= L || s >= L) continue;  // rows past L hold stale data
                const float decay = s <= t ? expf(sm.gcum[t] - sm.gcum[s]) : 0.0f;
                sm.a[t][s] = s < t ? sm.beta[t] * decay * kk[i][j] : 0.0f;
                sm.qk[t][s] = decay * qk[i][j];
            }
    }

    // Right-hand side beta_t (v_t - exp(G_t) k_t^T S) and q_t^T S (for the output), per
    // (t = warp + kWarps * i, column = lane), from the state before this chunk.
    constexpr int T_PER_WARP = kChunk / kWarps;
    float qs_dot[T_PER_WARP];
#pragma unroll
    for (int i = 0; i < T_PER_WARP; ++i) {
        const int t = kgroup + kWarps * i;
        qs_dot[i] = 0.0f;
        if (t >= L) continue;
        float kdot = 0.0f, qdot = 0.0f;
        for (int r = 0; r < DK; ++r) {
            const float sv = sm.s[r][lane];
            kdot = fmaf(sm.ks[t][r], sv, kdot);
            qdot = fmaf(sm.qs[t][r], sv, qdot);
        }
        qs_dot[i] = qdot;
        const float v = p.v[((begin + t) * H + head) * dv + col];
        sm.u[t][lane] = sm.beta[t] * (v - sm.egcum[t] * kdot);
    }
    __syncthreads();

    // U = (I + A)^-1 rhs: forward substitution, one column per lane of warp 0.
    if (kgroup == 0) {
        for (int t = 1; t < L; ++t) {
            float u = sm.u[t][lane];
            for (int s = 0; s < t; ++s) u = fmaf(-sm.a[t][s], sm.u[s][lane], u);
            sm.u[t][lane] = u;
        }
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < T_PER_WARP; ++i) {
        const int t = kgroup + kWarps * i;
        if (t >= L) continue;
        float o = 0.0f;
        for (int s = 0; s <= t; ++s) o = fmaf(sm.qk[t][s], sm.u[s][lane], o);
        p.out[((begin + t) * H + head) * dv + col] = fmaf(sm.egcum[t], qs_dot[i], o);
    }

    // S = exp(G_L) S + sum_s exp(G_L - G_s) k_s u_s^T on this thread's rows (nobody else
    // reads them after the barrier above).
    const float decay_all = sm.egcum[L - 1];
#pragma unroll 4
    for (int rr = 0; rr < ROWS; ++rr) {
        const int r = kgroup * ROWS + rr;
        float acc = decay_all * sm.s[r][lane];
        for (int s = 0; s < L; ++s) acc = fmaf(sm.tail[s] * sm.ks[s][r], sm.u[s][lane], acc);
        sm.s[r][lane] = acc;
    }
    __syncthreads();  // before the next chunk overwrites ks, qs, u
}

// run_chunk on ChunkSmemCompact: each sum of run_chunk above, in its order.
template <int DK>
__device__ void run_chunk(ChunkSmemCompact<DK> &sm, const luce_gdn_chunked_params &p, int64_t begin, int L,
                          int head, int64_t col) {
    using S = ChunkSmemCompact<DK>;
    constexpr int ROWS = DK / GDN_KGROUPS, T_PER_WARP = kChunk / kWarps;
    static_assert(kGrid * kGrid == GDN_THREADS, "one A / QK micro-tile a thread");
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t H = p.n_heads, dv = p.dv;

    for (int t = threadIdx.x; t < L; t += GDN_THREADS) {
        sm.gcum[t] = p.g[(begin + t) * H + head];
        sm.beta[t] = p.beta[(begin + t) * H + head];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int t = 0; t < L; ++t) { acc += sm.gcum[t]; sm.gcum[t] = acc; }
        for (int t = 0; t < L; ++t) {
            sm.egcum[t] = expf(sm.gcum[t]);
            sm.tail[t] = expf(acc - sm.gcum[t]);
        }
    }

    // Over Dk slices: the micro-tile sums k_t.k_s, q_t.k_s and the sums k_t^T S, q_t^T S.
    const int tt = threadIdx.x / kGrid, ss = threadIdx.x % kGrid;
    float kk[kMicro][kMicro] = {}, qk[kMicro][kMicro] = {}, kdot[T_PER_WARP] = {}, qdot[T_PER_WARP] = {};
    for (int d0 = 0; d0 < DK; d0 += S::KC) {
        __syncthreads();  // the previous slice is spent
        for (int i = threadIdx.x; i < L * S::KC; i += GDN_THREADS) {
            const int t = i / S::KC, d = i % S::KC;
            const int64_t th = (begin + t) * H + head;
            sm.w.slice.ks[t][d] = p.k[th * DK + d0 + d];
            sm.w.slice.qs[t][d] = p.q[th * DK + d0 + d];
        }
        __syncthreads();
        for (int d = 0; d < S::KC; ++d) {
            float kt[kMicro], qt[kMicro], kc[kMicro];
#pragma unroll
            for (int i = 0; i < kMicro; ++i) {
                kt[i] = sm.w.slice.ks[tt + kGrid * i][d];
                qt[i] = sm.w.slice.qs[tt + kGrid * i][d];
                kc[i] = sm.w.slice.ks[ss + kGrid * i][d];
            }
#pragma unroll
            for (int i = 0; i < kMicro; ++i)
#pragma unroll
                for (int j = 0; j < kMicro; ++j) {
                    kk[i][j] = fmaf(kt[i], kc[j], kk[i][j]);
                    qk[i][j] = fmaf(qt[i], kc[j], qk[i][j]);
                }
        }
#pragma unroll
        for (int i = 0; i < T_PER_WARP; ++i) {
            const int t = kgroup + kWarps * i;
            if (t >= L) continue;
            for (int r = 0; r < S::KC; ++r) {
                const float sv = sm.s[d0 + r][lane];
                kdot[i] = fmaf(sm.w.slice.ks[t][r], sv, kdot[i]);
                qdot[i] = fmaf(sm.w.slice.qs[t][r], sv, qdot[i]);
            }
        }
    }
    __syncthreads();  // A and QK take the slices' place
#pragma unroll
    for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
            const int t = tt + kGrid * i, s = ss + kGrid * j;
            if (t >= L || s >= L || s > t) continue;
            const float decay = expf(sm.gcum[t] - sm.gcum[s]);
            if (s < t) sm.w.aqk[t][s] = sm.beta[t] * decay * kk[i][j];
            sm.w.aqk[s][t] = decay * qk[i][j];
        }
#pragma unroll
    for (int i = 0; i < T_PER_WARP; ++i) {
        const int t = kgroup + kWarps * i;
        if (t >= L) continue;
        const float v = p.v[((begin + t) * H + head) * dv + col];
        sm.u[t][lane] = sm.beta[t] * (v - sm.egcum[t] * kdot[i]);
    }
    __syncthreads();

    if (kgroup == 0) {
        for (int t = 1; t < L; ++t) {
            float u = sm.u[t][lane];
            for (int s = 0; s < t; ++s) u = fmaf(-sm.w.aqk[t][s], sm.u[s][lane], u);
            sm.u[t][lane] = u;
        }
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < T_PER_WARP; ++i) {
        const int t = kgroup + kWarps * i;
        if (t >= L) continue;
        float o = 0.0f;
        for (int s = 0; s <= t; ++s) o = fmaf(sm.w.aqk[s][t], sm.u[s][lane], o);
        p.out[((begin + t) * H + head) * dv + col] = fmaf(sm.egcum[t], qdot[i], o);
    }

    // S = exp(G_L) S + sum_s exp(G_L - G_s) k_s u_s^T on this thread's rows, keys SC at a time.
    const float decay_all = sm.egcum[L - 1];
    float acc[ROWS];
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) acc[rr] = decay_all * sm.s[kgroup * ROWS + rr][lane];
    for (int s0 = 0; s0 < L; s0 += S::SC) {
        const int n = L - s0 < S::SC ? L - s0 : S::SC;
        __syncthreads();  // QK, or the previous keys, are spent
        for (int i = threadIdx.x; i < n * DK; i += GDN_THREADS) {
            const int s = i / DK, d = i % DK;
            sm.w.keys[s][d] = p.k[((begin + s0 + s) * H + head) * DK + d];
        }
        __syncthreads();
        for (int s = 0; s < n; ++s) {
            const float ts = sm.tail[s0 + s], us = sm.u[s0 + s][lane];
#pragma unroll
            for (int rr = 0; rr < ROWS; ++rr) acc[rr] = fmaf(ts * sm.w.keys[s][kgroup * ROWS + rr], us, acc[rr]);
        }
    }
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) sm.s[kgroup * ROWS + rr][lane] = acc[rr];
    __syncthreads();  // before the next chunk reads s and overwrites u
}

}  // namespace gdnf32
