// SwiGLU (reference: luce/ref/swiglu.py): out = silu(gate) * up, element-wise in f32.
// Shapes: gate, up, out [rows, cols] f32 with row strides in elements, so a fused gate|up
// projection [rows, 2F] needs no split copy. Grid: x over chunks of 4 columns (common.cuh;
// float4 when rows are 16-byte aligned), y over rows. No reductions: batch-invariant.
// out may alias gate or up (each element is read before it is written, by one thread).
#include "common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

__global__ void __launch_bounds__(kThreads) swiglu_kernel(luce_swiglu_params p) {
    const int64_t chunks = (p.cols + 3) / 4;
    for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
        const float *gate = p.gate + row * p.gate_stride;
        const float *up = p.up + row * p.up_stride;
        float *out = p.out + row * p.out_stride;
        for (int64_t j = (int64_t)blockIdx.x * kThreads + threadIdx.x; j < chunks;
             j += (int64_t)gridDim.x * kThreads) {
            float g[4], u[4];
            load_chunk4(gate, j, p.cols, g);
            load_chunk4(up, j, p.cols, u);
#pragma unroll
            for (int i = 0; i < 4; ++i) g[i] = silu_f32(g[i]) * u[i];
            store_chunk4(out, j, p.cols, g);
        }
    }
}

int launch_swiglu(const luce_swiglu_params &p, cudaStream_t stream) {
    if (p.rows < 0 || p.cols <= 0 || p.gate_stride < p.cols || p.up_stride < p.cols ||
        p.out_stride < p.cols)
        return (int)cudaErrorInvalidValue;
    if (p.rows == 0) return 0;
    const int64_t chunks = (p.cols + 3) / 4;
    const int64_t blocks_x = (chunks + kThreads - 1) / kThreads;
    if (blocks_x > 0x7fffffff) return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)blocks_x, (unsigned)(p.rows < kMaxGridY ? p.rows : kMaxGridY));
    swiglu_kernel<<<grid, kThreads, 0, stream>>>(p);
    return luce_status(cudaGetLastError());
}

}  // namespace

extern "C" int luce_swiglu(const luce_swiglu_params *p, void *stream) {
    return launch_swiglu(*p, (cudaStream_t)stream);
}
