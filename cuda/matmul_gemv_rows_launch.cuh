// Which decode calls of luce_matmul (cuda/matmul.cu) take the few-row kernel (matmul_gemv_rows.cuh:
// 2..8 rows of IQ4_XS, Q5_K, Q4_K, Q6_K, Q8_0, Q5_0 where it runs; its large-k form, matmul_gemv_rows_k.cuh,
// past 24 chunks (not Q5_0), and for Q8_0 also where the few-row kernel's stages do not fit), and their
// launches.
// Static: their function-local statics (the device's limit, the resident blocks) stay one library's own
// where several libraries of this source share a process (the emulator's builds; inline ones would be
// merged, GNU unique).
#pragma once

#include <cstdlib>
#include <cstring>

#include "matmul_gemv_launch.cuh"
#include "matmul_gemv_rows.cuh"
#include "matmul_gemv_rows_k.cuh"

namespace mm {

// Launch (the caller checked gemv_rows_runs): 3 stages where they fit, else 2; a one-wave grid of
// every resident block, block b taking batches b, b + grid, ...
template <class Q>
static int launch_gemv_rows(GemvRowsArgs a, int smem_limit, cudaStream_t stream) {
    const int threads = (int)a.x.chunks * WARP_SIZE;
    const size_t limit = (size_t)(smem_limit > 0 ? smem_limit : 48 << 10);
    a.stride = gemv_rows_stride(a.row_bytes);
    a.stages = gemv_rows_smem_bytes(a.x, a.row_bytes, 3, gemv_rows_x_bytes<Q>(a.x)) <= limit ? 3 : 2;
    const size_t smem = gemv_rows_smem_bytes(a.x, a.row_bytes, a.stages, gemv_rows_x_bytes<Q>(a.x));
    static size_t smem_set = 48 << 10;  // the kernel's shared-memory limit, raised to the largest launch so far
    static int resident[kRowsMaxChunks + 1][kStagedMaxStages + 1] = {};
    if (smem > smem_set) {
        const cudaError_t err = cudaFuncSetAttribute(gemv_rows_kernel<Q>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        smem_set = smem;
    }
    int &res = resident[a.x.chunks][a.stages];
    if (res == 0) res = resident_blocks(gemv_rows_kernel<Q>, threads, smem);
    const int64_t batches = (a.n + kRowsTile - 1) / kRowsTile;
    const int64_t grid = res > 0 && res < batches ? res : batches;
    return luce_status(launch_overlapped(gemv_rows_kernel<Q>, dim3((unsigned)grid), dim3(threads), smem, stream, true, a));
}

// Launch of the large-k form (the caller checked gemv_rows_k_runs): two c buffers where they fit, else
// one; a one-wave grid of every resident block (one an SM), block b taking batches b, b + grid, ...
template <class Q, bool kSplit = false>
static int launch_gemv_rows_k(GemvRowsKArgs a, int smem_limit, cudaStream_t stream) {
    constexpr int R = gemv_rows_k_stages<Q>();
    auto kernel = gemv_rows_k_kernel<Q, R, kSplit>;
    const int threads = gemv_rows_k_warps(a.x.chunks) * WARP_SIZE;
    const size_t limit = (size_t)(smem_limit > 0 ? smem_limit : 48 << 10);
    a.cbufs = gemv_rows_k_smem_bytes<Q>(a.x.chunks, 2) <= limit ? 2 : 1;
    const size_t smem = gemv_rows_k_smem_bytes<Q>(a.x.chunks, a.cbufs);
    static size_t smem_set = 48 << 10;  // the kernel's shared-memory limit, raised to the largest launch so far
    static int resident = 0, resident_threads = 0;
    static size_t resident_smem = 0;
    if (smem > smem_set) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        smem_set = smem;
    }
    if (resident == 0 || resident_threads != threads || resident_smem != smem) {
        resident = resident_blocks(kernel, threads, smem);
        resident_threads = threads;
        resident_smem = smem;
    }
    const int64_t batches = (a.n + kRowsTile - 1) / kRowsTile;
    const int64_t grid = resident > 0 && resident < batches ? resident : batches;
    return luce_status(launch_overlapped(kernel, dim3((unsigned)grid), dim3(threads), smem, stream, true, a));
}

// Decode calls of 2..8 rows take the few-row kernel (matmul_gemv_rows.cuh) under tune 0 where it runs
// (k <= 6,144, rows of a multiple of 16 bytes, 227 KB devices) for the types marked here; false gives
// a type the tile kernel again. All four measured faster on the H200 at 5 rows (docs/PERF.md, session 17
// call 1: Q5_K qkv 18.7 against 21.4 us, Q6_K LM head 316 against 373; Q4_K out within 2%). Tune 9: as tune 0 with the few-row kernel for every type it takes
// whatever these say; tune 10: as tune 0 with the tile kernel at 2..8 rows (LUCE_MATMUL_TUNE=10: a
// whole-step A/B).
constexpr bool kGemvRowsIQ4XS = true, kGemvRowsQ5K = true, kGemvRowsQ4K = true, kGemvRowsQ6K = true;
// Q8_0 (mmq_chunk_float's steps; both forms, kGemvRowsKQ80 below). H200, docs/PERF.md session 47, us at
// 2 / 5 / 8 rows against the tile kernel: gate 36.8 / 37.2 / 38.8 against 43.8 / 55.2 / 58.7, q|k|v at 5
// 23.4 against 30.8, out (the large-k form) 16.0 / 18.0 / 19.5 against 24.3 / 26.9 / 27.1, down 36.9 /
// 41.4 / 44.9 against 75.3 / 84.2 / 86.4; the 27B Q8_0 step at C5 18.8 -> 12.0 ms.
constexpr bool kGemvRowsQ80 = true;
// Q5_0 (its offset terms through the chain; the few-row kernel only): off. H200, docs/PERF.md session 48,
// us at 5 rows, few-row (tune 9) against the tile kernel (tune 4): 27B gate 55.7 / 44.3, q|k|v 34.2 /
// 25.9, out 24.7 / 24.2; the Coder-0.5B's gate|up (k = 896, its real Q5_0 calls) 9.3 / 6.9, its step at C5
// 4,718 against 5,088 tok/s. Tune 9 and LUCE_MATMUL_ROWS_TYPES=...,q5_0 take it.
constexpr bool kGemvRowsQ50 = false;
// The same for the large-k form (matmul_gemv_rows_k.cuh: k > 6,144, the 27B's down projection at
// 17,408) under tune 0. H200, 27B down 5120 x 17408, us at 2 / 5 / 8 rows, the large-k form (tune 9)
// against the tile kernel (tune 4), helper rowsdown 2026-12-04: IQ4_XS 30.6 / 32.8 / 34.7 against
// 38.1 / 38.5 / 39.2 (one row: 18.3): on; Q4_K 29.3 / 32.9 / 37.4 against 26.8 / 27.6 / 28.7: off;
// Q6_K 35.6 / 39.8 / 41.8 against 37.5 / 39.8 / 41.1 (even at 5 rows): off; Q5_K 38.2 against 32.6 at
// 5 rows: off.
// kGemvRowsKSplitIQ4XS: its IQ4_XS table lookup in the split form (R1 + R2, two mma a product; false:
// iq4_lookup, one mma; 43.8 against 47.2 us at 5 rows in an earlier shape), the same bits either way.
constexpr bool kGemvRowsKIQ4XS = true, kGemvRowsKQ5K = false, kGemvRowsKQ4K = false, kGemvRowsKQ6K = false;
constexpr bool kGemvRowsKQ80 = true;
constexpr bool kGemvRowsKSplitIQ4XS = true;

// LUCE_MATMUL_ROWS_TYPES (e.g. "iq4_xs,q5_k"; "none"): the types taking it under tune 0 instead
// of the switches above, for whole-step A/B runs; read once a process.
static inline int gemv_rows_env_types() {
    static const int mask = [] {
        const char *e = getenv("LUCE_MATMUL_ROWS_TYPES");
        if (!e) return -1;
        int m = 0;
        if (strstr(e, "iq4_xs")) m |= 1;
        if (strstr(e, "q5_k")) m |= 2;
        if (strstr(e, "q4_k")) m |= 4;
        if (strstr(e, "q6_k")) m |= 8;
        if (strstr(e, "q8_0")) m |= 16;
        if (strstr(e, "q5_0")) m |= 32;
        return m;
    }();
    return mask;
}

// Tune 0: the env's types where it is set (either form), else the switches of the form (large_k: the
// large-k form's).
static inline bool gemv_rows_by_default(int qtype, bool large_k) {
    const int env = gemv_rows_env_types();
    if (env >= 0) {
        const int bit = qtype == LUCE_QT_IQ4_XS ? 1 : qtype == LUCE_QT_Q5_K ? 2 : qtype == LUCE_QT_Q4_K ? 4
                        : qtype == LUCE_QT_Q6_K ? 8 : qtype == LUCE_QT_Q8_0 ? 16 : qtype == LUCE_QT_Q5_0 ? 32 : 0;
        return (env & bit) != 0;
    }
    switch (qtype) {
        case LUCE_QT_IQ4_XS: return large_k ? kGemvRowsKIQ4XS : kGemvRowsIQ4XS;
        case LUCE_QT_Q5_K: return large_k ? kGemvRowsKQ5K : kGemvRowsQ5K;
        case LUCE_QT_Q4_K: return large_k ? kGemvRowsKQ4K : kGemvRowsQ4K;
        case LUCE_QT_Q6_K: return large_k ? kGemvRowsKQ6K : kGemvRowsQ6K;
        case LUCE_QT_Q8_0: return large_k ? kGemvRowsKQ80 : kGemvRowsQ80;
        case LUCE_QT_Q5_0: return !large_k && kGemvRowsQ50;
        default: return false;
    }
}

#if !defined(__HIPCC__)  // (try_gemv_rows below: HIP builds instantiate neither form)
// The large-k form for a call of its types where it runs (gemv_rows_k_runs: past 24 chunks; Q8_0 at any
// count of whole chunks); -1 where it does not.
static inline int try_gemv_rows_k(const luce_matmul_params *p, const uint8_t *w, const XLayout &xl,
                                  int64_t row_bytes, int smem_limit, cudaStream_t stream) {
    bool runs = false;
    switch (p->qtype) {
        case LUCE_QT_Q5_K: runs = gemv_rows_k_runs<ReaderQ5K>(p->rows, p->n, xl, smem_limit); break;
        case LUCE_QT_Q4_K: runs = gemv_rows_k_runs<ReaderQ4K>(p->rows, p->n, xl, smem_limit); break;
        case LUCE_QT_Q6_K: runs = gemv_rows_k_runs<ReaderQ6K>(p->rows, p->n, xl, smem_limit); break;
        case LUCE_QT_Q8_0: runs = gemv_rows_k_runs<ReaderQ80>(p->rows, p->n, xl, smem_limit); break;
        case LUCE_QT_IQ4_XS: runs = gemv_rows_k_runs<ReaderIQ4XS>(p->rows, p->n, xl, smem_limit); break;
        default: break;  // Q5_0: no large-k form
    }
    if (!runs) return -1;
    const GemvRowsKArgs a{w, w + p->n * row_bytes, p->bias, p->y, xl, p->n, row_bytes, (int)p->rows, 0};
    switch (p->qtype) {
        case LUCE_QT_Q5_K: return launch_gemv_rows_k<ReaderQ5K>(a, smem_limit, stream);
        case LUCE_QT_Q4_K: return launch_gemv_rows_k<ReaderQ4K>(a, smem_limit, stream);
        case LUCE_QT_Q6_K: return launch_gemv_rows_k<ReaderQ6K>(a, smem_limit, stream);
        case LUCE_QT_Q8_0: return launch_gemv_rows_k<ReaderQ80>(a, smem_limit, stream);
        default: return launch_gemv_rows_k<ReaderIQ4XS, kGemvRowsKSplitIQ4XS>(a, smem_limit, stream);
    }
}

// The few-row kernel for a call of type Q where it runs, else the large-k form where that runs (Q8_0 at
// k = 6,144, where the few-row kernel's stages do not fit); -1 where neither does.
template <class Q>
static int try_gemv_rows_of(const luce_matmul_params *p, const uint8_t *w, const XLayout &xl, int64_t row_bytes,
                            int smem_limit, cudaStream_t stream) {
    if (gemv_rows_runs(w, p->rows, p->n, xl, row_bytes, gemv_rows_x_bytes<Q>(xl), smem_limit))
        return launch_gemv_rows<Q>({w, p->bias, p->y, xl, p->n, row_bytes, (int)p->rows, 0, 0}, smem_limit, stream);
    return try_gemv_rows_k(p, w, xl, row_bytes, smem_limit, stream);
}
#endif

// The few-row kernel (its large-k form past 24 chunks; none for Q5_0) for a 2..8-row decode call of its
// types where it runs; -1 where it does not.
static inline int try_gemv_rows(const luce_matmul_params *p, const uint8_t *w, const XLayout &xl,
                                int64_t row_bytes, cudaStream_t stream) {
#if defined(__HIPCC__)
    // Both forms need ~110-200 KB of shared memory a block (H100 / H200 class); an AMD GPU has 64 KB
    // of LDS, so HIP builds instantiate neither (half of matmul.cu's HIP compile time) and take the
    // tile kernel (tools/build_check.py: NVIDIA_ONLY_HEADERS).
    (void)p, (void)w, (void)xl, (void)row_bytes, (void)stream;
    return -1;
#else
    const bool type = p->qtype == LUCE_QT_IQ4_XS || p->qtype == LUCE_QT_Q5_K || p->qtype == LUCE_QT_Q4_K ||
                      p->qtype == LUCE_QT_Q6_K || p->qtype == LUCE_QT_Q8_0 || p->qtype == LUCE_QT_Q5_0;
    const bool large_k = xl.chunks > kRowsMaxChunks;
    if (!type || p->path != LUCE_MATMUL_DECODE || p->rows < 2 || p->rows > 8 ||
        !(p->tune == 9 || (p->tune == 0 && gemv_rows_by_default(p->qtype, large_k))))
        return -1;
    static const int smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    if (large_k) return try_gemv_rows_k(p, w, xl, row_bytes, smem_limit, stream);
    switch (p->qtype) {
        case LUCE_QT_Q5_K: return try_gemv_rows_of<ReaderQ5K>(p, w, xl, row_bytes, smem_limit, stream);
        case LUCE_QT_Q4_K: return try_gemv_rows_of<ReaderQ4K>(p, w, xl, row_bytes, smem_limit, stream);
        case LUCE_QT_Q6_K: return try_gemv_rows_of<ReaderQ6K>(p, w, xl, row_bytes, smem_limit, stream);
        case LUCE_QT_Q8_0: return try_gemv_rows_of<ReaderQ80>(p, w, xl, row_bytes, smem_limit, stream);
        case LUCE_QT_Q5_0: return try_gemv_rows_of<ReaderQ50>(p, w, xl, row_bytes, smem_limit, stream);
        default: return try_gemv_rows_of<ReaderIQ4XS>(p, w, xl, row_bytes, smem_limit, stream);
    }
#endif
}

}  // namespace mm
