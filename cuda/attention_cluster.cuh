// The cluster form of the partition kernel's merge (cuda/attention.cu, LUCE_ATTN_DECODE): a
// launch without prompt or tree rows whose chunk grid is 2..kMaxCluster runs its (row, head
// group) blocks of chunks 0..Z-1 as one thread block cluster (sm_90 and up), and the blocks
// merge the row's partials through distributed shared memory instead of the workspace: each
// block keeps its partial o [G][D] and (m, l) [G] in its own shared memory, one cluster
// barrier, then block b merges outputs b * kThreads + tid, ... reading the chunks' partials
// from their blocks (one round trip), and a second barrier keeps every block's shared memory
// alive until all have read it. That replaces, for the chain form's last block: the partial's
// write, the fence, the atomic count and the merge's two workspace reads. Every block of the
// cluster reaches both barriers (blocks past the row's keys and padding rows too). The
// merge is combine_heads' arithmetic for a row of chunks (merge_chunks below), so the output
// is bitwise the chain form's. The host emulator (tests/kernels/emu, LUCE_EMU) runs a
// cluster's blocks as one set of fibers; HIP and devices before sm_90 keep the chain form.
#pragma once

#include <cstdlib>
#include <cstring>

#include "attention_common.cuh"
#include "pdl.cuh"

#if !defined(LUCE_EMU) && !defined(__HIPCC__)
#include <cooperative_groups.h>
#endif

namespace luce_attn {

constexpr int kMaxCluster = 16;  // a row's chunks at most (kRowChunks); above 8 non-portable

__device__ __forceinline__ void cluster_sync() {
#if defined(LUCE_EMU)
    emu::cluster_barrier();
#elif !defined(__HIPCC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#endif
}

// p in this block's shared memory -> the same offset in the shared memory of cluster block rank.
template <class T>
__device__ __forceinline__ const T *cluster_map(const T *p, unsigned rank) {
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

// Row `row`, query heads h0..h0+G-1 of a row of `keys` keys, this block being chunk `chunk` of
// a cluster of Z: o [G][D] (this block's partial, or anything where it has no keys), m [G],
// l [G] at the same shared-memory offsets in every block. Writes out [G][D] (keys <= 0: zeros,
// padding rows keys < 0: nothing) as combine_heads would from the workspace.
__device__ __forceinline__ void cluster_merge(const luce_attention_params &p, int32_t row, int32_t h0, int G,
                                              int32_t keys, int32_t cmin, const float *o_s, const float *m_s,
                                              const float *l_s, int chunk, int Z, int tid, int nthreads) {
    cluster_sync();  // every block's partial is in its shared memory
    const int D = p.head_dim;
    float *out = p.out + ((int64_t)row * p.n_heads_q + h0) * D;
    const int32_t used = keys > 0 ? chunk_count(keys, cmin) : 0;
    for (int i = chunk * nthreads + tid; keys >= 0 && i < G * D; i += Z * nthreads) {
        if (used == 0 || used > Z) {  // a row without keys: zeros; more chunks than blocks: NaN
            out[i] = used == 0 ? 0.0f : __int_as_float(0x7fc00000);
            continue;
        }
        const int g = i / D;
        float mv[kMaxCluster], lv[kMaxCluster], ov[kMaxCluster];
#pragma unroll
        for (int e = 0; e < kMaxCluster; ++e) {
            if (e >= used) break;
            mv[e] = cluster_map(m_s, e)[g];
            lv[e] = cluster_map(l_s, e)[g];
            ov[e] = cluster_map(o_s, e)[i];
        }
        // combine_heads' order: m over the entries in order, then l and o folded in order
        float m = -INFINITY, l = 0.0f, o = 0.0f;
#pragma unroll
        for (int e = 0; e < kMaxCluster; ++e) {
            if (e >= used) break;
            m = fmaxf(m, mv[e]);
        }
#pragma unroll
        for (int e = 0; e < kMaxCluster; ++e) {
            if (e >= used) break;
            const float w = expf(mv[e] - m);
            l = fmaf(lv[e], w, l);
            o = fmaf(ov[e], w, o);
        }
        out[i] = o / l;
    }
    cluster_sync();  // no block leaves (its shared memory) before the others have read it
}

}  // namespace luce_attn

namespace {

// The form when LUCE_ATTN_DECODE names neither (cluster: this form, chain: the workspace merge).
// H200, one decode row (tools/bench.py attention_decode_*): 1.5B 160 keys 5.1 us against the
// chain's 7.9, 1,024 keys 7.0 against 11.5; 0.5B 4.7 against 6.9, 6.6 against 9.7.
constexpr bool kDecodeCluster = true;

#if defined(__HIPCC__)
inline bool decode_cluster_form() { return false; }  // no clusters: the chain form
#else
// LUCE_ATTN_DECODE (read by each launch, for A/B runs), on a device that launches clusters.
inline bool decode_cluster_form() {
    const char *e = getenv("LUCE_ATTN_DECODE");
    const bool want = e && strcmp(e, "cluster") == 0 ? true : e && strcmp(e, "chain") == 0 ? false : kDecodeCluster;
#if defined(LUCE_EMU)
    return want;
#else
    static const bool device = [] {
        int d = 0, v = 0;
        return cudaGetDevice(&d) == cudaSuccess && cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, d) == cudaSuccess &&
               v != 0;
    }();
    return want && device;
#endif
}

#if defined(LUCE_EMU)
template <auto KERNEL>
bool cluster_fits(unsigned, size_t) { return true; }
#else
// The launch attribute of clusters of cz blocks along z.
inline cudaLaunchAttribute cluster_along_z(unsigned cz) {
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = 1;
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = cz;
    return a;
}

// Whether clusters of cz blocks of KERNEL (kThreads threads, smem bytes) fit the device (asked
// once per kernel and size; above 8 blocks the kernel first allows non-portable sizes).
template <auto KERNEL>
bool cluster_fits(unsigned cz, size_t smem) {
    static signed char fits[luce_attn::kMaxCluster + 1] = {};  // 0: not asked yet, 1: yes, -1: no
    if (cz > (unsigned)luce_attn::kMaxCluster) return false;
    if (fits[cz] == 0) {
        if (cz > 8) cudaFuncSetAttribute(KERNEL, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1, 1, cz);
        cfg.blockDim = dim3(luce_attn::kThreads);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute a[1] = {cluster_along_z(cz)};
        cfg.attrs = a;
        cfg.numAttrs = 1;
        int n = 0;
        fits[cz] = cudaOccupancyMaxActiveClusters(&n, KERNEL, &cfg) == cudaSuccess && n > 0 ? 1 : -1;
        cudaGetLastError();  // a refusal is an answer, not the next launch's error
    }
    return fits[cz] > 0;
}

// A launch in clusters of cz blocks along z (grid.z a multiple of cz), with the programmatic
// overlap of launch_overlapped (cuda/pdl.cuh) where asked.
template <typename... KArgs, typename... Args>
cudaError_t launch_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             bool overlap, unsigned cz, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2] = {cluster_along_z(cz)};
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = overlap && overlap_allowed() ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
#endif
#endif

}  // namespace
