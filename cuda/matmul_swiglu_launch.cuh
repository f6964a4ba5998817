// luce_matmul_swiglu (cuda/luce_ops_weights.h): a decode row's gate | up projection and its SwiGLU
// + quantization in one launch, the one-row kernel with the SwiGLU tail (matmul_gemv_swiglu.cuh),
// bitwise luce_matmul then luce_swiglu_quant; other calls launch nothing (NOT_TAKEN). Part of
// cuda/matmul.cu's translation unit (included at its end: its kernels are instantiated once).
#pragma once

namespace {

template <class G>
int launch_with_tail(const GemvArgs &a, bool deep, cudaStream_t stream) {
    return with_gemv_shape<G>(a.x, deep, [&](auto cpl, auto r) {
        constexpr int C = decltype(cpl)::value, R = decltype(r)::value;
        if constexpr (C != 1)
            return (int)cudaErrorInvalidValue;  // matmul_swiglu_launch takes one chunk slot a lane only
        else
            return launch_gemv_cpl<G, C, R, false, true>(a, stream);
    });
}

int matmul_swiglu_launch(const luce_matmul_params *p, const luce_swiglu_quant_params *s, uint32_t *counts,
                         cudaStream_t stream) {
    const int64_t F = s->cols;
    const bool shapes = p->rows == 1 && s->rows == 1 && p->path == LUCE_MATMUL_DECODE && p->tune == 0 &&
                        default_tune() == 0 && (p->flags & LUCE_MATMUL_REUSE_X) && counts && p->w && p->y &&
                        F > 0 && F % kSwigluTailChunk == 0 && p->n == 2 * F && s->gate == p->y &&
                        s->up == p->y + F && p->qtype != LUCE_QT_IQ4_XS && p->workspace &&
                        p->workspace_bytes >= x_bytes(1, p->k) &&
                        ((reinterpret_cast<uintptr_t>(p->workspace) | reinterpret_cast<uintptr_t>(p->y)) & 15) == 0;
    const int64_t row_bytes = luce_matmul_row_bytes(p->qtype, p->k);
    if (!shapes || row_bytes < 0) return LUCE_MATMUL_SWIGLU_NOT_TAKEN;
    XLayout act{};
    if (produced_x_layout(s->workspace, s->workspace_bytes, s->out, 1, F, &act) != 0)
        return LUCE_MATMUL_SWIGLU_NOT_TAKEN;
    const XLayout xl = x_layout(p->workspace, 1, p->k);
    const uint8_t *w = static_cast<const uint8_t *>(p->w);
    const OneRow one_row = one_row_choice(p, w, xl, row_bytes, 0);
    if (!one_row.runs || gemv_slots(xl.chunks) != 1) return LUCE_MATMUL_SWIGLU_NOT_TAKEN;
    GemvArgs g{w, w + p->n * row_bytes, p->bias, p->y, xl, p->n, row_bytes, 0, nullptr};
    g.tail = SwigluTail{s->out, act, counts, F};
    switch (p->qtype) {
        case LUCE_QT_Q4_K: return launch_with_tail<GemvQ4K>(g, one_row.deep, stream);
        case LUCE_QT_Q5_K: return launch_with_tail<GemvQ5K>(g, one_row.deep, stream);
        case LUCE_QT_Q6_K: return launch_with_tail<GemvQ6K>(g, one_row.deep, stream);
        case LUCE_QT_Q8_0: return launch_with_tail<GemvQ80>(g, one_row.deep, stream);
        case LUCE_QT_Q5_0: return launch_with_tail<GemvQ50>(g, one_row.deep, stream);
        default: return LUCE_MATMUL_SWIGLU_NOT_TAKEN;
    }
}

}  // namespace

extern "C" int luce_matmul_swiglu(const luce_matmul_params *p, const luce_swiglu_quant_params *s, uint32_t *counts,
                                  void *stream) {
    if (!p || !s) return (int)cudaErrorInvalidValue;
    return matmul_swiglu_launch(p, s, counts, (cudaStream_t)stream);
}
