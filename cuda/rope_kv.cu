// Fused attention input of one step (reference: luce/ref/rope_kv.py rope_kv_write): per row,
// per-head RMSNorm of q and k (optional, qwen3), NEOX / IMROPE rotary of both, and the KV
// write of k and v to the row's paged KV location, in one launch instead of 3 (rotary q,
// rotary k, the two KV gathers: 4) or 6 with the norms.
// The norm is rmsnorm.cuh's warp path (luce_rmsnorm's for head_dim <= 1024), the rotation
// and its cos/sin table rotary.cuh's: the bits of the unfused kernels.
// Shapes: q, k, v [rows, H*, head_dim] at element row strides (views into a merged qkv
// projection); q_out [rows, Hq, head_dim] contiguous; k_pages, v_pages [n_rows, Hkv, head_dim]
// (flat page rows), kv_dst [rows] int64 (-1: padding, no KV written). Grid (rows, head
// groups): block (row, y) takes heads y * kWarps .. of the row's q | k | v heads, a warp per
// head (several blocks a row, so a one-row decode step is not one SM's work); no reduction
// spans rows or heads: batch-invariant (DESIGN 5).
#include "rmsnorm.cuh"
#include "rotary.cuh"
#include "pdl.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / WARP_SIZE;

// One head of head_dim values: normed (norm != nullptr) from src into dst, then rotated in
// dst; without a norm rotated from src into dst. By one warp.
__device__ __forceinline__ void head_norm_rope(const float *src, float *dst, const float *norm, float eps,
                                               const float *table, int head_dim, int rope_dim, int lane) {
    const int half = rope_dim / 2;
    if (norm) {
        const rms::Row r{src, norm, dst, head_dim, eps};
        rms::norm_row<true>(r, 0, lane, WARP_SIZE, [](float v) { return warp_sum(v); });
        __syncwarp();
        src = dst;
    }
    for (int i = lane; i < half; i += WARP_SIZE) {
        const float x0 = src[i], x1 = src[i + half];
        rope::rotate(x0, x1, table[i], table[half + i], &dst[i], &dst[i + half]);
    }
    if (!norm)
        for (int d = rope_dim + lane; d < head_dim; d += WARP_SIZE) dst[d] = src[d];
}

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
    for (int h = blockIdx.y * kWarps + warp; h < heads; h += kWarps * gridDim.y) {
        if (h < p.heads_q) {
            head_norm_rope(p.q + row * p.q_stride + (int64_t)h * D, p.q_out + (row * p.heads_q + h) * D, p.q_norm,
                           p.eps, table, D, p.rope_dim, lane);
        } else if (dst >= 0 && h < p.heads_q + p.heads_kv) {
            const int hk = h - p.heads_q;
            head_norm_rope(p.k + row * p.k_stride + (int64_t)hk * D, p.k_pages + (dst * p.heads_kv + hk) * D,
                           p.k_norm, p.eps, table, D, p.rope_dim, lane);
        } else if (dst >= 0) {
            const int hv = h - p.heads_q - p.heads_kv;
            const float *src = p.v + row * p.v_stride + (int64_t)hv * D;
            float *out = p.v_pages + (dst * p.heads_kv + hv) * D;
            for (int d = lane; d < D; d += WARP_SIZE) out[d] = src[d];
        }
    }
}

}  // namespace

extern "C" int luce_rope_kv(const luce_rope_kv_params *p, void *stream) {
    const bool sectioned = p->sections[0] || p->sections[1] || p->sections[2] || p->sections[3];
    if (p->rows < 0 || p->rows > 0x7fffffff || p->heads_q <= 0 || p->heads_kv <= 0 || p->head_dim <= 0 ||
        p->head_dim > rms::kWarpRowMaxCols || p->rope_dim <= 0 || p->rope_dim % 2 || p->rope_dim > p->head_dim ||
        p->sections[0] < 0 || p->sections[1] < 0 || p->sections[2] < 0 || p->sections[3] < 0 ||
        !(p->n_pos == 1 || (p->n_pos == 4 && sectioned)) || !(p->theta > 0.0f) || !p->q || !p->k || !p->v ||
        !p->q_out || !p->k_pages || !p->v_pages || !p->kv_dst || !p->positions)
        return (int)cudaErrorInvalidValue;
    if (p->rows == 0) return 0;
    const size_t shmem = (size_t)p->rope_dim * sizeof(float);
    const unsigned groups = (unsigned)((p->heads_q + 2 * p->heads_kv + kWarps - 1) / kWarps);
    return luce_status(launch_overlapped(rope_kv_kernel, dim3((unsigned)p->rows, groups), dim3(kThreads), shmem,
                                         (cudaStream_t)stream, chain_overlap(kPdlRope), *p));
}
