// Pointwise maths of the models (reference: luce/ref/pointwise.py, numpy_backend's maths):
// - binary: out = a + b or a * b in f32 (one rounding, as numpy) with numpy broadcasting
//   over up to LUCE_POINTWISE_MAX_DIMS dims: out shape [d0..d3] (leading dims padded with 1),
//   each operand addressed by element strides (0 on a broadcast dim); b == NULL uses
//   b_scalar. out must not overlap a or b unless it equals one with the same strides.
//   a * sigmoid(b) (MUL_SIGMOID, the gated attention's output gate read in place from the
//   q | gate projection): the unary's sigmoid, then the f32 product, the bits of the two launches.
// - unary: silu, sigmoid, softplus (log(1 + exp(x)), overflow-safe), exp, each computed in
//   double and rounded to f32 once, as the numpy backend does.
// - l2norm: x [rows, cols] -> x / sqrt(sum(x^2) + eps) per row, in double; one warp per
//   row, lanes over strided columns, partial sums combined in a fixed butterfly order, so a
//   row's result never depends on the other rows.
#include "pointwise.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / WARP_SIZE;

__global__ void __launch_bounds__(kThreads) binary_kernel(luce_binary_params p, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (i >= n) return;
    int64_t rest = i, ao = 0, bo = 0;
#pragma unroll
    for (int d = LUCE_POINTWISE_MAX_DIMS - 1; d >= 0; --d) {
        const int64_t c = rest % p.shape[d];
        rest /= p.shape[d];
        ao += c * p.a_strides[d];
        bo += c * p.b_strides[d];
    }
    const float a = p.a[ao];
    const float b = p.b ? p.b[bo] : p.b_scalar;
    p.out[i] = p.op == LUCE_PW_ADD ? __fadd_rn(a, b)
               : __fmul_rn(a, p.op == LUCE_PW_MUL ? b : (float)unary_op(LUCE_PW_SIGMOID, (double)b));
}

__global__ void __launch_bounds__(kThreads) unary_kernel(luce_unary_params p) {
    const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (i >= p.n) return;
    p.out[i] = (float)unary_op(p.op, (double)p.x[i]);
}

__global__ void __launch_bounds__(kThreads) l2norm_kernel(luce_l2norm_params p) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + threadIdx.x / WARP_SIZE;
    if (row >= p.rows) return;
    const float *x = p.x + row * p.cols;
    double sum = 0.0;
    for (int64_t c = lane; c < p.cols; c += WARP_SIZE) sum = l2norm_accumulate(sum, x[c]);
    const double inv = l2norm_inverse(sum, p.eps);
    float *out = p.out + row * p.cols;
    for (int64_t c = lane; c < p.cols; c += WARP_SIZE) out[c] = l2norm_apply(x[c], inv);
}

unsigned blocks_for(int64_t n, int64_t per_block) { return (unsigned)((n + per_block - 1) / per_block); }

}  // namespace

extern "C" int luce_binary(const luce_binary_params *p, void *stream) {
    int64_t n = 1;
    for (int d = 0; d < LUCE_POINTWISE_MAX_DIMS; ++d) {
        if (p->shape[d] < 0) return luce_status(cudaErrorInvalidValue);
        n *= p->shape[d];
    }
    if (p->op < LUCE_PW_ADD || p->op > LUCE_PW_MUL_SIGMOID) return luce_status(cudaErrorInvalidValue);
    if (n == 0) return 0;
    binary_kernel<<<blocks_for(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*p, n);
    return luce_status(cudaGetLastError());
}

extern "C" int luce_unary(const luce_unary_params *p, void *stream) {
    if (p->n < 0 || p->op < LUCE_PW_SILU || p->op > LUCE_PW_EXP) return luce_status(cudaErrorInvalidValue);
    if (p->n == 0) return 0;
    unary_kernel<<<blocks_for(p->n, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*p);
    return luce_status(cudaGetLastError());
}

extern "C" int luce_l2norm(const luce_l2norm_params *p, void *stream) {
    if (p->rows < 0 || p->cols <= 0) return luce_status(cudaErrorInvalidValue);
    if (p->rows == 0) return 0;
    l2norm_kernel<<<blocks_for(p->rows, kRowsPerBlock), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*p);
    return luce_status(cudaGetLastError());
}
