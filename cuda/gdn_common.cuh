// Gated DeltaNet token update shared by every kernel that advances a GDN state: the AR
// recurrent step (gdn_recurrent.cu), tree verify and the factor-replay commit (DESIGN 3 and
// 5 rule 4). Reference: luce/ref/gdn_recurrent.py (gdn_decay, gdn_delta, gdn_write,
// gdn_read). Using these functions with the same block layout makes the states bitwise
// equal whichever kernel produced them.
//
// Block layout: GDN_KGROUPS warps; warp w holds rows [w * ROWS, (w + 1) * ROWS) of the head's
// state H [Dk, Dv] (ROWS = Dk / GDN_KGROUPS) for WARP_SIZE consecutive columns, lane = column.
// Each thread keeps its ROWS values of one column in registers. Reductions over k add the
// thread's rows in order (fmaf chain), then the warps' partials in warp order.
#pragma once

#include "common.cuh"

constexpr int GDN_KGROUPS = 8;
constexpr int GDN_THREADS = GDN_KGROUPS * WARP_SIZE;

// Host: the sizes every GDN entry point rejects: segments or heads past the grid's y/z limit,
// dv not a positive multiple of WARP_SIZE (the columns one block owns), Dk not 64/128/256.
inline bool gdn_bad_sizes(int32_t n_segments, int32_t n_heads, int32_t dk, int32_t dv) {
    return n_segments < 0 || n_segments > 65535 || n_heads <= 0 || n_heads > 65535 || dv <= 0 ||
           dv % WARP_SIZE != 0 || (dk != 64 && dk != 128 && dk != 256);
}

// Scratch for the two column reductions of one token (double-buffered: one barrier each).
struct GdnScratch {
    float partial[2][GDN_KGROUPS][WARP_SIZE];
};

// ROWS consecutive floats from src (16-byte aligned, ROWS % 4 == 0) into registers: a
// thread's slice of a token's k or q.
template <int ROWS>
__device__ __forceinline__ void gdn_load_rows(const float *src, float (&dst)[ROWS]) {
    const float4 *s4 = reinterpret_cast<const float4 *>(src);
#pragma unroll
    for (int i = 0; i < ROWS / 4; ++i) {
        const float4 x = s4[i];
        dst[4 * i] = x.x; dst[4 * i + 1] = x.y; dst[4 * i + 2] = x.z; dst[4 * i + 3] = x.w;
    }
}

// H = exp(g) H (the caller passes decay = expf(g)).
template <int ROWS>
__device__ __forceinline__ void gdn_decay(float (&h)[ROWS], float decay) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) h[r] *= decay;
}

// H += k u^T for this column: the rank-one write (replay applies gdn_decay then this).
template <int ROWS>
__device__ __forceinline__ void gdn_write(float (&h)[ROWS], const float (&k)[ROWS], float u) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) h[r] = fmaf(k[r], u, h[r]);
}

// This thread's part of x^T H[:, column].
template <int ROWS>
__device__ __forceinline__ float gdn_partial_dot(const float (&h)[ROWS], const float (&x)[ROWS]) {
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) s = fmaf(h[r], x[r], s);
    return s;
}

// Sum of the column's partials over the k-groups, in group order; every thread of the
// column gets it. All threads of the block must call it (one __syncthreads).
__device__ __forceinline__ float gdn_column_sum(float partial, float (*buf)[WARP_SIZE]) {
    const int lane = threadIdx.x % WARP_SIZE;
    buf[threadIdx.x / WARP_SIZE][lane] = partial;
    __syncthreads();
    float s = buf[0][lane];
#pragma unroll
    for (int w = 1; w < GDN_KGROUPS; ++w) s += buf[w][lane];
    return s;
}

// One token: H = exp(g) H; u = beta (v - H^T k); H += k u^T; returns o = H^T q for this
// column and sets *u_out (the factor a tree node keeps). v is this column's value.
// Two barriers; consecutive calls may reuse `scratch` (its halves alternate).
template <int ROWS>
__device__ __forceinline__ float gdn_step(float (&h)[ROWS], const float (&k)[ROWS],
                                          const float (&q)[ROWS], float v, float decay,
                                          float beta, GdnScratch &scratch, float *u_out) {
    gdn_decay(h, decay);
    const float predicted = gdn_column_sum(gdn_partial_dot(h, k), scratch.partial[0]);
    const float u = beta * (v - predicted);
    gdn_write(h, k, u);
    *u_out = u;
    return gdn_column_sum(gdn_partial_dot(h, q), scratch.partial[1]);
}

// Commit replay of one token from its factors: bitwise the state gdn_step left.
template <int ROWS>
__device__ __forceinline__ void gdn_replay(float (&h)[ROWS], const float (&k)[ROWS], float decay,
                                           float u) {
    gdn_decay(h, decay);
    gdn_write(h, k, u);
}
