// Thread block clusters along z (sm_90 and up): the blocks of one cluster run at once and read
// each other's shared memory. Users: the decode attention's merge (attention_cluster.cuh) and the
// wide-token tile kernel's k parts (matmul_rows.cuh). The host emulator (tests/kernels/emu,
// LUCE_EMU) runs a cluster's blocks as one set of fibers; HIP and devices before sm_90 launch no
// clusters (cluster::launches() is false: the callers take their one-block forms, same bits).
#pragma once

#include "pdl.cuh"

#if !defined(LUCE_EMU) && !defined(__HIPCC__)
#include <cooperative_groups.h>
#endif

namespace cluster {

constexpr unsigned kMax = 16;  // blocks a cluster at most; above 8 non-portable

// Every thread of every block of the cluster arrives; shared-memory writes before it are seen
// by every block after it.
__device__ __forceinline__ void sync() {
#if defined(LUCE_EMU)
    emu::cluster_barrier();
#elif !defined(__HIPCC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#endif
}

// p in this block's shared memory -> the same offset in the shared memory of cluster block rank.
template <class T>
__device__ __forceinline__ const T *map(const T *p, unsigned rank) {
#if defined(LUCE_EMU)
    return reinterpret_cast<const T *>(reinterpret_cast<const unsigned char *>(p) +
                                       ((ptrdiff_t)rank - (ptrdiff_t)emu::cluster_rank()) * (ptrdiff_t)emu::smem_stride);
#elif !defined(__HIPCC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(const_cast<T *>(p), rank);
#else
    (void)rank;
    return p;
#endif
}

#if defined(__HIPCC__)
inline bool launches() { return false; }
#elif defined(LUCE_EMU)
inline bool launches() { return true; }
template <auto KERNEL>
bool fits(unsigned, unsigned, size_t) { return true; }
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap,
                   unsigned cz, Args... args) {
    return launch_clustered(kernel, grid, block, smem, stream, overlap, cz, args...);  // tests/kernels/emu
}
#else
// Whether this device launches clusters (sm_90 and up).
inline bool launches() {
    static const bool device = [] {
        int d = 0, v = 0;
        return cudaGetDevice(&d) == cudaSuccess && cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, d) == cudaSuccess &&
               v != 0;
    }();
    return device;
}

// The launch attribute of clusters of cz blocks along z.
inline cudaLaunchAttribute along_z(unsigned cz) {
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = 1;
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = cz;
    return a;
}

// Whether clusters of cz blocks of KERNEL (threads a block, smem bytes) fit the device (asked
// once per kernel and size; above 8 blocks the kernel first allows non-portable sizes).
template <auto KERNEL>
bool fits(unsigned cz, unsigned threads, size_t smem) {
    static signed char fit[kMax + 1] = {};  // 0: not asked yet, 1: yes, -1: no
    if (cz > kMax) return false;
    if (fit[cz] == 0) {
        if (cz > 8) cudaFuncSetAttribute(KERNEL, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1, 1, cz);
        cfg.blockDim = dim3(threads);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute a[1] = {along_z(cz)};
        cfg.attrs = a;
        cfg.numAttrs = 1;
        int n = 0;
        fit[cz] = cudaOccupancyMaxActiveClusters(&n, KERNEL, &cfg) == cudaSuccess && n > 0 ? 1 : -1;
        cudaGetLastError();  // a refusal is an answer, not the next launch's error
    }
    return fit[cz] > 0;
}

// A launch in clusters of cz blocks along z (grid.z a multiple of cz), with the programmatic
// overlap of launch_overlapped (cuda/pdl.cuh) where asked.
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap,
                   unsigned cz, Args... args) {
    const cudaLaunchAttribute clusters = along_z(cz);
    return launch_ex(kernel, grid, block, smem, stream, overlap, &clusters, args...);
}
#endif

}  // namespace cluster
