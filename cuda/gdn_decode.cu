// The Gated DeltaNet decode chain of AR rows in two launches (reference: luce/ref/gdn_decode.py,
// the composition of the unfused ops; params and shapes: luce_gdn_decode_params in
// cuda/luce_ops_sequence.h). Every value is computed by the device functions of the unfused
// kernels, in their order, so the results are bitwise theirs:
//   1. prepare: causal conv1d step (conv1d.cuh) + SiLU of every channel, advancing the slot's
//      conv state in place; per key head L2 norm of q and k (pointwise.cuh; q then times
//      q_scale), written to the value heads that read them (value head j reads key head
//      j % Hk); v; beta = sigmoid(b) and g = softplus(a + dt_bias) * ssm_a; the arrival
//      counters of launch 2 zeroed.
//   2. the recurrent step (gdn_recurrent.cuh) with the gated RMSNorm epilogue, which also
//      quantizes normed for the out projection where a workspace is given (gdn_norm_epilogue.cuh;
//      launch 1 then zeroes the chunk arrivals and quantizes the workspace's padding rows).
// luce_gdn_tree_prepare is launch 1 for the rows of draft trees (speculative verify): each row's
// conv window from its ancestors, nearest last, then the slot's conv state (conv1d.cuh's
// tree_window, as cuda/tree_conv.cu, and the same fmaf chain), nothing advanced, the arrivals
// zeroed where given; one row a block along z, as a tree's rows are independent. It also copies
// each tree row's qkv row into the commit's conv-input stage and zeroes the padding rows of the
// verify's normed output (the memcpy and memset launches they replace). The tree verify
// (cuda/gdn_tree.cu) with its gated RMSNorm epilogue follows it.
// Launch 1 grid (roles, segments): blocks [0, qk) hold one q or k head a warp (lanes over the
// head's channels lane, lane + WARP_SIZE, ..., the l2norm kernel's order), blocks [qk, qk + vb)
// one v channel a thread, the rest one value head's gates a thread. A channel's conv state
// is read and written by its one thread: in place is safe. qkv, z, b and a are read with
// their row strides (column blocks of one merged projection read in place); only the
// addresses differ from dense rows, never the arithmetic.
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

// kTree: block z takes row z of the segment (tree_parents as conv_silu_at), else every row.
template <int K, bool kTree>
__global__ void __launch_bounds__(kThreads) gdn_decode_prepare_kernel(luce_gdn_decode_params p,
                                                                      const int32_t *tree_parents, mm::XLayout l) {
    wait_for_prior_kernels();  // q, k, v, z, b, a come from the matmuls ahead
    let_dependents_start();
    const Layout L = layout_of(p, l);
    const int64_t seg = blockIdx.y, Hk = p.n_k_heads, Hv = p.n_v_heads, dk = p.dk, dv = p.dv;
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg], n = p.qo_indptr[seg + 1] - r0;
    const int64_t t_first = kTree ? blockIdx.z : 0;  // the block's rows: t_first .. t_end - 1
    const int64_t t_end = kTree ? (t_first < n ? t_first + 1 : t_first) : n;
    const int64_t bx = blockIdx.x;
    if (bx >= L.qk_blocks + L.v_blocks + L.gate_blocks) {   // padding rows of the workspace: zeros
        const int64_t item = (bx - L.qk_blocks - L.v_blocks - L.gate_blocks) * kWarps + threadIdx.x / WARP_SIZE;
        if (seg == 0 && item < L.pad_warps)  // whole warps
            mm::quantize_x_row_chunk<false>(nullptr, false, l, p.rows + item / l.chunks, item % l.chunks);
        return;
    }
    if (bx >= L.qk_blocks + L.v_blocks) {   // gates of value head h
        const int64_t h = (bx - L.qk_blocks - L.v_blocks) * kThreads + threadIdx.x;
        if (h >= Hv) return;
        if (!kTree || (p.arrivals != nullptr && blockIdx.z == 0)) p.arrivals[seg * Hv + h] = 0;
        if (l.xq != nullptr)  // the chunk arrivals, after the heads'
            for (int64_t c = h; c < l.chunks; c += Hv) p.arrivals[p.n_segments * Hv + seg * l.chunks + c] = 0;
        if (slot < 0) return;
        for (int64_t t = r0 + t_first; t < r0 + t_end; ++t) {
            const int64_t th = t * Hv + h;
            p.beta[th] = (float)unary_op(LUCE_PW_SIGMOID, (double)p.b[t * p.b_stride + h]);
            const float a = p.a[t * p.a_stride + h];
            const float sp = (float)unary_op(LUCE_PW_SOFTPLUS, (double)__fadd_rn(a, p.dt_bias[h]));
            p.g[th] = __fmul_rn(sp, p.ssm_a[h]);
        }
        return;
    }
    const int64_t C = L.C;
    if (kTree && slot < 0 && p.normed != nullptr && bx >= L.qk_blocks && blockIdx.z == 0) {
        // A padding segment's rows of the tree block reach the LM head: zeros (no verify node writes them).
        const int64_t cv = (bx - L.qk_blocks) * kThreads + threadIdx.x;
        if (cv < Hv * dv)
            for (int64_t t = 0; t < n; ++t) p.normed[(r0 + t) * (Hv * dv) + cv] = 0.0f;
        return;
    }
    if (slot < 0 || n <= 0) return;
    float *state = p.conv_state + slot * (K - 1) * C;
    if (bx >= L.qk_blocks) {                // one v channel
        const int64_t c = 2 * L.key_dim + (bx - L.qk_blocks) * kThreads + threadIdx.x;
        if (c >= C) return;
        for (int64_t t = t_first; t < t_end; ++t)
            p.v[(r0 + t) * (Hv * dv) + c - 2 * L.key_dim] =
                conv_silu_at<K, kTree>(p, tree_parents, state + c, C, c, r0, t);
        if (!kTree) conv_state_advance<K>(p, state + c, C, c, r0, n);
        return;
    }
    const int64_t u = bx * kWarps + threadIdx.x / WARP_SIZE;   // q head u, or k head u - Hk
    if (u >= 2 * Hk) return;                                   // the whole warp
    const int lane = threadIdx.x % WARP_SIZE;
    const int per_lane = (int)(dk / WARP_SIZE);
    const bool is_q = u < Hk;
    const int64_t key_head = is_q ? u : u - Hk;
    float *dst = is_q ? p.q : p.k;
    for (int64_t t = t_first; t < t_end; ++t) {
        float y[kMaxLaneChannels];
        double sum = 0.0;
#pragma unroll
        for (int i = 0; i < kMaxLaneChannels; ++i) {
            if (i >= per_lane) break;
            const int64_t c = u * dk + lane + i * WARP_SIZE;
            y[i] = conv_silu_at<K, kTree>(p, tree_parents, state + c, C, c, r0, t);
            sum = l2norm_accumulate(sum, y[i]);
        }
        const double inv = l2norm_inverse(sum, p.l2_eps);
#pragma unroll
        for (int i = 0; i < kMaxLaneChannels; ++i) {
            if (i >= per_lane) break;
            y[i] = l2norm_apply(y[i], inv);
            if (is_q) y[i] = __fmul_rn(y[i], p.q_scale);
        }
        for (int64_t j = key_head; j < Hv; j += Hk) {          // the value heads reading this key head
            float *row = dst + ((r0 + t) * Hv + j) * dk;
#pragma unroll
            for (int i = 0; i < kMaxLaneChannels; ++i) {
                if (i >= per_lane) break;
                row[lane + i * WARP_SIZE] = y[i];
            }
        }
    }
    if constexpr (!kTree) {
#pragma unroll
        for (int i = 0; i < kMaxLaneChannels; ++i) {
            if (i >= per_lane) break;
            const int64_t c = u * dk + lane + i * WARP_SIZE;
            conv_state_advance<K>(p, state + c, C, c, r0, n);
        }
    }
}

template <int K, bool kTree>
cudaError_t launch_prepare(const luce_gdn_decode_params &p, const int32_t *tree_parents, const mm::XLayout &l,
                           dim3 grid, cudaStream_t stream) {
    return launch_overlapped(gdn_decode_prepare_kernel<K, kTree>, grid, dim3(kThreads), 0, stream,
                             chain_overlap(kPdlGdn), p, tree_parents, l);
}

template <bool kTree>
cudaError_t launch_prepare_taps(const luce_gdn_decode_params &p, const int32_t *tree_parents, const mm::XLayout &l,
                                dim3 grid, cudaStream_t s) {
    switch (p.kernel_size) {
        case 2: return launch_prepare<2, kTree>(p, tree_parents, l, grid, s);
        case 3: return launch_prepare<3, kTree>(p, tree_parents, l, grid, s);
        case 4: return launch_prepare<4, kTree>(p, tree_parents, l, grid, s);
        case 5: return launch_prepare<5, kTree>(p, tree_parents, l, grid, s);
        case 6: return launch_prepare<6, kTree>(p, tree_parents, l, grid, s);
        case 7: return launch_prepare<7, kTree>(p, tree_parents, l, grid, s);
        default: return launch_prepare<8, kTree>(p, tree_parents, l, grid, s);
    }
}

template <int DK>
cudaError_t launch_recurrent_norm(const luce_gdn_decode_params &p, const mm::XLayout &l, cudaStream_t stream) {
    const luce_gdn_recurrent_params r = {p.q, p.k, p.v, p.g, p.beta, p.state, p.out, p.qo_indptr, p.seq_slots,
                                         p.n_slots, p.n_segments, p.n_v_heads, p.dk, p.dv};
    int32_t *chunk_arrivals = l.xq != nullptr ? p.arrivals + (int64_t)p.n_segments * p.n_v_heads : nullptr;
    const GdnNormEpilogue e = {p.z, p.z_stride, p.norm_weight, p.normed, p.arrivals, p.rms_eps, l, chunk_arrivals};
    const dim3 grid((unsigned)(p.dv / WARP_SIZE), (unsigned)p.n_v_heads, (unsigned)p.n_segments);
    return launch_overlapped(gdn_recurrent_kernel<DK, true>, grid, dim3(GDN_THREADS), 0, stream, chain_overlap(kPdlGdn), r, e);
}

// Launch 1's blocks along x.
int64_t prepare_blocks(const Layout &L) {
    return L.qk_blocks + L.v_blocks + L.gate_blocks + (L.pad_warps + kWarps - 1) / kWarps;
}

// 0 where the sizes are valid for either entry point (and l the workspace's layout, l.xq null
// without one), else cudaErrorInvalidValue.
int bad_prepare_sizes(const luce_gdn_decode_params *p, mm::XLayout *l) {
    *l = mm::XLayout{};
    if (gdn_bad_sizes(p->n_segments, p->n_v_heads, p->dk, p->dv) || p->n_slots < 0 || p->n_k_heads <= 0 ||
        p->dk % WARP_SIZE != 0 || p->kernel_size < 2 || p->kernel_size > 8 ||
        ((uintptr_t)p->q | (uintptr_t)p->k) % 16 != 0)  // rows of q, k move as float4
        return (int)cudaErrorInvalidValue;
    if (p->workspace != nullptr) {  // normed [rows, Hv Dv] quantized: a head's chunks fit one mask word
        const int64_t cols = (int64_t)p->n_v_heads * p->dv;
        if (p->rows <= 0 || p->rows > 0x7fffffff || p->dv > 4096 || !is_aligned16(p->workspace) ||
            !is_aligned16(p->normed) || p->workspace_bytes < mm::x_bytes(p->rows, cols))
            return (int)cudaErrorInvalidValue;
        *l = mm::x_layout(p->workspace, p->rows, cols);
    }
    const Layout L = layout_of(*p, *l);
    if (p->qkv_stride < L.C || p->z_stride < (int64_t)p->n_v_heads * p->dv || p->b_stride < p->n_v_heads ||
        p->a_stride < p->n_v_heads)
        return (int)cudaErrorInvalidValue;
    return prepare_blocks(L) > 0x7fffffff ? (int)cudaErrorInvalidValue : 0;
}

// Launch 1's grid: (roles, segments, rows a segment's blocks take one each; 1: all).
dim3 prepare_grid(const luce_gdn_decode_params *p, const mm::XLayout &l, int64_t rows) {
    return dim3((unsigned)prepare_blocks(layout_of(*p, l)), (unsigned)p->n_segments, (unsigned)rows);
}

}  // namespace

extern "C" int luce_gdn_decode(const luce_gdn_decode_params *p, void *stream) {
    if (p->n_segments == 0) return 0;
    mm::XLayout l;
    if (const int bad = bad_prepare_sizes(p, &l)) return bad;
    const cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = launch_prepare_taps<false>(*p, nullptr, l, prepare_grid(p, l, 1), s);
    if (err != cudaSuccess) return luce_status(err);
    switch (p->dk) {
        case 64: err = launch_recurrent_norm<64>(*p, l, s); break;
        case 128: err = launch_recurrent_norm<128>(*p, l, s); break;
        default: err = launch_recurrent_norm<256>(*p, l, s); break;
    }
    return luce_status(err);
}

extern "C" int luce_gdn_tree_prepare(const luce_gdn_decode_params *p, const int32_t *tree_parents,
                                     int32_t max_tree_rows, void *stream) {
    if (p->n_segments == 0 || max_tree_rows == 0) return 0;
    mm::XLayout l;
    if (const int bad = bad_prepare_sizes(p, &l)) return bad;
    if (!tree_parents || max_tree_rows < 0 || max_tree_rows > 65535 || l.xq != nullptr)
        return (int)cudaErrorInvalidValue;
    return luce_status(
        launch_prepare_taps<true>(*p, tree_parents, l, prepare_grid(p, l, max_tree_rows), (cudaStream_t)stream));
}
