// Which one-row decode calls of luce_matmul (cuda/matmul.cu) take the one-row kernel
// (matmul_gemv.cuh; IQ4_XS its staged form, matmul_gemv_staged.cuh), and its launch: x from the
// workspace quantize_x_kernel wrote, or (LUCE_MATMUL_X_ONCE) quantized in lane by the kernel
// itself (matmul_gemv_x.cuh), the same bits either way.
#pragma once

#include <stdlib.h>
#include <string.h>

#include "matmul_gemv.cuh"
#include "matmul_gemv_staged.cuh"

namespace mm {

// The one-row kernel of type G can run: the weights sit as its loads need and its shared
// memory fits (otherwise the tile kernel runs).
template <class G>
bool gemv_runs(const uint8_t *w, const XLayout &x, bool deep) {
    return reinterpret_cast<uintptr_t>(w) % G::kAlign == 0 && gemv_fits<G>(x, deep);
}

// Q4_K, Q5_K and Q6_K one-row calls at tune 0 that the register form does not take (the tile
// kernel before: Q4_K / Q5_K past 64 chunks, the 27B's down projections at k = 17,408; Q6_K from 16
// MiB): the staged form (StagedK45 for Q4_K / Q5_K, StagedKQuant for Q6_K; 4 rows a batch) where it
// runs and the matrix is under 256 MiB (not an LM head). H100, 27B shapes, us, staged / tile
// kernel: Q4_K down 23.6 / 29.5, Q5_K down 27.7 / 34.8 (session 38); Q6_K gate 31.3 / 33.8, down
// 31.7 / 36.9, q|k|v 20.5 / 22.9, out 14.8 / 16.9. Not where the register form runs: StagedK45
// there, us, staged / register: Q4_K gate 22.8 / 22.3, out 11.8 / 11.0, q|k|v 15.3 / 15.3; Q5_K
// gate 25.6 / 28.2, q|k|v 16.8 / 18.5, out 12.2 / 12.9; the Coder-1.5B's Q4_K shapes 4-7% slower;
// and in steps (LUCE_GEMV_STAGED_K=2, session 38): the Coder-1.5B 1.46 against 1.28 ms, the 27B
// IQ4_XS mix (Q5_K q|k|v) 8.08 against 8.08. Tune 8 takes the staged form for Q4_K, Q5_K and Q6_K
// where it runs (comparisons, tests), tunes 5 / 6 the register form. LUCE_GEMV_STAGED_K (read
// once): 0 tune 0 as before the staged K forms (A/B runs), 2 also Q4_K / Q5_K in place of the
// register form.
constexpr int kStagedKByDefault = 1;

inline int staged_k_mode() {
    static const int mode = [] {
        const char *v = getenv("LUCE_GEMV_STAGED_K");
        return v && v[0] ? atoi(v) : kStagedKByDefault;
    }();
    return mode;
}

inline int staged_smem_limit() {
    static const int limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    return limit;
}

// A call's one-row kernel: whether it runs, with twice the rows a batch (`deep`, the register
// form), whether it can quantize x in lane (gemv_x_in_lane; the staged forms always can), and
// whether a K-quant call takes the staged form (`staged`).
struct OneRow {
    bool runs, deep, x_in_lane, staged;
};

// Q8_0 and Q5_0 (f16 scale per group) one-row calls take the one-row kernel under tune 0. H100,
// 27B shapes, x quantized by the call, us, one-row / tile kernel (tune 4), docs/PERF.md session 46:
// Q8_0 gate 40.6 / 44.6, q|k|v 25.9 / 30.0, out 18.7 / 25.8, down 40.0 / 73.3 (two chunk slots:
// GroupFloatC's four-chunk chain); Q5_0 34.8 / 41.3, 23.4 / 26.9, 14.9 / 24.2, 44.1 / 67.1. false
// gives them the tile kernel again (tune 5 / 6 still force the one-row kernel).
constexpr bool kGemvGroupScaleByDefault = true;

// The staged form's arguments for a one-row call (its warps and stages set at launch).
inline GemvStagedArgs staged_args(const GemvArgs &g) { return {g.w, g.bias, g.y, g.x, g.n, g.row_bytes, 0, 0, g.xf}; }

// IQ4_XS one-row calls: the staged form (matmul_gemv_staged.cuh) where it runs, else the register
// form. Tune 0 and 5: 4 rows a batch, the split table lookup; 6: 8 rows a batch; 8: 4 rows with
// the three-prmt lookup (iq4_pairs); 7 takes the register form (gemv2's kernel, for comparison).
inline int launch_gemv_iq4(const GemvArgs &g, int tune, cudaStream_t stream) {
    const int smem_limit = staged_smem_limit();
    const GemvStagedArgs s = staged_args(g);
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

// The one-row kernel (matmul_gemv.cuh, the same bits) where it measured faster than the
// tile kernel (tune 0; H200, docs/PERF.md, 2026-12-03): IQ4_XS everywhere; Q4_K and Q5_K with
// twice the rows a batch where k fits one block of lanes (not the 27B down projection) and the
// matrix is under 256 MiB (not the 27B LM head); Q6_K under 16 MiB (the small models' v and
// down: 1536 x 8960 12.2 against 14.2 us; not their gate|up or LM head); Q8_0 and Q5_0 by
// kGemvGroupScaleByDefault. Tune 5 takes it for every block type, tune 6 likewise with twice
// the rows a batch; IQ4_XS in its staged form (launch_gemv_iq4: tunes 7 and 8 are its
// comparisons); Q4_K, Q5_K and Q6_K at tune 0 in their staged form where the register form does
// not run and the staged one does (staged_k_mode), at tune 8 where it does; never for
// luce_matmul_pair (`staged_ok` false). `tune` as luce_matmul passes it (9 and 10 as 0).
inline OneRow one_row_choice(const luce_matmul_params *p, const uint8_t *w, const XLayout &xl, int64_t row_bytes,
                             int tune, bool staged_ok = true) {
    const bool kquant45 = p->qtype == LUCE_QT_Q4_K || p->qtype == LUCE_QT_Q5_K;
    const bool group_scale = p->qtype == LUCE_QT_Q8_0 || p->qtype == LUCE_QT_Q5_0;
    const bool measured_faster = p->qtype == LUCE_QT_IQ4_XS ||
                                 (kquant45 && gemv_slots(xl.chunks) == 1 && p->n * row_bytes < ((int64_t)256 << 20)) ||
                                 (p->qtype == LUCE_QT_Q6_K && p->n * row_bytes < ((int64_t)16 << 20));
    const bool by_default = measured_faster || (group_scale && kGemvGroupScaleByDefault);
    const bool deep = tune == 6 || (tune == 0 && kquant45);
    const bool gemv = p->rows == 1 && p->path == LUCE_MATMUL_DECODE && gemv_slots(xl.chunks) > 0 &&
                      (tune >= 5 || (tune == 0 && by_default));
    auto of = [&](auto reader) -> OneRow {
        using G = decltype(reader);
        return {gemv_runs<G>(w, xl, deep), deep, gemv_x_in_lane<G>(deep), false};
    };
    OneRow reg{false, deep, false, false};
    if (gemv) {
        switch (p->qtype) {
            case LUCE_QT_Q4_K: reg = of(GemvQ4K()); break;
            case LUCE_QT_Q5_K: reg = of(GemvQ5K()); break;
            case LUCE_QT_Q6_K: reg = of(GemvQ6K()); break;
            case LUCE_QT_IQ4_XS: reg = of(GemvIQ4XS()); break;
            case LUCE_QT_Q8_0: reg = of(GemvQ80()); break;
            case LUCE_QT_Q5_0: reg = of(GemvQ50()); break;
            default: break;
        }
    }
    const bool by_tune = tune == 8 && (kquant45 || p->qtype == LUCE_QT_Q6_K);
    const bool under_256m = p->n * row_bytes < ((int64_t)256 << 20);
    const bool in_place_of_tile = tune == 0 && !reg.runs && (kquant45 || p->qtype == LUCE_QT_Q6_K) &&
                                  staged_k_mode() >= 1 && under_256m;
    const bool in_place_of_reg = tune == 0 && kquant45 && staged_k_mode() == 2 && under_256m;
    if (staged_ok && (by_tune || in_place_of_tile || in_place_of_reg) && p->rows == 1 &&
        p->path == LUCE_MATMUL_DECODE && gemv_staged_runs<4>(w, p->n, xl, row_bytes, staged_smem_limit()))
        return {true, deep, true, true};
    return reg;
}

// The launch of a call one_row_choice runs (`how`); xf: token 0's f32 x to quantize in lane, or
// null (the workspace xl holds it).
inline int launch_one_row(const luce_matmul_params *p, const uint8_t *w, const XLayout &xl, int64_t row_bytes,
                          int tune, const OneRow &how, const float *xf, cudaStream_t stream) {
    const GemvArgs g{w, w + p->n * row_bytes, p->bias, p->y, xl, p->n, row_bytes, 0, xf};
    const bool deep = how.deep;
    if (how.staged) {
        const GemvStagedArgs s = staged_args(g);
        if (p->qtype == LUCE_QT_Q4_K) return launch_gemv_staged<StagedK45<false>, 4>(s, stream);
        if (p->qtype == LUCE_QT_Q5_K) return launch_gemv_staged<StagedK45<true>, 4>(s, stream);
        return launch_gemv_staged<StagedKQuant<GemvQ6K>, 4>(s, stream);
    }
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
