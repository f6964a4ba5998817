// Device functions of a GDN decode row shared by the chain's kernels (cuda/gdn_decode.cu: launch 1
// of the two-launch form and of the tree verify; gdn_decode_one.cuh: the one-launch form), so
// both compute every value with the same instructions in the same order: q / k conv + SiLU + L2
// norm a key head a warp, v a channel, the gates a value head, the conv state's advance.
// Included by cuda/gdn_decode.cu only (an anonymous namespace of that file).
#pragma once

#include "conv1d.cuh"
#include "gdn_recurrent.cuh"
#include "pointwise.cuh"
#include "pdl.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / WARP_SIZE;
constexpr int kMaxLaneChannels = 256 / WARP_SIZE;  // Dk <= 256

// Launch 1's roles along x: q / k heads, v channels, value heads' gates, then (segment 0, with a
// workspace) the warps quantizing the workspace's padding rows (pad_warps of them).
struct Layout {
    int64_t C, key_dim, qk_blocks, v_blocks, gate_blocks, pad_warps;
};

__host__ __device__ inline Layout layout_of(const luce_gdn_decode_params &p, const mm::XLayout &l) {
    const int64_t key_dim = (int64_t)p.n_k_heads * p.dk, value_dim = (int64_t)p.n_v_heads * p.dv;
    return {2 * key_dim + value_dim, key_dim, (2 * p.n_k_heads + kWarps - 1) / kWarps,
            (value_dim + kThreads - 1) / kThreads, (p.n_v_heads + kThreads - 1) / kThreads,
            l.xq != nullptr ? (l.tp - p.rows) * l.chunks : 0};
}

// SiLU(conv) of channel c at token t of the segment whose first row is r0; state_c is the
// channel's window column in the slot's state [K-1, C]. kTree: row r0 + t of a draft tree, its
// window conv1d.cuh's tree_window (a malformed tree gives NaN, as conv_tree), and the row's own
// input (the window's last) copied to p.conv_stage where given (the tree commit's conv inputs).
template <int K, bool kTree>
__device__ __forceinline__ float conv_silu_at(const luce_gdn_decode_params &p, const int32_t *tree_parents,
                                              const float *state_c, int64_t C, int64_t c, int64_t r0, int64_t t) {
    float w[K], window[K];
#pragma unroll
    for (int j = 0; j < K; ++j) w[j] = p.conv_weight[c * K + j];
    if constexpr (kTree) {
        const bool ok = tree_window<K>(p.qkv, p.qkv_stride, c, tree_parents, r0, r0 + t, state_c, C, window);
        if (p.conv_stage != nullptr) p.conv_stage[(r0 + t - p.stage_row0) * C + c] = window[K - 1];
        if (!ok) return __int_as_float(0x7fc00000);
    } else {
#pragma unroll
        for (int j = 0; j < K; ++j) {
            const int64_t i = t + j;   // window row i: rows 0..K-2 the carried state, K-1+t token t
            window[j] = i < K - 1 ? state_c[i * C] : p.qkv[(r0 + i - (K - 1)) * p.qkv_stride + c];
        }
    }
    return silu_f32(conv1d_dot<K>(w, window));
}

// The window after the segment's n >= 1 rows: rows n .. n+K-2, in increasing order (row j
// reads row n + j > j, not yet rewritten).
template <int K>
__device__ __forceinline__ void conv_state_advance(const luce_gdn_decode_params &p, float *state_c, int64_t C,
                                                   int64_t c, int64_t r0, int64_t n) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
        const int64_t i = n + j;
        state_c[j * C] = i < K - 1 ? state_c[i * C] : p.qkv[(r0 + i - (K - 1)) * p.qkv_stride + c];
    }
}

// Key head u's q (u < Hk, then times q_scale) or k (head u - Hk) at row t of the segment whose
// first row is r0: conv + SiLU, L2-normed; lane holds channels lane, lane + WARP_SIZE, .. (the
// l2norm kernel's order) in y[0 .. Dk / WARP_SIZE) (N >= Dk / WARP_SIZE: the caller's bound on
// the unrolled loops). A whole warp calls.
template <int K, bool kTree, int N>
__device__ __forceinline__ void qk_head_normed(const luce_gdn_decode_params &p, const int32_t *tree_parents,
                                               const float *state, int64_t C, int64_t u, int64_t r0, int64_t t,
                                               float (&y)[N]) {
    const int lane = threadIdx.x % WARP_SIZE, per_lane = (int)(p.dk / WARP_SIZE);
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if (i >= per_lane) break;
        const int64_t c = u * p.dk + lane + i * WARP_SIZE;
        y[i] = conv_silu_at<K, kTree>(p, tree_parents, state + c, C, c, r0, t);
        sum = l2norm_accumulate(sum, y[i]);
    }
    const double inv = l2norm_inverse(sum, p.l2_eps);
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if (i >= per_lane) break;
        y[i] = l2norm_apply(y[i], inv);
        if (u < p.n_k_heads) y[i] = __fmul_rn(y[i], p.q_scale);
    }
}

// The window of key head u's q or k channels after the segment's n rows (its lanes' channels).
template <int K>
__device__ __forceinline__ void qk_head_advance(const luce_gdn_decode_params &p, float *state, int64_t C, int64_t u,
                                                int64_t r0, int64_t n) {
    const int lane = threadIdx.x % WARP_SIZE, per_lane = (int)(p.dk / WARP_SIZE);
#pragma unroll
    for (int i = 0; i < kMaxLaneChannels; ++i) {
        if (i >= per_lane) break;
        const int64_t c = u * p.dk + lane + i * WARP_SIZE;
        conv_state_advance<K>(p, state + c, C, c, r0, n);
    }
}

// beta = sigmoid(b) and g = softplus(a + dt_bias) * ssm_a of value head h at row t.
__device__ __forceinline__ void gdn_gates(const luce_gdn_decode_params &p, int64_t t, int64_t h, float &beta,
                                          float &g) {
    beta = (float)unary_op(LUCE_PW_SIGMOID, (double)p.b[t * p.b_stride + h]);
    const float a = p.a[t * p.a_stride + h];
    const float sp = (float)unary_op(LUCE_PW_SOFTPLUS, (double)__fadd_rn(a, p.dt_bias[h]));
    g = __fmul_rn(sp, p.ssm_a[h]);
}

}  // namespace
