// Causal depthwise conv1d over draft trees: each node convolved over its root path's window,
// and the conv state gathered along a committed path (DESIGN 3). Reference:
// luce/ref/tree_conv.py (conv_tree, conv_tree_commit). Params: luce_conv_tree_params and
// luce_conv_tree_commit_params in cuda/luce_ops.h: x, y [T, C] f32 (row strides), weight
// [C, K] f32, state pools [n_slots, K-1, C] f32, tree_parents [T] global parent rows.
//
// conv_tree: grid (128-channel tiles, segments, 16-row chunks); a thread owns one channel
// of one chunk's rows and fills each row's window from its ancestors (nearest last), then
// from the resident state (conv1d.cuh tree_window), and sums the K taps with conv1d_dot, so a
// node's output is bitwise luce_conv1d's along its root path.
// conv_tree_commit: grid (128-channel tiles, segments); a thread reads its channel's old
// window, then writes the new one (so state_out may be state_in).
#include "conv1d.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerBlock = 16;
constexpr int kMaxTaps = 8;

template <int K>
__global__ void __launch_bounds__(kThreads) conv_tree_kernel(luce_conv_tree_params p) {
    const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    const int64_t seg = blockIdx.y;
    if (c >= p.channels || p.seq_slots[seg] < 0) return;
    const int64_t r0 = p.qo_indptr[seg], r1 = p.qo_indptr[seg + 1];
    const int64_t t0 = r0 + (int64_t)blockIdx.z * kRowsPerBlock;
    const int64_t t1 = t0 + kRowsPerBlock < r1 ? t0 + kRowsPerBlock : r1;
    const int64_t C = p.channels;
    const float *state = p.state + (int64_t)p.seq_slots[seg] * (K - 1) * C + c;
    float w[K];
#pragma unroll
    for (int j = 0; j < K; ++j) w[j] = p.weight[c * K + j];
    for (int64_t t = t0; t < t1; ++t) {
        float win[K];
        const bool good = tree_window<K>(p.x, p.x_stride, c, p.tree_parents, r0, t, state, C, win);
        const float acc = good ? conv1d_dot<K>(w, win) : 0.0f;
        p.y[t * p.y_stride + c] = !good ? __int_as_float(0x7fc00000) : (p.silu ? silu_f32(acc) : acc);
    }
}

__global__ void __launch_bounds__(kThreads) conv_tree_commit_kernel(luce_conv_tree_commit_params p) {
    const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    const int64_t seg = blockIdx.y;
    if (c >= p.channels || p.in_slots[seg] < 0) return;
    const int W = p.kernel_size - 1;
    const int64_t C = p.channels;
    const int64_t i0 = p.path_indptr[seg];
    const int64_t len = p.path_indptr[seg + 1] - i0;
    const float *old = p.state_in + (int64_t)p.in_slots[seg] * W * C + c;
    float next[kMaxTaps - 1];
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j) {
        if (j >= W) break;
        // Row len + j of concat(old window [W], path rows [len]).
        const int64_t i = len + j;
        next[j] = i < W ? old[i * C] : p.x[(int64_t)p.path_rows[i0 + i - W] * p.x_stride + c];
    }
    float *out = p.state_out + (int64_t)p.out_slots[seg] * W * C + c;
#pragma unroll
    for (int j = 0; j < kMaxTaps - 1; ++j) {
        if (j >= W) break;
        out[j * C] = next[j];
    }
}

template <int K>
void launch_taps(const luce_conv_tree_params &p, dim3 grid, cudaStream_t stream) {
    conv_tree_kernel<K><<<grid, kThreads, 0, stream>>>(p);
}

int64_t channel_tiles(int64_t channels) { return (channels + kThreads - 1) / kThreads; }

}  // namespace

extern "C" int luce_conv_tree(const luce_conv_tree_params *p, void *stream) {
    if (p->n_segments < 0 || p->n_segments > 65535 || p->channels <= 0 || p->kernel_size < 2 ||
        p->kernel_size > kMaxTaps || p->max_segment_rows < 0 || p->x_stride < p->channels ||
        p->y_stride < p->channels)
        return (int)cudaErrorInvalidValue;
    if (p->n_segments == 0 || p->max_segment_rows == 0) return 0;
    const int64_t chunks = (p->max_segment_rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (channel_tiles(p->channels) > 0x7fffffff || chunks > 65535) return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)channel_tiles(p->channels), (unsigned)p->n_segments, (unsigned)chunks);
    const cudaStream_t s = (cudaStream_t)stream;
    switch (p->kernel_size) {
        case 2: launch_taps<2>(*p, grid, s); break;
        case 3: launch_taps<3>(*p, grid, s); break;
        case 4: launch_taps<4>(*p, grid, s); break;
        case 5: launch_taps<5>(*p, grid, s); break;
        case 6: launch_taps<6>(*p, grid, s); break;
        case 7: launch_taps<7>(*p, grid, s); break;
        default: launch_taps<8>(*p, grid, s); break;
    }
    return luce_status(cudaGetLastError());
}

extern "C" int luce_conv_tree_commit(const luce_conv_tree_commit_params *p, void *stream) {
    if (p->n_segments < 0 || p->n_segments > 65535 || p->channels <= 0 || p->kernel_size < 2 ||
        p->kernel_size > kMaxTaps || p->x_stride < p->channels || channel_tiles(p->channels) > 0x7fffffff)
        return (int)cudaErrorInvalidValue;
    if (p->n_segments == 0) return 0;
    const dim3 grid((unsigned)channel_tiles(p->channels), (unsigned)p->n_segments);
    conv_tree_commit_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(*p);
    return luce_status(cudaGetLastError());
}
