// Fused attention input of one step (reference: luce/ref/rope_kv.py rope_kv_write): per row,
// per-head RMSNorm of q and k (optional, qwen3), NEOX / IMROPE rotary of both, and the KV
// write of k and v to the row's paged KV location, in one launch instead of 3 (rotary q,
// rotary k, the two KV gathers: 4) or 6 with the norms.
// The norm is rmsnorm.cuh's warp path (luce_rmsnorm's for head_dim <= 1024), the rotation
// and its cos/sin table rotary.cuh's: the bits of the unfused kernels (a head: rope_head.cuh,
// which the fused decode attention input of cuda/attention.cu shares).
// Shapes: q, k, v [rows, H*, head_dim] at element row strides (views into a merged qkv
// projection), q's heads q_head_stride apart (0: head_dim; a gated attention's queries sit in
// the first half of each [query | gate] head: 2 head_dim); q_out [rows, Hq, head_dim]
// contiguous; k_pages, v_pages [n_rows, Hkv, head_dim] (flat page rows), kv_dst [rows] int64
// (-1: padding, no KV written). Grid (rows, head groups): block (row, y) takes heads
// y * kWarps .. of the row's q | k | v heads, a warp per head (several blocks a row, so a
// one-row decode step is not one SM's work); no reduction
// spans rows or heads: batch-invariant (DESIGN 5).
#include "pdl.cuh"
#include "rope_head.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / WARP_SIZE;

__global__ void __launch_bounds__(kThreads) rope_kv_kernel(luce_rope_kv_params p) {
    extern __shared__ float4 smem4[];
    float *table = reinterpret_cast<float *>(smem4);  // cos [half] then sin [half]
    const int64_t row = blockIdx.x;
    rope::fill_table(table, p.positions, row, p.n_pos, p.sections, p.rope_dim, p.theta, threadIdx.x, kThreads);
    wait_for_prior_kernels();  // positions come from the step's upload; q, k, v from the matmul ahead
    let_dependents_start();
    __syncthreads();
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, D = p.head_dim;
    const int64_t dst = p.kv_dst[row];
    const int heads = p.heads_q + 2 * p.heads_kv;
    const int64_t q_head_stride = p.q_head_stride ? p.q_head_stride : D;
    for (int h = blockIdx.y * kWarps + warp; h < heads; h += kWarps * gridDim.y) {
        if (h < p.heads_q)
            rope::head_norm_rope(p.q + row * p.q_stride + h * q_head_stride, p.q_out + (row * p.heads_q + h) * D,
                                 p.q_norm, p.eps, table, D, p.rope_dim, lane);
        else if (dst >= 0)
            rope::kv_head_write(p, row, dst, h - p.heads_q, table, lane);
    }
}

}  // namespace

extern "C" int luce_rope_kv(const luce_rope_kv_params *p, void *stream) {
    if (!rope::params_valid(*p) || !p->q_out)
        return (int)cudaErrorInvalidValue;
    if (p->rows == 0) return 0;
    const size_t shmem = (size_t)p->rope_dim * sizeof(float);
    const unsigned groups = (unsigned)((p->heads_q + 2 * p->heads_kv + kWarps - 1) / kWarps);
    return luce_status(launch_overlapped(rope_kv_kernel, dim3((unsigned)p->rows, groups), dim3(kThreads), shmem,
                                         (cudaStream_t)stream, chain_overlap(kPdlRope), *p));
}
