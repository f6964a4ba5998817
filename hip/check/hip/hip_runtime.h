// Build-check stand-in for ROCm's <hip/hip_runtime.h>: ONLY for tools/build_check.py, which
// builds cuda/*.cu with clang-22 `-x hip -nogpuinc` for gfx1100/gfx1151/gfx1201 on a machine
// without ROCm >= 6 (hip/README.md). It declares the subset of the HIP runtime API and device
// builtins luce uses, written on clang's AMDGPU builtins and the compiler's own HIP math
// wrappers (__clang_hip_math.h). The runtime functions are declared with ROCm's signatures and
// resolve against libamdhip64 when the check links its library; that library is loaded but no
// kernel of it has run. A real ROCm build (hipcc) must use the real <hip/hip_runtime.h> and
// never add hip/check to its include path.
// Semantics follow the HIP documentation; enum values follow ROCm's hip_runtime_api.h.
#pragma once

#if !defined(__HIP__)
#error "hip/check/hip/hip_runtime.h is for clang -x hip compile checks only"
#endif

#include <stddef.h>
#include <stdint.h>

#define LUCE_HIP_COMPILE_CHECK 1

// ---- function and variable qualifiers (what clang's HIP wrapper defines) -------------------
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __managed__ __attribute__((managed))
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __HIP_PLATFORM_AMD__ 1

// Device maths: the compiler's own HIP wrappers over the ROCm device library (__ocml_*),
// declared, not linked (-nogpulib).
#include <math.h>  // INFINITY, NAN; host declarations the device overloads below shadow
#include <__clang_hip_libdevice_declares.h>
#include <__clang_hip_math.h>

// ---- runtime API types --------------------------------------------------------------------
typedef enum hipError_t {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNotInitialized = 3,
    hipErrorInvalidConfiguration = 9,
    hipErrorInvalidDevicePointer = 17,
    hipErrorInvalidMemcpyDirection = 21,
    hipErrorInvalidDeviceFunction = 98,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorLaunchFailure = 719,
    hipErrorNotSupported = 801,
    hipErrorUnknown = 999,
} hipError_t;

typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;

typedef enum hipMemcpyKind {
    hipMemcpyHostToHost = 0,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipMemcpyDeviceToDevice = 3,
    hipMemcpyDefault = 4,
} hipMemcpyKind;

typedef enum hipFuncAttribute {
    hipFuncAttributeMaxDynamicSharedMemorySize = 8,
    hipFuncAttributePreferredSharedMemoryCarveout = 9,
} hipFuncAttribute;

typedef enum hipDeviceAttribute_t {
    hipDeviceAttributeMaxSharedMemoryPerBlock = 74,
    hipDeviceAttributeMultiprocessorCount = 63,
} hipDeviceAttribute_t;

struct dim3 {
    uint32_t x, y, z;
    __host__ __device__ constexpr dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1)
        : x(x_), y(y_), z(z_) {}
};

extern "C" {
hipError_t hipGetLastError(void);
hipError_t hipPeekAtLastError(void);
const char *hipGetErrorString(hipError_t error);
const char *hipGetErrorName(hipError_t error);
hipError_t hipDeviceSynchronize(void);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipGetDevice(int *device);
hipError_t hipDeviceGetAttribute(int *value, hipDeviceAttribute_t attr, int device);
hipError_t hipFuncSetAttribute(const void *func, hipFuncAttribute attr, int value);
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t bytes, hipMemcpyKind kind,
                          hipStream_t stream);
hipError_t hipMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t height, hipMemcpyKind kind, hipStream_t stream);
hipError_t hipMemsetAsync(void *dst, int value, size_t bytes, hipStream_t stream);
// The <<<grid, block, shmem, stream>>> plumbing clang lowers a launch to.
hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shmem = 0,
                                      hipStream_t stream = 0);
hipError_t __hipPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shmem, hipStream_t *stream);
hipError_t hipLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                           hipStream_t stream);
}

template <typename T>
static inline hipError_t hipFuncSetAttribute(T *func, hipFuncAttribute attr, int value) {
    return hipFuncSetAttribute(reinterpret_cast<const void *>(func), attr, value);
}

// ---- built-in coordinates -----------------------------------------------------------------
#define LUCE_HIP_COORDS(NAME, FX, FY, FZ)                                              \
    struct NAME##_t {                                                                  \
        __declspec(property(get = get_x)) uint32_t x;                                  \
        __declspec(property(get = get_y)) uint32_t y;                                  \
        __declspec(property(get = get_z)) uint32_t z;                                  \
        static __device__ __forceinline__ uint32_t get_x() { return FX; }              \
        static __device__ __forceinline__ uint32_t get_y() { return FY; }              \
        static __device__ __forceinline__ uint32_t get_z() { return FZ; }              \
    };                                                                                 \
    extern const __device__ __attribute__((weak)) NAME##_t NAME;

LUCE_HIP_COORDS(threadIdx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
                __builtin_amdgcn_workitem_id_z())
LUCE_HIP_COORDS(blockIdx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                __builtin_amdgcn_workgroup_id_z())
LUCE_HIP_COORDS(blockDim, __builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
                __builtin_amdgcn_workgroup_size_z())
LUCE_HIP_COORDS(gridDim, __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
                __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
                __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z())
#undef LUCE_HIP_COORDS

#define warpSize (__builtin_amdgcn_wavefrontsize())

// ---- synchronisation ----------------------------------------------------------------------
static __device__ __forceinline__ void __syncthreads(void) {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
static __device__ __forceinline__ void __syncwarp(void) {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
static __device__ __forceinline__ void __threadfence_block(void) {
    __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "workgroup");
}
static __device__ __forceinline__ void __threadfence(void) {
    __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent");
}

// ---- wave shuffles (ds_bpermute: each lane reads lane `src`'s 32-bit value) -----------------
static __device__ __forceinline__ int __lane_id(void) {
    return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}

template <typename T>
static __device__ __forceinline__ T luce_hip_bpermute(int src_lane, T var) {
    static_assert(sizeof(T) % 4 == 0, "shuffles move whole 32-bit words");
    int words[sizeof(T) / 4];
    __builtin_memcpy(words, &var, sizeof(T));
    for (unsigned i = 0; i < sizeof(T) / 4; ++i)
        words[i] = __builtin_amdgcn_ds_bpermute(src_lane << 2, words[i]);
    T out;
    __builtin_memcpy(&out, words, sizeof(T));
    return out;
}

// Lanes outside the caller's `width`-wide segment read their own value, as in HIP.
template <typename T>
static __device__ __forceinline__ T __shfl_xor(T var, int lane_mask, int width = warpSize) {
    const int self = __lane_id();
    int src = self ^ lane_mask;
    src = src >= ((self + width) & ~(width - 1)) ? self : src;
    return luce_hip_bpermute(src, var);
}
template <typename T>
static __device__ __forceinline__ T __shfl(T var, int src_lane, int width = warpSize) {
    const int self = __lane_id();
    return luce_hip_bpermute((src_lane & (width - 1)) + (self & ~(width - 1)), var);
}
template <typename T>
static __device__ __forceinline__ T __shfl_down(T var, unsigned delta, int width = warpSize) {
    const int self = __lane_id();
    int src = self + (int)delta;
    src = (src & (width - 1)) < (self & (width - 1)) || src >= ((self + width) & ~(width - 1)) ? self : src;
    return luce_hip_bpermute(src, var);
}
template <typename T>
static __device__ __forceinline__ T __shfl_up(T var, unsigned delta, int width = warpSize) {
    const int self = __lane_id();
    const int src = (self & (width - 1)) < (int)delta ? self : self - (int)delta;
    return luce_hip_bpermute(src, var);
}

// 64-bit mask on every wave size (wave32 leaves the high half zero).
static __device__ __forceinline__ unsigned long long __ballot(int predicate) {
    return __builtin_amdgcn_ballot_w64(predicate != 0);
}

// ---- read-only loads and atomics -----------------------------------------------------------
template <typename T>
static __device__ __forceinline__ T __ldg(const T *ptr) { return *ptr; }

#define LUCE_HIP_ATOMIC(NAME, BUILTIN)                                                   \
    template <typename T>                                                               \
    static __device__ __forceinline__ T NAME(T *addr, T val) {                          \
        return BUILTIN(addr, val, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);          \
    }
LUCE_HIP_ATOMIC(atomicAdd, __hip_atomic_fetch_add)
LUCE_HIP_ATOMIC(atomicSub, __hip_atomic_fetch_sub)
LUCE_HIP_ATOMIC(atomicMax, __hip_atomic_fetch_max)
LUCE_HIP_ATOMIC(atomicMin, __hip_atomic_fetch_min)
LUCE_HIP_ATOMIC(atomicAnd, __hip_atomic_fetch_and)
LUCE_HIP_ATOMIC(atomicOr, __hip_atomic_fetch_or)
LUCE_HIP_ATOMIC(atomicExch, __hip_atomic_exchange)
#undef LUCE_HIP_ATOMIC

template <typename T>
static __device__ __forceinline__ T atomicCAS(T *addr, T compare, T val) {
    __hip_atomic_compare_exchange_strong(addr, &compare, val, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                         __HIP_MEMORY_SCOPE_AGENT);
    return compare;
}

// ---- bit casts and integer intrinsics -------------------------------------------------------
static __device__ __forceinline__ float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
static __device__ __forceinline__ int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
static __device__ __forceinline__ float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
static __device__ __forceinline__ unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
static __device__ __forceinline__ double __longlong_as_double(long long x) {
    return __builtin_bit_cast(double, x);
}
static __device__ __forceinline__ long long __double_as_longlong(double x) {
    return __builtin_bit_cast(long long, x);
}
static __device__ __forceinline__ int __popc(unsigned x) { return __builtin_popcount(x); }
static __device__ __forceinline__ int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static __device__ __forceinline__ int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static __device__ __forceinline__ int __clzll(long long x) {
    return x ? __builtin_clzll((unsigned long long)x) : 64;
}
static __device__ __forceinline__ int __ffs(int x) { return __builtin_ffs(x); }
static __device__ __forceinline__ int __ffsll(long long x) { return __builtin_ffsll(x); }
static __device__ __forceinline__ unsigned __brev(unsigned x) { return __builtin_bitreverse32(x); }
static __device__ __forceinline__ unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
// c + dot of the four signed bytes of a and b (CUDA's __dp4a; ROCm lowers it to v_dot4).
static __device__ __forceinline__ int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
static __device__ __forceinline__ unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}

#include "hip_vector_types.h"
