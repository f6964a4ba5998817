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

#include <atomic>
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

// An attribute of the current device, 0 if unknown.
inline int device_attribute(cudaDeviceAttr attr) {
    int device = 0, value = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) return 0;
    return value;
}

// Blocks of `kernel` with `threads` threads and `smem` bytes resident at once on the device (0 if
// unknown): the tile kernels' one-wave grids (cuda/matmul.cu, matmul_gemv*.cuh) and the wide-token
// kernel's cluster size (matmul_rows.cuh) use it.
template <class K>
int resident_blocks(K kernel, int threads, size_t smem) {
    const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
    int per_sm = 0;
    if (sms == 0) return 0;
#ifdef __HIPCC__
    (void)kernel; (void)threads; (void)smem;
    per_sm = 2;
#else
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) return 0;
#endif
    return sms * per_sm;
}

// The decode chain's launches by kind (LUCE_PDL below). kPdlAttn: the decode attention at head
// dims <= 128 (its chunked form); kPdlAttnWide: at 256 (the 27B).
enum PdlKind { kPdlNorm = 1, kPdlSwiglu = 2, kPdlQuant = 4, kPdlRope = 8, kPdlAttn = 16, kPdlGdn = 32,
               kPdlAttnWide = 64, kPdlEvery = 127 };

#if defined(__CUDACC__) || defined(__HIPCC__)  // (not in the host emulator: it launches plainly)
// LUCE_PDL: unset, the matmuls and the decode attention at head dims <= 128 overlap the kernel
// ahead (measured on the H200, docs/PERF.md session 15: Coder-1.5B +7-11%, 0.5B +4%; the other
// kinds cost the 27B 4-5%), or every kind where the library was told its models are small
// (luce_set_decode_overlap; docs/PERF.md session 22); "chain", every kind above
// too; a comma list of kinds, the matmuls and those ("norm,attn"; "matmul": the matmuls alone);
// "0", no kernel (a check that no result depends on the overlap).
inline int pdl_kinds_of(const char *e) {
    if (!e) return kPdlAttn;
    if (strcmp(e, "chain") == 0) return kPdlEvery;
    static const struct { const char *name; int kind; } names[] = {
        {"norm", kPdlNorm}, {"swiglu", kPdlSwiglu}, {"quant", kPdlQuant}, {"rope", kPdlRope}, {"attn", kPdlAttn},
        {"gdn", kPdlGdn}, {"attnwide", kPdlAttnWide}};
    int kinds = 0;
    for (const auto &n : names) {
        const size_t len = strlen(n.name);
        for (const char *at = strstr(e, n.name); at; at = strstr(at + 1, n.name))
            if ((at == e || at[-1] == ',') && (at[len] == ',' || at[len] == 0)) kinds |= n.kind;
    }
    return kinds;
}
// The kinds where LUCE_PDL is unset: kPdlAttn, or kPdlEvery (luce_set_decode_overlap).
inline std::atomic<int> &decode_overlap_kinds() {
    static std::atomic<int> kinds{kPdlAttn};
    return kinds;
}
inline int pdl_kinds() {  // -1: no overlap at all (LUCE_PDL=0), else the chain's kinds beside the matmuls
    static const int from_env = [] {  // -2: LUCE_PDL unset or empty (an empty value is not "no kind")
        const char *e = getenv("LUCE_PDL");
        return !e || !e[0] ? -2 : e[0] == '0' ? -1 : pdl_kinds_of(e);
    }();
    return from_env != -2 ? from_env : decode_overlap_kinds().load(std::memory_order_relaxed);
}
inline bool overlap_allowed() { return pdl_kinds() >= 0; }
// The `overlap` of a decode-chain launch of this kind.
inline bool chain_overlap(PdlKind kind) { return pdl_kinds() > 0 && (pdl_kinds() & kind); }

#ifndef __HIPCC__
// cudaLaunchKernelEx with the launch attribute `extra` (none: nullptr) and, where `overlap` is
// set and allowed, the programmatic overlap with the kernel ahead.
template <typename... KArgs, typename... Args>
cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap,
                      const cudaLaunchAttribute *extra, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (extra) attr[n++] = *extra;
    if (overlap && overlap_allowed()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
#endif

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
    return launch_ex(kernel, grid, block, smem, stream, overlap, nullptr, args...);
#endif
}
#endif
