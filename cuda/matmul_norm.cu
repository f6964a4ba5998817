// luce_matmul_add_rmsnorm (ABI: cuda/luce_ops_weights.h; reference: luce/ref/norm_quant.py
// matmul_add_rmsnorm): a projection, then the add + RMSNorm + quantization of its output. One
// launch where the matmul's one-row kernel runs the norm as its tail (cuda/matmul_gemv_tail.cuh),
// else luce_matmul then luce_add_rmsnorm (cuda/norm_quant.cu): the same bits either way.
#include "matmul_gemv_tail.cuh"

namespace {

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

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
    mm::NormTail tail{};
    if (fits) {
        tail.r = rms::Row{p->y, norm->weight, norm->out, norm->cols, norm->eps, norm->residual, norm->sum};
        tail.l = mm::x_layout(norm->workspace, 1, norm->cols);
        tail.counter = counter;
    }
    bool tail_done;
    const int err = mm::matmul_with_tail(p, tail, &tail_done, (cudaStream_t)stream);
    return err || tail_done ? err : luce_add_rmsnorm(norm, stream);
}
