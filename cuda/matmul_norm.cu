// A projection and the fused producer of the next matmul's input on its output (ABI:
// cuda/luce_ops_weights.h; references: luce/ref/norm_quant.py matmul_add_rmsnorm, and
// swiglu_matmul's first half): one launch where the matmul's one-row kernel runs the producer
// as its tail (cuda/matmul_gemv_tail.cuh), else luce_matmul then the producer's own launch
// (cuda/norm_quant.cu): the same bits either way.
//   luce_matmul_add_rmsnorm:   the add + RMSNorm + quantization (luce_add_rmsnorm)
//   luce_matmul_swiglu_quant:  y = gate | up, the SwiGLU + quantization (luce_swiglu_quant)
#include "matmul_gemv_tail.cuh"

namespace {

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// luce_matmul with `tail`, else (not taken) then `producer`.
template <class F>
int with_tail_or(const luce_matmul_params *p, const mm::GemvTail &tail, void *stream, F producer) {
    bool tail_done;
    const int err = mm::matmul_with_tail(p, tail, &tail_done, (cudaStream_t)stream);
    return err || tail_done ? err : producer();
}

}  // namespace

extern "C" int luce_matmul_add_rmsnorm(const luce_matmul_params *p, const luce_add_rmsnorm_params *norm,
                                       int32_t *counter, void *stream) {
    if (!p || !norm || norm->x != p->y || norm->rows != p->rows || norm->cols != p->n)
        return (int)cudaErrorInvalidValue;
    // The tail's conditions are the quantizing norm kernel's (luce_add_rmsnorm refuses the rest).
    const bool distinct = norm->out != p->y && norm->out != norm->residual && norm->sum != p->y &&
                          norm->sum != norm->residual;
    const bool fits = counter && p->rows == 1 && norm->weight && norm->residual && norm->sum && norm->workspace &&
                      distinct && norm->cols % 32 == 0 && aligned16(norm->out) && aligned16(norm->workspace) &&
                      norm->workspace_bytes >= mm::x_bytes(1, norm->cols);
    mm::GemvTail tail{};
    if (fits) {
        tail.norm.r = rms::Row{p->y, norm->weight, norm->out, norm->cols, norm->eps, norm->residual, norm->sum};
        tail.norm.l = mm::x_layout(norm->workspace, 1, norm->cols);
        tail.norm.counter = counter;
    }
    return with_tail_or(p, tail, stream, [&] { return luce_add_rmsnorm(norm, stream); });
}

extern "C" int luce_matmul_swiglu_quant(const luce_matmul_params *p, const luce_swiglu_quant_params *sw,
                                        int32_t *counters, int32_t n_counters, void *stream) {
    if (!p || !sw || sw->rows != p->rows || 2 * sw->cols != p->n || sw->gate != p->y || sw->up != p->y + sw->cols ||
        sw->gate_stride != p->n || sw->up_stride != p->n)
        return (int)cudaErrorInvalidValue;
    // The tail's conditions: the quantizing SwiGLU kernel's, chunks of whole batches (256 | F: a
    // batch's rows lie in one chunk's gate or up rows) and a counter a chunk.
    const int64_t F = sw->cols;
    const bool apart = sw->out + F <= p->y || sw->out >= p->y + p->n;
    const bool fits = counters && p->rows == 1 && F % 256 == 0 && F / 256 <= n_counters && sw->workspace && apart &&
                      aligned16(sw->out) && aligned16(sw->workspace) && sw->workspace_bytes >= mm::x_bytes(1, F);
    mm::GemvTail tail{};
    if (fits) {
        tail.swiglu.p = *sw;
        tail.swiglu.l = mm::x_layout(sw->workspace, 1, F);
        tail.swiglu.counters = counters;
    }
    return with_tail_or(p, tail, stream, [&] { return luce_swiglu_quant(sw, stream); });
}
