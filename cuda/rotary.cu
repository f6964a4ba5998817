// Rotary position embedding, NEOX (half-split) style on the first rope_dim dims of each head,
// plain or M-RoPE with interleaved sections (IMROPE) (reference: luce/ref/rotary.py rope).
// Pair i of a head, (x[i], x[i + rope_dim/2]), rotates by angle = pos * theta^(-2i/rope_dim),
// pos being the row's position, or under IMROPE the position of the pair's section.
// Shapes: x, out [rows, heads, head_dim] f32 with element strides per row and per head
// (q or k inside a fused projection rotates in place); positions int32 [rows] or [rows, 4].
// One block per row: the row's cos/sin table (rope_dim/2 entries, computed in double: angles
// reach 1e5+ rad, where f32 would lose whole radians) goes to shared memory, then every head
// rotates in f32. No reductions: batch-invariant.
#include "rotary.cuh"

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) rotary_kernel(luce_rotary_params p) {
    extern __shared__ float table[];  // cos [half] then sin [half]
    const int64_t row = blockIdx.x;
    const int half = p.rope_dim / 2;
    rope::fill_table(table, p.positions, row, p.n_pos, p.sections, p.rope_dim, p.theta, threadIdx.x, kThreads);
    __syncthreads();
    const float *x = p.x + row * p.x_row_stride;
    float *out = p.out + row * p.out_row_stride;
    for (int idx = threadIdx.x; idx < p.heads * half; idx += kThreads) {
        const int h = idx / half, i = idx % half;
        const float *xh = x + h * p.x_head_stride;
        float *oh = out + h * p.out_head_stride;
        const float x0 = xh[i], x1 = xh[i + half];
        rope::rotate(x0, x1, table[i], table[half + i], &oh[i], &oh[i + half]);
    }
    const int pass = p.head_dim - p.rope_dim;
    if (p.x == p.out && p.x_row_stride == p.out_row_stride && p.x_head_stride == p.out_head_stride)
        return;  // in place: the other dims are already there
    for (int idx = threadIdx.x; idx < p.heads * pass; idx += kThreads) {
        const int h = idx / pass, d = p.rope_dim + idx % pass;
        out[h * p.out_head_stride + d] = x[h * p.x_head_stride + d];
    }
}

int launch_rotary(const luce_rotary_params &p, cudaStream_t stream) {
    const bool sectioned = p.sections[0] || p.sections[1] || p.sections[2] || p.sections[3];
    const bool bad_sections = p.sections[0] < 0 || p.sections[1] < 0 || p.sections[2] < 0 ||
                              p.sections[3] < 0;
    if (p.rows < 0 || p.rows > 0x7fffffff || p.heads <= 0 || p.rope_dim <= 0 ||
        p.rope_dim % 2 || p.rope_dim > p.head_dim || bad_sections ||
        !(p.n_pos == 1 || (p.n_pos == 4 && sectioned)) || !(p.theta > 0.0f))
        return (int)cudaErrorInvalidValue;
    if (p.rows == 0) return 0;
    const size_t shmem = (size_t)p.rope_dim * sizeof(float);
    rotary_kernel<<<(unsigned)p.rows, kThreads, shmem, stream>>>(p);
    return luce_status(cudaGetLastError());
}

}  // namespace

extern "C" int luce_rotary(const luce_rotary_params *p, void *stream) {
    return launch_rotary(*p, (cudaStream_t)stream);
}
