// Programmatic dependent launch (Hopper and later): a kernel launched with launch_overlapped
// may be scheduled while the kernel ahead of it in the stream is still running, so its start
// (block launch, address set-up, loads of data no earlier kernel writes, such as weights)
// hides behind that kernel's tail instead of following it. Before it touches anything an
// earlier kernel writes or reads (activations, its own output), it calls
// wait_for_prior_kernels(), which returns once every earlier kernel in the stream has finished
// and its writes are visible. let_dependents_start() in a kernel lets such a dependent be
// scheduled before this kernel ends. On older GPUs, on HIP and for a kernel launched plainly,
// the calls do nothing and the launch is an ordinary one: results never depend on it.
#pragma once

#include <cstdlib>
#include <cstring>

#include "common.cuh"

__device__ __forceinline__ void wait_for_prior_kernels() {
#if !defined(__HIPCC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void let_dependents_start() {
#if !defined(__HIPCC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The decode chain's launches by kind (LUCE_PDL below).
enum PdlKind { kPdlNorm = 1, kPdlSwiglu = 2, kPdlQuant = 4, kPdlRope = 8, kPdlAttn = 16, kPdlGdn = 32 };

#if defined(__CUDACC__) || defined(__HIPCC__)  // (not in the host emulator: it launches plainly)
// LUCE_PDL: unset, the matmuls overlap the kernel ahead (measured on the H200); "chain", the
// rest of the decode chain too (every kind above); a comma list of kinds, those only (A/B runs:
// "norm,attn"); "0", no kernel (a check that no result depends on the overlap).
inline int pdl_chain_kinds(const char *e) {
    if (!e) return 0;
    if (strcmp(e, "chain") == 0) return 63;
    static const struct { const char *name; int kind; } names[] = {
        {"norm", kPdlNorm}, {"swiglu", kPdlSwiglu}, {"quant", kPdlQuant}, {"rope", kPdlRope}, {"attn", kPdlAttn},
        {"gdn", kPdlGdn}};
    int kinds = 0;
    for (const auto &n : names) {
        const char *at = strstr(e, n.name);
        const size_t len = strlen(n.name);
        if (at && (at == e || at[-1] == ',') && (at[len] == ',' || at[len] == 0)) kinds |= n.kind;
    }
    return kinds;
}
inline int pdl_mode() {  // 0: none, 1: matmuls, 2: matmuls and the chain's kinds of pdl_kinds()
    static const int mode = [] {
        const char *e = getenv("LUCE_PDL");
        return e && e[0] == '0' ? 0 : pdl_chain_kinds(e) ? 2 : 1;
    }();
    return mode;
}
inline int pdl_kinds() {
    static const int kinds = pdl_chain_kinds(getenv("LUCE_PDL"));
    return kinds;
}
inline bool overlap_allowed() { return pdl_mode() >= 1; }
// The `overlap` of a decode-chain launch of this kind.
inline bool chain_overlap(PdlKind kind) { return pdl_mode() >= 2 && (pdl_kinds() & kind); }

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the kernel ahead of it
// when `overlap` is set (CUDA 12+ runtime; the attribute is ignored where unsupported).
template <typename... KArgs, typename... Args>
cudaError_t launch_overlapped(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              bool overlap, Args... args) {
#ifdef __HIPCC__
    (void)overlap;
    kernel<<<grid, block, smem, stream>>>(args...);
    return cudaGetLastError();
#else
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = overlap && overlap_allowed() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
#endif
}
#endif
