// Causal depthwise conv1d with carried state, then SiLU: the Gated DeltaNet input mixer
// (reference: luce/ref/conv1d.py causal_conv1d, applied per segment).
// Shapes: x, y [T, C] f32 (row strides x_stride, y_stride); weight [C, K] f32 (tap K-1 is the
// current token); state pools [n_slots, K-1, C] f32, segment s reading state_in[in_slots[s]]
// and writing state_out[out_slots[s]]; qo_indptr [S+1] int32 as in luce/models/batch.py.
// Grid: x = 128-channel tiles, y = segments, z = 16-token chunks of a segment. A thread keeps
// its channel's K-tap window in registers and walks its chunk. Only chunk 0 reads the old
// state, and the same thread writes the new one after reading everything it needs, so
// state_out may be state_in. Each y[t, c] sums its K taps in a fixed order: batch-invariant.
#include "conv1d.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerBlock = 16;
constexpr int kMaxTaps = 8;
static_assert(kRowsPerBlock >= kMaxTaps - 1, "only chunk 0 may read the old state");

template <int K>
__global__ void __launch_bounds__(kThreads) conv1d_kernel(luce_conv1d_params p) {
    const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    const int64_t seg = blockIdx.y;
    if (c >= p.channels || p.in_slots[seg] < 0) return;
    const int64_t r0 = p.qo_indptr[seg];
    const int64_t n = p.qo_indptr[seg + 1] - r0;
    const int64_t t0 = (int64_t)blockIdx.z * kRowsPerBlock;
    if (t0 > 0 && t0 >= n) return;  // chunk 0 always runs: it writes the new state
    const int64_t t1 = t0 + kRowsPerBlock < n ? t0 + kRowsPerBlock : n;
    const int64_t C = p.channels;
    const float *state = p.state_in + (int64_t)p.in_slots[seg] * (K - 1) * C + c;
    const float *x = p.x + r0 * p.x_stride + c;

    float w[K], win[K], old[K - 1];
#pragma unroll
    for (int j = 0; j < K; ++j) w[j] = p.weight[c * K + j];
    // Window coordinate i: rows 0..K-2 are the carried state, row K-1+t is token t.
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
        const int64_t i = t0 + j;
        win[j] = i < K - 1 ? state[i * C] : x[(i - (K - 1)) * p.x_stride];
        old[j] = win[j];
    }
    float *y = p.y + r0 * p.y_stride + c;
    for (int64_t t = t0; t < t1; ++t) {
        win[K - 1] = x[t * p.x_stride];
        const float acc = conv1d_dot<K>(w, win);
        y[t * p.y_stride] = p.silu ? silu_f32(acc) : acc;
#pragma unroll
        for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
    }
    if (blockIdx.z != 0) return;
    // New state: window rows n .. n+K-2, from the old state (short segments) or from x.
    float *out = p.state_out + (int64_t)p.out_slots[seg] * (K - 1) * C + c;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
        const int64_t i = n + j;
        out[j * C] = i < K - 1 ? old[i] : x[(i - (K - 1)) * p.x_stride];
    }
}

template <int K>
void launch_taps(const luce_conv1d_params &p, dim3 grid, cudaStream_t stream) {
    conv1d_kernel<K><<<grid, kThreads, 0, stream>>>(p);
}

int launch_conv1d(const luce_conv1d_params &p, cudaStream_t stream) {
    if (p.n_segments < 0 || p.n_segments > 65535 || p.channels <= 0 || p.kernel_size < 2 ||
        p.kernel_size > kMaxTaps || p.max_segment_rows < 0 || p.x_stride < p.channels ||
        p.y_stride < p.channels)
        return (int)cudaErrorInvalidValue;
    if (p.n_segments == 0 || p.max_segment_rows == 0) return 0;
    const int64_t tiles = (p.channels + kThreads - 1) / kThreads;
    const int64_t chunks = (p.max_segment_rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (tiles > 0x7fffffff || chunks > 65535) return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)tiles, (unsigned)p.n_segments, (unsigned)chunks);
    switch (p.kernel_size) {
        case 2: launch_taps<2>(p, grid, stream); break;
        case 3: launch_taps<3>(p, grid, stream); break;
        case 4: launch_taps<4>(p, grid, stream); break;
        case 5: launch_taps<5>(p, grid, stream); break;
        case 6: launch_taps<6>(p, grid, stream); break;
        case 7: launch_taps<7>(p, grid, stream); break;
        default: launch_taps<8>(p, grid, stream); break;
    }
    return luce_status(cudaGetLastError());
}

}  // namespace

extern "C" int luce_conv1d(const luce_conv1d_params *p, void *stream) {
    return launch_conv1d(*p, (cudaStream_t)stream);
}
