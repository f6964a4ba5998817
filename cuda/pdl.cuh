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

#if defined(__CUDACC__) || defined(__HIPCC__)  // (not in the host emulator: it launches plainly)
// LUCE_PDL: unset, the matmuls overlap the kernel ahead (measured on the H200); "chain", the
// rest of the decode chain too (rope_kv, the fused norms and SwiGLU, quantize_x, the GDN decode
// pair: written for it, not yet measured on a GPU); "0", no kernel (a check that no result
// depends on the overlap).
inline int pdl_mode() {
    static const int mode = [] {
        const char *e = getenv("LUCE_PDL");
        return e && e[0] == '0' ? 0 : e && strcmp(e, "chain") == 0 ? 2 : 1;
    }();
    return mode;
}
inline bool overlap_allowed() { return pdl_mode() >= 1; }
inline bool chain_overlap() { return pdl_mode() >= 2; }  // the `overlap` of the decode chain's launches

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
