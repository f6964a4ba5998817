// Shared-memory layouts of the GDN tensor-core chunk kernel (cuda/gdn_chunked_tc.cuh) and the
// chunk loads. Both layouts run the same phases with the same sums in the same order; they
// differ only in where the arrays live, so every configuration gives bitwise the same outputs
// and states (tests/kernels/test_gdn_chunked_emulated.py). cuda/gdn_chunked.cu picks the first
// that fits the device (sizes in floats, Dk = DK, chunk 64; bytes in gdn_chunked_tc.cuh).
//   Smem: k, q [64][Dk + 4] for the whole chunk, s [Dk][BV + 8], a [64][72] (A, then V'),
//     qk [64][68], v [64][BV + 8] (V, then R), p [16][52]; T in q's place.
//   SmemCompact: s and v as Smem, and one work area that holds in turn the Gram's Dk slices
//     of k and q ([64][68] each), then A (T overwrites it in place), QK and p, then the keys
//     for the state update reloaded from global memory (L2) 128 dims at a time; V' in v.
#pragma once

#include "gdn_common.cuh"

namespace gdntc {

constexpr int kChunk = LUCE_GDN_CHUNK;
constexpr int kWarps = GDN_THREADS / WARP_SIZE;
static_assert(kChunk == 64 && kWarps == 8, "the warp roles assume 64-token chunks and 8 warps");

template <int DK, int BV>
struct Smem {
    static constexpr bool kCompact = false;
    static constexpr int kDk = DK, kBv = BV;
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
    __device__ float *kmat() { return k; }
    __device__ float *qmat() { return q; }
    __device__ float *amat() { return a; }
    __device__ float *tmat() { return q; }
    __device__ float *qkmat() { return qk; }
    __device__ float *vprime() { return a; }
    __device__ float *pmat() { return p; }
    __device__ GdnScratch &scr() { return scratch; }
};

template <int DK, int BV>
struct SmemCompact {
    static constexpr bool kCompact = true;
    static constexpr int kDk = DK, kBv = BV;
    static constexpr int KC = DK < 64 ? DK : 64;    // Dk slice of the Gram's k and q
    static constexpr int KS = KC + 4;
    static constexpr int FC = DK < 128 ? DK : 128;  // Dk slice of keys in one state-update pass
    static constexpr int FS = FC + 4;
    static constexpr int SS = BV + 8;
    static constexpr int AS = 68, TS = 68, PS = 52;  // A and T share rows (T overwrites A)
    union Work {
        struct { float k[kChunk * KS], q[kChunk * KS]; } gram;
        struct { float a[kChunk * AS], qk[kChunk * TS], p[16 * PS]; } chunk;
        float k_rows[kChunk * FS];
        GdnScratch scratch;  // one-token chunks
    };
    Work w;
    float s[DK * SS];
    float v[kChunk * SS];  // V tile, then R, then V'
    float gcum[kChunk], eg[kChunk], tail[kChunk], beta[kChunk];
    __device__ float *kmat() { return w.gram.k; }
    __device__ float *qmat() { return w.gram.q; }
    __device__ float *amat() { return w.chunk.a; }
    __device__ float *tmat() { return w.chunk.a; }
    __device__ float *qkmat() { return w.chunk.qk; }
    __device__ float *vprime() { return v; }
    __device__ float *pmat() { return w.chunk.p; }
    __device__ GdnScratch &scr() { return w.scratch; }
};

// Warp 0: g and beta of chunk rows [begin, begin + L) (zero past L) and G (a warp scan, two
// tokens a lane), exp(G), exp(G_last - G).
template <class S>
__device__ void load_gates(S &sm, const luce_gdn_chunked_params &p, int64_t begin, int L, int head) {
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
}

// Dims [d0, d0 + W) of chunk rows [begin, begin + L) of k (and of q into qs when kWithQ) into
// rows of `stride` floats; rows past L are zero. Loads in flight together (unrolled batches of
// up to 8 float4 of k and of q a thread), then stores.
template <int DK, int W, bool kWithQ>
__device__ void load_key_rows(float *ks, float *qs, int stride, const luce_gdn_chunked_params &p, int64_t begin,
                              int L, int head, int d0) {
    constexpr int D4 = W / 4, PER_THREAD = kChunk * D4 / GDN_THREADS, BATCH = PER_THREAD < 8 ? PER_THREAD : 8;
    static_assert(PER_THREAD % BATCH == 0 && PER_THREAD * GDN_THREADS == kChunk * D4, "whole batches");
    const int64_t H = p.n_heads;
    for (int b0 = 0; b0 < PER_THREAD; b0 += BATCH) {
        float4 kv[BATCH], qv[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int i = threadIdx.x + (b0 + b) * GDN_THREADS, t = i / D4, d = 4 * (i % D4);
            kv[b] = qv[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < L) {
                const int64_t off = ((begin + t) * H + head) * DK + d0 + d;
                kv[b] = *reinterpret_cast<const float4 *>(p.k + off);
                if (kWithQ) qv[b] = *reinterpret_cast<const float4 *>(p.q + off);
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int i = threadIdx.x + (b0 + b) * GDN_THREADS, t = i / D4, d = 4 * (i % D4);
            *reinterpret_cast<float4 *>(&ks[t * stride + d]) = kv[b];
            if (kWithQ) *reinterpret_cast<float4 *>(&qs[t * stride + d]) = qv[b];
        }
    }
}

// Chunk rows [begin, begin + L) of v (this block's columns) into sm.v; rows past L are zero.
template <class S>
__device__ void load_values(S &sm, const luce_gdn_chunked_params &p, int64_t begin, int L, int head, int64_t col0) {
    constexpr int BV = S::kBv, VPT = kChunk * BV / GDN_THREADS;
    static_assert(VPT * GDN_THREADS == kChunk * BV, "whole rows");
    const int64_t H = p.n_heads;
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
}

// Everything a chunk reads before the Gram: Smem takes all of k and q here, SmemCompact
// takes them slice by slice inside the Gram.
template <class S>
__device__ void load_chunk(S &sm, const luce_gdn_chunked_params &p, int64_t begin, int L, int head, int64_t col0) {
    load_gates(sm, p, begin, L, head);
    if constexpr (!S::kCompact) load_key_rows<S::kDk, S::kDk, true>(sm.k, sm.q, S::KS, p, begin, L, head, 0);
    load_values(sm, p, begin, L, head, col0);
    __syncthreads();
}

}  // namespace gdntc
