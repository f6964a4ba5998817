// Decode-path kernel choices of cuda/matmul.cu besides the tile kernel's launch shapes: the tunes,
// the default switches of kernels not yet measured, the IQ4_XS one-row forms (launch_gemv_iq4) and
// the IQ4_XS few-row forms (launch_gemv_rows_iq4). Every choice computes the same bits.
#pragma once

#include <stdlib.h>

#include "matmul_gemv.cuh"
#include "matmul_gemv_staged.cuh"
#include "matmul_gemv_rows.cuh"
#include "matmul_gemv_rows_k.cuh"

// Internal linkage, as the rest of cuda/matmul.cu (its one includer): the emulator's tests load several
// builds into one process, and statics of inline functions (the cached device limits) would be shared.
namespace {

using namespace mm;

// An attribute of the current device, 0 if unknown.
inline int device_attribute(cudaDeviceAttr attr) {
    int device = 0, value = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) return 0;
    return value;
}

inline int device_sms() {
    static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
    return sms;
}

// Q8_0 and Q5_0 (f16 scale per group) one-row calls take the one-row kernel under tune 0.
// NOT measured on a GPU yet (written for Qwen2.5-0.5B's decode, whose q/k/v/out/gate/up are
// Q5_0 and Q8_0 at k = 896): false gives them the tile kernel again (tune 5 / 6 still force it).
constexpr bool kGemvGroupScaleByDefault = true;

// IQ4_XS decode calls of 2..8 rows take the few-row kernel (matmul_gemv_rows.cuh) under tune 0 where
// it runs (k <= 6,144, an even chunk count, 227 KB devices). NOT measured on a GPU yet: false gives
// them the tile kernel again. Tune 9: as tune 0 with the few-row kernel whatever kGemvRowsByDefault;
// tune 10: as tune 0 with the tile kernel at 2..8 rows (LUCE_MATMUL_TUNE=10: a whole-step A/B).
constexpr bool kGemvRowsByDefault = true;

// The few-row kernel's large-k form (matmul_gemv_rows_k.cuh: k > 6,144 in slices, the 27B's down
// projection at k = 17,408; even chunk counts, 227 KB devices) under tune 0: NOT measured on a GPU
// yet, so off by default (the tile kernel, as measured); on where kGemvRowsLargeKByDefault is true or
// LUCE_GEMV_ROWS_LARGE_K=1 (read once). Tune 9 takes it whatever these say.
constexpr bool kGemvRowsLargeKByDefault = false;

inline bool gemv_rows_large_k_on() {
    static const bool on = [] {
        const char *v = getenv("LUCE_GEMV_ROWS_LARGE_K");
        return kGemvRowsLargeKByDefault || (v && atoi(v) == 1);
    }();
    return on;
}

constexpr int kMaxTune = 10;

// The tune a tune-0 call takes: LUCE_MATMUL_TUNE (1..kMaxTune) where set, for benchmarks that
// time a launch shape end to end (every tune gives the same bits), else 0.
inline int default_tune() {
    static const int tune = [] {
        const char *v = getenv("LUCE_MATMUL_TUNE");
        const int t = v ? atoi(v) : 0;
        return t >= 1 && t <= kMaxTune ? t : 0;
    }();
    return tune;
}

// IQ4_XS one-row calls: the staged form (matmul_gemv_staged.cuh) where it runs, else the register
// form. Tune 0 and 5: 4 rows a batch, the split table lookup; 6: 8 rows a batch; 8: 4 rows with
// the three-prmt lookup (iq4_pairs); 7 takes the register form (gemv2's kernel, for comparison).
inline int launch_gemv_iq4(const GemvArgs &g, int tune, cudaStream_t stream) {
    static const int smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    const GemvStagedArgs s{g.w, g.bias, g.y, g.x, g.n, g.row_bytes, 0, 0};
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

// IQ4_XS decode calls of 2..8 rows (`tune` as the caller got it: 9 forces the few-row forms, 10 and
// 1..8 the tile kernel): the few-row kernel where it runs (tune 0: kGemvRowsByDefault), else its
// large-k form where that runs (tune 0: gemv_rows_large_k_on). -1 where neither is taken (the tile
// kernel then runs, the same bits).
inline int launch_gemv_rows_iq4(const GemvRowsArgs &a, int tune, cudaStream_t stream) {
    static const int smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    if (tune != 0 && tune != 9) return -1;
    if ((tune == 9 || kGemvRowsByDefault) && gemv_rows_runs(a.w, a.tokens, a.n, a.x, a.row_bytes, smem_limit))
        return launch_gemv_rows(a, smem_limit, stream);
    if ((tune == 9 || gemv_rows_large_k_on()) && gemv_rows_k_runs(a.w, a.tokens, a.n, a.x, smem_limit))
        return launch_gemv_rows_k(a, smem_limit, stream);
    return -1;
}

}  // namespace
