// Fused producers of a quantized matmul's input (references: luce/ref/norm_quant.py):
//   luce_add_rmsnorm:  sum = x + residual (optional); out = rmsnorm(sum or x) * weight
//   luce_swiglu_quant: out = silu(gate) * up
//   luce_gate_quant:   out = o * sigmoid(gate), the gates read in place from the q | gate projection
// each optionally also quantized into a luce_matmul workspace exactly as quantize_x_kernel
// would quantize `out` (cuda/matmul_x.cuh), so luce_matmul with LUCE_MATMUL_REUSE_X then
// gives bitwise the result of luce_matmul on `out`: one launch instead of three (add,
// rmsnorm, quantize_x) or two (swiglu or the gate, then quantize_x).
// The norm is rmsnorm.cuh's (the warp path up to kWarpRowMaxCols columns, else the block
// path, as luce_rmsnorm chooses), the SwiGLU swiglu.cu's element formula, the gate
// pointwise.cu's MUL_SIGMOID: the f32 outputs equal the unfused kernels' bitwise. No
// reduction spans rows: batch-invariant (DESIGN 5).
#include "rmsnorm.cuh"
#include "matmul_x.cuh"
#include "pointwise.cuh"

namespace {

using namespace rms;

constexpr int kWarps = kThreads / WARP_SIZE;

constexpr int kQuantChunks = 2;  // 256-value chunks a block of add_rmsnorm_quant_kernel finishes

// Block (b, c): row b's scale, summed by the threads and in the order norm_row uses (every
// block of the row gets its bits), then chunks c * kQuantChunks .. of the row, a warp each:
// x + residual (stored as sum), out = x * scale * weight (norm_row's formula) and their
// quantization. Rows rows <= b < tp: padding rows of the workspace, zeros quantized.
// A row is several blocks so a one-row decode step is not one SM's work. Rows of up to
// kWarpRowMaxCols columns: a block of kQuantChunks warps, each summing the scale itself (the warp
// path's order) with no barrier; longer rows: kThreads threads sum it (the block path's order).
// The weights load before the kernel ahead ends; x and residual in one round trip (norm_scale).
__global__ void __launch_bounds__(kThreads) add_rmsnorm_quant_kernel(Row r, int64_t rows, mm::XLayout l) {
    __shared__ float scratch[32];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, quad = lane & 3;
    const int64_t row = blockIdx.x, base = row * r.cols;
    const bool live = row < rows, warp_row = r.cols <= kWarpRowMaxCols;
    const int64_t ch = (int64_t)blockIdx.y * kQuantChunks + warp, g = ch * mm::kGroups + (lane >> 2);
    const bool quant = warp < kQuantChunks && ch < l.chunks;  // whole warps
    const bool mine = quant && live && 32 * g < r.cols;
    float w[8];
    if (mine)
#pragma unroll
        for (int half = 0; half < 2; ++half) load_chunk4(r.weight, 8 * g + 4 * half + quad, r.cols, w + 4 * half);
    wait_for_prior_kernels();  // x and residual come from the kernels ahead
    let_dependents_start();    // the matmul may launch; it waits for this kernel before reading x
    float scale = 0.0f;
    if (live && warp_row) {
        if (quant) scale = norm_scale(r, base, lane, WARP_SIZE, false, [](float v) { return warp_sum(v); });
    } else if (live) {
        scale = norm_scale(r, base, threadIdx.x, kThreads, false, [&](float v) { return block_sum(v, scratch); });
    }
    if (!quant) return;
    float v[8] = {};
    if (mine) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int64_t c4 = 8 * g + 4 * half + quad;  // chunk of 4: values 32 g + 16 half + 4 quad ..
            load_input(r, base, c4, true, v + 4 * half);
#pragma unroll
            for (int i = 0; i < 4; ++i) v[4 * half + i] = v[4 * half + i] * scale * w[4 * half + i];
            store_chunk4(r.out + base, c4, r.cols, v + 4 * half);
        }
    }
    mm::quantize_x_values(v, l, row, ch);
}

// One warp per (token, chunk), as quantize_x_kernel: values(t, c, v) gives out's columns c..c+3 of
// token t (c = 32 g + 16 half + 4 quad: lane = 4 g' + quad holds values 4 quad.. and 16 + 4 quad..
// of its group), written to out [rows, cols] in f32 and quantized into l.
template <class Values>
__device__ __forceinline__ void warp_chunk_quant(int64_t rows, int64_t cols, float *out, const mm::XLayout &l,
                                                 Values values) {
    wait_for_prior_kernels();
    let_dependents_start();
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3, j = lane >> 2;
    const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    if (item >= l.tp * l.chunks) return;  // whole warps
    const int64_t t = item / l.chunks, ch = item % l.chunks, g = ch * mm::kGroups + j;
    float v[8] = {};
    if (t < rows && 32 * g < cols) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int64_t c = 32 * g + 16 * half + 4 * quad;
            values(t, c, v + 4 * half);
            store_chunk4(out + t * cols + c, 0, 4, v + 4 * half);
        }
    }
    mm::quantize_x_values(v, l, t, ch);
}

__global__ void __launch_bounds__(kThreads) swiglu_quant_kernel(luce_swiglu_quant_params p, mm::XLayout l) {
    warp_chunk_quant(p.rows, p.cols, p.out, l, [&](int64_t t, int64_t c, float *v) {
        float gv[4], uv[4];
        load_chunk4(p.gate + t * p.gate_stride + c, 0, 4, gv);
        load_chunk4(p.up + t * p.up_stride + c, 0, 4, uv);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = silu_f32(gv[i]) * uv[i];
    });
}

// Column c of token t is o[t, c] times the sigmoid of head h = c / head_dim's gate c - h head_dim
// (a lane's 4 columns lie in one head: head_dim is a multiple of 4).
__global__ void __launch_bounds__(kThreads) gate_quant_kernel(luce_gate_quant_params p, mm::XLayout l) {
    const int64_t cols = p.heads * p.head_dim;
    warp_chunk_quant(p.rows, cols, p.out, l, [&](int64_t t, int64_t c, float *v) {
        const int64_t h = c / p.head_dim;
        float ov[4], gv[4];
        load_chunk4(p.o + t * cols + c, 0, 4, ov);
        load_chunk4(p.qg + t * p.qg_stride + (2 * h + 1) * p.head_dim + (c - h * p.head_dim), 0, 4, gv);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = __fmul_rn(ov[i], (float)unary_op(LUCE_PW_SIGMOID, (double)gv[i]));
    });
}

// The workspace layout for a quantized `out` [rows, cols], or an error: cols must be whole
// 32-value groups, out and workspace 16-byte aligned and the workspace big enough.
int quant_layout(void *workspace, int64_t workspace_bytes, const float *out, int64_t rows, int64_t cols,
                 mm::XLayout *l) {
    if (cols % 32 || !is_aligned16(out) || !is_aligned16(workspace) || workspace_bytes < mm::x_bytes(rows, cols))
        return (int)cudaErrorInvalidValue;
    *l = mm::x_layout(workspace, rows, cols);
    return 0;
}

}  // namespace

extern "C" int luce_add_rmsnorm(const luce_add_rmsnorm_params *p, void *stream) {
    if (p->rows < 0 || p->cols <= 0 || p->rows > 0x7fffffff || !p->x || !p->weight || !p->out ||
        (p->residual && !p->sum))
        return (int)cudaErrorInvalidValue;
    if (p->rows == 0) return 0;
    Row r{p->x, p->weight, p->out, p->cols, p->eps, p->residual, p->sum};
    mm::XLayout l{};
    const bool quant = p->workspace != nullptr;
    if (quant) {
        const int err = quant_layout(p->workspace, p->workspace_bytes, p->out, p->rows, p->cols, &l);
        if (err) return err;
    }
    // every block of a row reads all of x and residual: out and sum must not overwrite them
    const bool aliased = p->out == p->x || p->out == p->residual || (p->sum && (p->sum == p->x || p->sum == p->residual));
    if (quant && aliased) return (int)cudaErrorInvalidValue;
    if (quant) {
        const dim3 grid((unsigned)l.tp, (unsigned)((l.chunks + kQuantChunks - 1) / kQuantChunks));
        const int threads = p->cols <= kWarpRowMaxCols ? kQuantChunks * WARP_SIZE : kThreads;
        return luce_status(launch_overlapped(add_rmsnorm_quant_kernel, grid, dim3(threads), 0, (cudaStream_t)stream,
                                             chain_overlap(kPdlNorm), r, p->rows, l));
    }
    return launch_rmsnorm(r, p->rows, (cudaStream_t)stream);  // rmsnorm.cu's kernels: Row carries the residual
}

extern "C" int luce_swiglu_quant(const luce_swiglu_quant_params *p, void *stream) {
    if (p->rows < 0 || p->cols <= 0 || p->gate_stride < p->cols || p->up_stride < p->cols || !p->gate ||
        !p->up || !p->out || p->rows > 65535LL * 64)
        return (int)cudaErrorInvalidValue;
    if (p->rows == 0) return 0;
    mm::XLayout l{};
    const int err = quant_layout(p->workspace, p->workspace_bytes, p->out, p->rows, p->cols, &l);
    if (err) return err;
    const int64_t warps = l.tp * l.chunks;
    return luce_status(launch_overlapped(swiglu_quant_kernel, dim3((unsigned)((warps + kWarps - 1) / kWarps)),
                                         dim3(kThreads), 0, (cudaStream_t)stream, chain_overlap(kPdlSwiglu), *p, l));
}

extern "C" int luce_gate_quant(const luce_gate_quant_params *p, void *stream) {
    if (p->rows < 0 || p->heads <= 0 || p->head_dim <= 0 || p->head_dim % 4 || !p->o || !p->qg || !p->out ||
        p->qg_stride < 2 * p->heads * p->head_dim || p->rows > 65535LL * 64)
        return (int)cudaErrorInvalidValue;
    if (p->rows == 0) return 0;
    mm::XLayout l{};
    const int err = quant_layout(p->workspace, p->workspace_bytes, p->out, p->rows, p->heads * p->head_dim, &l);
    if (err) return err;
    const int64_t warps = l.tp * l.chunks;
    return luce_status(launch_overlapped(gate_quant_kernel, dim3((unsigned)((warps + kWarps - 1) / kWarps)),
                                         dim3(kThreads), 0, (cudaStream_t)stream, chain_overlap(kPdlQuant), *p, l));
}
