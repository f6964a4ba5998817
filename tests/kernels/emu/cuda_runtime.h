// Host stand-in for the CUDA subset the attention kernels use (tests/kernels/emu/build.py
// compiles cuda/attention*.cu against it with g++): blocks run one after another, each CUDA
// thread is a std::thread, __syncthreads is a block barrier, a shuffle goes through a per-warp
// exchange (32 lanes), __shared__ arrays are statics and dynamic shared memory is one buffer
// filled with NaN bytes before each block. It runs the kernels' own arithmetic and indexing,
// not the device's libm: only comparisons between two kernels of this build mean anything.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
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
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNotSupported = 801 };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97, cudaDevAttrMultiProcessorCount = 16 };
inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int *v, int, int) { *v = 232448; return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
template <class F> cudaError_t cudaFuncSetAttribute(F, int, int) { return cudaSuccess; }

using std::min; using std::max;
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

namespace emu {
inline thread_local dim3 tIdx, bIdx;
inline dim3 bDim, gDim;
inline std::barrier<> *block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<uint32_t> exchange;  // a lane's shuffled word, as bits (floats and ints alike)
inline std::vector<unsigned char> dyn_smem(1 << 20);
constexpr int kWarp = 32;
}
#define threadIdx emu::tIdx
#define blockIdx emu::bIdx
#define blockDim emu::bDim
#define gridDim emu::gDim
inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline void __syncwarp() { emu::warp_barriers[threadIdx.x / emu::kWarp]->arrive_and_wait(); }
template <class T> T emu_shfl(T v, int src_lane) {  // lane src_lane's v, every lane of the warp calling
    static_assert(sizeof(T) == 4, "the emulator shuffles 4-byte words");
    const int t = threadIdx.x, w = t / emu::kWarp;
    std::memcpy(&emu::exchange[t], &v, 4);
    emu::warp_barriers[w]->arrive_and_wait();
    T r;
    std::memcpy(&r, &emu::exchange[w * emu::kWarp + src_lane % emu::kWarp], 4);
    emu::warp_barriers[w]->arrive_and_wait();
    return r;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int m, int) { return emu_shfl(v, (threadIdx.x % emu::kWarp) ^ m); }
template <class T> T __shfl_sync(unsigned, T v, int src, int) { return emu_shfl(v, src); }
template <class K, class... A>
void emu_launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t, A... args) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
    const unsigned n = block.x;
    emu::bDim = block; emu::gDim = grid;
    emu::exchange.assign(n, 0u);
    if (emu::dyn_smem.size() < smem) emu::dyn_smem.resize(smem);
    std::barrier<> bb(n);
    emu::block_barrier = &bb;
    emu::warp_barriers.clear();
    for (unsigned w = 0; w < n / emu::kWarp; ++w) emu::warp_barriers.emplace_back(new std::barrier<>(emu::kWarp));
    std::vector<std::thread> th;
    for (unsigned t = 0; t < n; ++t)
        th.emplace_back([=, &bb] {
            emu::tIdx = dim3(t);
            for (unsigned z = 0; z < grid.z; ++z) for (unsigned y = 0; y < grid.y; ++y) for (unsigned x = 0; x < grid.x; ++x) {
                if (t == 0) std::memset(emu::dyn_smem.data(), 0xff, std::min<size_t>(emu::dyn_smem.size(), smem + 64));
                bb.arrive_and_wait();
                emu::bIdx = dim3(x, y, z);
                kernel(args...);
                bb.arrive_and_wait();
            }
        });
    for (auto &h : th) h.join();
}
