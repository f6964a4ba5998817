// Gated DeltaNet chunked prefill (WY / UT-transform form). Reference: luce/ref/gdn_chunked.py.
// luce_gdn_chunked runs the tensor-core kernel of cuda/gdn_chunked_tc.cuh, 3xTF32 (f32-class
// products), on CUDA; on HIP the f32 kernel below (see chunked_mode). The environment variable
// LUCE_GDN_CHUNKED (read at each call, so a bench can time every variant in one process; a
// switch for measurement, not for serving) picks a variant: "tf32x3", "tf32" (one TF32 pass:
// ~5e-4 relative error) or "f32" (the f32 CUDA-core kernel below); any other value is refused.
// Each variant is bitwise invariant on its own; they differ from each other within
// tests/kernels/tolerances.py.
//
// The f32 kernel:
// Params: luce_gdn_chunked_params in cuda/luce_ops.h: q, k [T, Hv, Dk], v [T, Hv, Dv],
// g, beta [T, Hv], out [T, Hv, Dv] f32; state [n_slots, Hv, Dk, Dv] f32 updated in place.
//
// Grid (Dv / WARP_SIZE, Hv, segments), GDN_THREADS threads: a block owns WARP_SIZE columns of
// one head's state S for one segment, kept in shared memory for the whole segment. The
// segment is cut into chunks at absolute multiples of LUCE_GDN_CHUNK (DESIGN 5 rule 3);
// a chunk of L > 1 tokens, with G the inclusive cumulative sum of g inside it:
//   A[t, s] = beta_t exp(G_t - G_s) k_t.k_s (s < t),   QK[t, s] = exp(G_t - G_s) q_t.k_s (s <= t)
//   U = (I + A)^-1 beta (V - exp(G) K S)      (forward substitution, column by column)
//   o_t = exp(G_t) q_t^T S + sum_{s <= t} QK[t, s] u_s
//   S = exp(G_L) S + sum_s exp(G_L - G_s) k_s u_s^T
// A one-token chunk runs gdn_step (cuda/gdn_common.cuh), the recurrent kernel's arithmetic.
// Every sum runs in a fixed order set by the segment's own sizes: batch-invariant.
#include <stdlib.h>
#include <string.h>

#include "gdn_common.cuh"
#include "gdn_chunked_tc.cuh"

namespace {

constexpr int kChunk = LUCE_GDN_CHUNK;
constexpr int kTile = WARP_SIZE;                 // state columns per block
constexpr int kWarps = GDN_THREADS / WARP_SIZE;  // == GDN_KGROUPS
constexpr int kMicro = 4;                        // A / QK micro-tile edge per thread
constexpr int kGrid = kChunk / kMicro;           // micro-tiles per edge

template <int DK>
struct ChunkSmem {
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
};

template <int DK>
__device__ void one_token(ChunkSmem<DK> &sm, const luce_gdn_chunked_params &p, int64_t t, int head,
                          int64_t col) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t th = t * p.n_heads + head;
    float h[ROWS], k[ROWS], q[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) h[r] = sm.s[kgroup * ROWS + r][lane];
    gdn_load_rows<ROWS>(p.k + th * DK + kgroup * ROWS, k);
    gdn_load_rows<ROWS>(p.q + th * DK + kgroup * ROWS, q);
    float u;
    const float o = gdn_step<ROWS>(h, k, q, p.v[th * p.dv + col], expf(p.g[th]), p.beta[th],
                                   sm.scratch, &u);
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

template <int DK>
__global__ void __launch_bounds__(GDN_THREADS, 1) gdn_chunked_kernel(luce_gdn_chunked_params p) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    extern __shared__ float4 smem4[];
    ChunkSmem<DK> &sm = *reinterpret_cast<ChunkSmem<DK> *>(smem4);
    const int seg = blockIdx.z, head = blockIdx.y;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t col = (int64_t)blockIdx.x * kTile + lane;
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg], r1 = p.qo_indptr[seg + 1];
    if (slot < 0 || r1 <= r0) return;  // padding segment: nothing written
    const int64_t H = p.n_heads, dv = p.dv;
    if (slot >= p.n_slots) {           // bad slot: poison the outputs, leave every state alone
        if (kgroup == 0)
            for (int64_t t = r0; t < r1; ++t) p.out[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
        return;
    }
    float *hp = p.state + (slot * H + head) * DK * dv + col;
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) sm.s[kgroup * ROWS + rr][lane] = hp[(int64_t)(kgroup * ROWS + rr) * dv];
    __syncthreads();

    const int64_t pos0 = p.start_pos[seg];
    int64_t begin = r0, end = r0 + (kChunk - pos0 % kChunk);  // first cut: next chunk multiple
    while (begin < r1) {
        if (end > r1) end = r1;
        if (end - begin == 1) one_token<DK>(sm, p, begin, head, col);
        else run_chunk<DK>(sm, p, begin, (int)(end - begin), head, col);
        begin = end;
        end = begin + kChunk;
    }

#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) hp[(int64_t)(kgroup * ROWS + rr) * dv] = sm.s[kgroup * ROWS + rr][lane];
}

template <int DK>
int launch_gdn_chunked(const luce_gdn_chunked_params &p, cudaStream_t stream) {
    const size_t smem = sizeof(ChunkSmem<DK>);
    static bool attribute_set = false;  // once, before any graph capture reaches here
    if (!attribute_set) {
        const cudaError_t err = cudaFuncSetAttribute(gdn_chunked_kernel<DK>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        attribute_set = true;
    }
    const dim3 grid((unsigned)(p.dv / kTile), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_chunked_kernel<DK><<<grid, GDN_THREADS, smem, stream>>>(p);
    return luce_status(cudaGetLastError());
}

template <int DK, int BV, bool SP>
__global__ void __launch_bounds__(GDN_THREADS, 1) gdn_chunked_tc_kernel(luce_gdn_chunked_params p) {
    extern __shared__ float4 smem4[];
    gdntc::run_block<DK, BV, SP>(*reinterpret_cast<gdntc::Smem<DK, BV> *>(smem4), p);
}

template <int DK, int BV, bool SP>
int launch_tc(const luce_gdn_chunked_params &p, cudaStream_t stream) {
    const size_t smem = sizeof(gdntc::Smem<DK, BV>);
    static bool attribute_set = false;  // once, before any graph capture reaches here
    if (!attribute_set) {
        const cudaError_t err = cudaFuncSetAttribute(gdn_chunked_tc_kernel<DK, BV, SP>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        attribute_set = true;
    }
    const dim3 grid((unsigned)(p.dv / BV), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_chunked_tc_kernel<DK, BV, SP><<<grid, GDN_THREADS, smem, stream>>>(p);
    return luce_status(cudaGetLastError());
}

template <int DK, int BV>
int launch_gdn_chunked_tc(const luce_gdn_chunked_params &p, cudaStream_t stream, bool split) {
    return split ? launch_tc<DK, BV, true>(p, stream) : launch_tc<DK, BV, false>(p, stream);
}

// LUCE_GDN_CHUNKED: "tf32x3" the tensor-core kernel (the default on CUDA), "tf32" its one-pass
// form, "f32" the f32 kernel (the default on HIP: without mma.sync the tensor-core kernel runs
// its shuffle fallback, ~100 instructions a product, slower than plain f32 FMAs).
int chunked_mode() {
    const char *e = getenv("LUCE_GDN_CHUNKED");
#ifdef __HIPCC__
    if (e == nullptr || e[0] == '\0') return 0;
#endif
    if (e == nullptr || e[0] == '\0' || strcmp(e, "tf32x3") == 0) return 3;
    if (strcmp(e, "tf32") == 0) return 1;
    if (strcmp(e, "f32") == 0) return 0;
    return -1;
}

}  // namespace

extern "C" int luce_gdn_chunked(const luce_gdn_chunked_params *p, void *stream) {
    if (p->n_segments == 0) return 0;
    static_assert(kTile == WARP_SIZE, "gdn_bad_sizes checks dv against WARP_SIZE-column tiles");
    if (gdn_bad_sizes(p->n_segments, p->n_heads, p->dk, p->dv) || p->n_slots < 0 ||
        ((uintptr_t)p->q | (uintptr_t)p->k) % 16 != 0)  // rows of q, k move as float4
        return (int)cudaErrorInvalidValue;
    const cudaStream_t s = (cudaStream_t)stream;
    // Column blocks of 64 where Dv allows it and shared memory holds them (Dk 256: 32).
    const bool wide = p->dv % 64 == 0;
    const int mode = chunked_mode();
    if (mode < 0) return (int)cudaErrorInvalidValue;
    const bool split = mode == 3;
    if (mode > 0) switch (p->dk) {
        case 64: return wide ? launch_gdn_chunked_tc<64, 64>(*p, s, split) : launch_gdn_chunked_tc<64, 32>(*p, s, split);
        case 128: return wide ? launch_gdn_chunked_tc<128, 64>(*p, s, split)
                              : launch_gdn_chunked_tc<128, 32>(*p, s, split);
        case 256: return launch_gdn_chunked_tc<256, 32>(*p, s, split);
        default: return (int)cudaErrorInvalidValue;
    }
    switch (p->dk) {
        case 64: return launch_gdn_chunked<64>(*p, s);
        case 128: return launch_gdn_chunked<128>(*p, s);
        case 256: return launch_gdn_chunked<256>(*p, s);
        default: return (int)cudaErrorInvalidValue;
    }
}
