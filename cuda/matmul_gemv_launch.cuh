// Which one-row decode calls of luce_matmul (cuda/matmul.cu) take the one-row kernel
// (matmul_gemv.cuh; IQ4_XS its staged form, matmul_gemv_staged.cuh), and its launch: x from the
// workspace quantize_x_kernel wrote, or (LUCE_MATMUL_X_ONCE) quantized in lane by the kernel
// itself (matmul_gemv_x.cuh), the same bits either way.
#pragma once

#include "matmul_gemv.cuh"
#include "matmul_gemv_staged.cuh"

namespace mm {

// An attribute of the current device, 0 if unknown.
inline int device_attribute(cudaDeviceAttr attr) {
    int device = 0, value = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) return 0;
    return value;
}

// The one-row kernel of type G can run: the weights sit as its loads need and its shared
// memory fits (otherwise the tile kernel runs).
template <class G>
bool gemv_runs(const uint8_t *w, const XLayout &x, bool deep) {
    return reinterpret_cast<uintptr_t>(w) % G::kAlign == 0 && gemv_fits<G>(x, deep);
}

// Q8_0 and Q5_0 (f16 scale per group) one-row calls take the one-row kernel under tune 0.
// NOT measured on a GPU yet (written for Qwen2.5-0.5B's decode, whose q/k/v/out/gate/up are
// Q5_0 and Q8_0 at k = 896): false gives them the tile kernel again (tune 5 / 6 still force it).
constexpr bool kGemvGroupScaleByDefault = true;

// IQ4_XS one-row calls: the staged form (matmul_gemv_staged.cuh) where it runs, else the register
// form. Tune 0 and 5: 4 rows a batch, the split table lookup; 6: 8 rows a batch; 8: 4 rows with
// the three-prmt lookup (iq4_pairs); 7 takes the register form (gemv2's kernel, for comparison).
inline int launch_gemv_iq4(const GemvArgs &g, int tune, cudaStream_t stream) {
    static const int smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    const GemvStagedArgs s{g.w, g.bias, g.y, g.x, g.n, g.row_bytes, 0, 0, g.xf};
    if (tune == 6) {
        if (gemv_staged_runs<8>(g.w, g.n, g.x, g.row_bytes, smem_limit))
            return launch_gemv_staged<StagedIQ4XS<true>, 8>(s, stream);
    } else if (tune == 8) {
        if (gemv_staged_runs<4>(g.w, g.n, g.x, g.row_bytes, smem_limit))
            return launch_gemv_staged<StagedIQ4XS<false>, 4>(s, stream);
    } else if (tune != 7) {
        if (gemv_staged_runs<4>(g.w, g.n, g.x, g.row_bytes, smem_limit))
            return launch_gemv_staged<StagedIQ4XS<true>, 4>(s, stream);
    }
    return launch_gemv<GemvIQ4XS>(g, tune == 6, stream);
}

// A call's one-row kernel: whether it runs, with twice the rows a batch (`deep`), and whether it
// can quantize x in lane (gemv_x_in_lane; the staged IQ4_XS form always can).
struct OneRow {
    bool runs, deep, x_in_lane;
};

// The one-row kernel (matmul_gemv.cuh, the same bits) where it measured faster than the
// tile kernel (tune 0; H200, docs/PERF.md, 2026-12-03): IQ4_XS everywhere; Q4_K and Q5_K with
// twice the rows a batch where k fits one block of lanes (not the 27B down projection) and the
// matrix is under 256 MiB (not the 27B LM head); Q6_K under 16 MiB (the small models' v and
// down: 1536 x 8960 12.2 against 14.2 us; not their gate|up or LM head); Q8_0 and Q5_0 by
// kGemvGroupScaleByDefault. Tune 5 takes it for every block type, tune 6 likewise with twice
// the rows a batch; IQ4_XS in its staged form (launch_gemv_iq4: tunes 7 and 8 are its
// comparisons). `tune` as luce_matmul passes it (9 and 10 as 0).
inline OneRow one_row_choice(const luce_matmul_params *p, const uint8_t *w, const XLayout &xl, int64_t row_bytes,
                             int tune) {
    const bool kquant45 = p->qtype == LUCE_QT_Q4_K || p->qtype == LUCE_QT_Q5_K;
    const bool group_scale = p->qtype == LUCE_QT_Q8_0 || p->qtype == LUCE_QT_Q5_0;
    const bool measured_faster = p->qtype == LUCE_QT_IQ4_XS ||
                                 (kquant45 && gemv_slots(xl.chunks) == 1 && p->n * row_bytes < ((int64_t)256 << 20)) ||
                                 (p->qtype == LUCE_QT_Q6_K && p->n * row_bytes < ((int64_t)16 << 20));
    const bool by_default = measured_faster || (group_scale && kGemvGroupScaleByDefault);
    const bool deep = tune == 6 || (tune == 0 && kquant45);
    const bool gemv = p->rows == 1 && p->path == LUCE_MATMUL_DECODE && gemv_slots(xl.chunks) > 0 &&
                      (tune >= 5 || (tune == 0 && by_default));
    if (!gemv) return {false, deep, false};
    auto of = [&](auto reader) -> OneRow {
        using G = decltype(reader);
        return {gemv_runs<G>(w, xl, deep), deep, gemv_x_in_lane<G>(deep)};
    };
    switch (p->qtype) {
        case LUCE_QT_Q4_K: return of(GemvQ4K());
        case LUCE_QT_Q5_K: return of(GemvQ5K());
        case LUCE_QT_Q6_K: return of(GemvQ6K());
        case LUCE_QT_IQ4_XS: return of(GemvIQ4XS());
        case LUCE_QT_Q8_0: return of(GemvQ80());
        case LUCE_QT_Q5_0: return of(GemvQ50());
        default: return {false, deep, false};
    }
}

// The launch of a call one_row_choice runs; xf: token 0's f32 x to quantize in lane, or null
// (the workspace xl holds it).
inline int launch_one_row(const luce_matmul_params *p, const uint8_t *w, const XLayout &xl, int64_t row_bytes,
                          int tune, bool deep, const float *xf, cudaStream_t stream) {
    const GemvArgs g{w, w + p->n * row_bytes, p->bias, p->y, xl, p->n, row_bytes, 0, xf};
    switch (p->qtype) {
        case LUCE_QT_Q4_K: return launch_gemv<GemvQ4K>(g, deep, stream);
        case LUCE_QT_Q5_K: return launch_gemv<GemvQ5K>(g, deep, stream);
        case LUCE_QT_Q6_K: return launch_gemv<GemvQ6K>(g, deep, stream);
        case LUCE_QT_IQ4_XS: return launch_gemv_iq4(g, tune, stream);
        case LUCE_QT_Q8_0: return launch_gemv<GemvQ80>(g, deep, stream);
        case LUCE_QT_Q5_0: return launch_gemv<GemvQ50>(g, deep, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}

}  // namespace mm
