// Host stand-in for the CUDA subset the kernels use (tests/kernels/emu/build.py compiles
// cuda/*.cu against it with g++): blocks run one after another; a block's threads are fibers
// on one host thread (tests/kernels/emu/fibers.cpp), switched at __syncthreads (a block
// barrier) and at each shuffle, which goes through a per-warp exchange (32 lanes) and a warp
// barrier; __shared__ arrays are statics and dynamic shared memory is one buffer filled
// with NaN bytes before each block. It runs the kernels' own arithmetic and indexing, not the
// device's libm: only comparisons between two kernels of this build mean anything.
#pragma once
#define LUCE_EMU 1  // kernels' host stand-ins (cuda/attention_cluster.cuh) test it
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include <algorithm>
#include <memory>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 { unsigned x = 1, y = 1, z = 1; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
inline float2 make_float2(float a, float b) { return float2{a, b}; }
typedef int cudaError_t;
typedef int cudaDeviceAttr;
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidDeviceFunction = 98, cudaErrorNotSupported = 801 };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97, cudaDevAttrMultiProcessorCount = 16, cudaDevAttrL2CacheSize = 38 };
inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
// Attributes: an H200's 132 multiprocessors and 50 MiB of L2; the opt-in shared memory per
// block: an H100/H200's 227 KiB, or $LUCE_EMU_SMEM_OPTIN bytes (e.g. 101376: the 99 KiB of sm_86/89/120).
inline cudaError_t cudaDeviceGetAttribute(int *v, int attr, int) {
    const char *optin = std::getenv("LUCE_EMU_SMEM_OPTIN");
    *v = attr == cudaDevAttrMultiProcessorCount ? 132 : attr == cudaDevAttrL2CacheSize ? 50 << 20
        : optin ? std::atoi(optin) : 232448;
    return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) { std::memset(p, v, n); return cudaSuccess; }
template <class F> cudaError_t cudaFuncSetAttribute(F, int, int) { return cudaSuccess; }
// One block of any kernel per multiprocessor: one-wave grids of 132 blocks.
template <class F> cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int, size_t) {
    *n = 1;
    return cudaSuccess;
}

using std::min; using std::max;
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
inline double __ddiv_rn(double a, double b) { volatile double r = a / b; return r; }
inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
template <class T> T __ldg(const T *p) { return *p; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) {
    unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}

namespace emu {
inline dim3 tIdx, bIdx;  // the running fiber's (fibers.cpp sets tIdx at each switch)
inline dim3 bDim, gDim;
inline std::vector<uint32_t> exchange;  // [2][threads]: a lane's shuffled word, as bits (floats and ints alike)
inline std::vector<uint32_t> shuffles;  // per thread: shuffles so far (picks the exchange buffer)
inline std::vector<unsigned char> dyn_smem(1 << 20);
inline size_t last_launch_smem = 0;  // dynamic shared memory of the last launch (emu_last_launch_smem)
inline size_t launches = 0;  // kernel launches so far (emu_launches)
// Thread block clusters along z (launch_clustered): the cluster's blocks run together as one
// set of fibers (block rank r: fibers r * threads ..), each with its own dynamic shared memory
// (smem_stride bytes apart, what cluster_map reads); __syncthreads waits for the block's own
// threads, cluster_barrier for the cluster's. cluster_n = 1: one block at a time.
inline unsigned cluster_n = 1, last_launch_cluster = 1;
inline dim3 cluster_first;  // blockIdx of the running cluster's rank 0
inline size_t smem_stride = 0;
int fiber();  // fibers.cpp: the running fiber's index in its cluster
void cluster_barrier();
inline unsigned cluster_rank() { return bIdx.z - cluster_first.z; }
inline unsigned char *block_smem() { return dyn_smem.data() + cluster_rank() * smem_stride; }
constexpr int kWarp = 32;
void block_barrier();  // fibers.cpp
void warp_barrier();
void run_block(unsigned n_threads, const std::function<void()> &kernel_body);
}
#define threadIdx emu::tIdx
#define blockIdx emu::bIdx
#define blockDim emu::bDim
#define gridDim emu::gDim
inline void __syncthreads() { emu::block_barrier(); }
inline void __syncwarp() { emu::warp_barrier(); }
// Lane src_lane's v, every lane of the warp calling. Two exchange buffers used in turn: a lane
// writes one again only after the next shuffle's barrier, which every lane reaches after
// reading this one, so one barrier a shuffle suffices.
// An 8-byte value (the l2norm's double sums) goes as two 4-byte shuffles.
template <class T> T emu_shfl(T v, int src_lane) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "the emulator shuffles 4- or 8-byte values");
    if constexpr (sizeof(T) == 8) {
        uint64_t bits;
        std::memcpy(&bits, &v, 8);
        const uint64_t lo = emu_shfl<uint32_t>((uint32_t)bits, src_lane);
        const uint64_t hi = emu_shfl<uint32_t>((uint32_t)(bits >> 32), src_lane);
        bits = hi << 32 | lo;
        T r;
        std::memcpy(&r, &bits, 8);
        return r;
    }
    const int t = emu::fiber(), w = t / emu::kWarp;
    uint32_t *buf = emu::exchange.data() + (emu::shuffles[t]++ & 1) * (emu::exchange.size() / 2);
    std::memcpy(&buf[t], &v, 4);
    emu::warp_barrier();
    T r;
    std::memcpy(&r, &buf[w * emu::kWarp + src_lane % emu::kWarp], 4);
    return r;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int m, int) { return emu_shfl(v, (threadIdx.x % emu::kWarp) ^ m); }
template <class T> T __shfl_sync(unsigned, T v, int src, int) { return emu_shfl(v, src); }
template <class K, class... A>
void emu_launch_cluster(K kernel, dim3 grid, dim3 block, size_t smem, unsigned cz, A... args) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
    emu::bDim = block; emu::gDim = grid;
    emu::last_launch_smem = smem;
    emu::last_launch_cluster = cz;
    ++emu::launches;
    emu::cluster_n = cz;
    emu::smem_stride = (smem + 15) / 16 * 16;
    emu::exchange.assign(2 * block.x * cz, 0u);
    if (emu::dyn_smem.size() < emu::smem_stride * cz + 64) emu::dyn_smem.resize(emu::smem_stride * cz + 64);
    const std::function<void()> body = [&] { kernel(args...); };
    for (unsigned z = 0; z < grid.z; z += cz) for (unsigned y = 0; y < grid.y; ++y) for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(emu::dyn_smem.data(), 0xff, std::min<size_t>(emu::dyn_smem.size(), emu::smem_stride * cz + 64));
        emu::bIdx = emu::cluster_first = dim3(x, y, z);
        emu::shuffles.assign(block.x * cz, 0u);
        emu::run_block(block.x * cz, body);
    }
    emu::cluster_n = 1;
}
template <class K, class... A>
void emu_launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t, A... args) {
    emu_launch_cluster(kernel, grid, block, smem, 1u, args...);
}
// pdl.cuh's programmatic launch (cuda/pdl.cuh leaves it to nvcc and hipcc): a plain launch here.
inline bool chain_overlap(int) { return false; }
template <class... KArgs, class... A>
cudaError_t launch_overlapped(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool,
                              A... args) {
    emu_launch(kernel, grid, block, smem, s, args...);
    return cudaSuccess;
}
// A launch in clusters of cz blocks along z (grid.z a multiple of cz): cuda/attention_cluster.cuh.
template <class... KArgs, class... A>
cudaError_t launch_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t, bool,
                             unsigned cz, A... args) {
    emu_launch_cluster(kernel, grid, block, smem, cz, args...);
    return cudaSuccess;
}
