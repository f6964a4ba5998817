// Build-check stand-in for ROCm's <hip/hip_bf16.h> (ROCm >= 6): __hip_bfloat16 stores the
// 16 high bits of an IEEE f32; conversions round to nearest even, NaN stays NaN.
// See hip_runtime.h beside this (not for real ROCm builds).
#pragma once

#include "hip_runtime.h"

struct __hip_bfloat16_raw {
    unsigned short x;
};

static __host__ __device__ __forceinline__ unsigned short luce_hip_f32_to_bf16_bits(float f) {
    const uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct __hip_bfloat16 {
    unsigned short data;
    __hip_bfloat16() = default;
    __host__ __device__ __hip_bfloat16(float f) : data(luce_hip_f32_to_bf16_bits(f)) {}
    __host__ __device__ __hip_bfloat16(__hip_bfloat16_raw r) : data(r.x) {}
    __host__ __device__ operator float() const {
        return __builtin_bit_cast(float, (uint32_t)data << 16);
    }
    __host__ __device__ operator __hip_bfloat16_raw() const { return __hip_bfloat16_raw{data}; }
};

struct __attribute__((aligned(4))) __hip_bfloat162 {
    __hip_bfloat16 x, y;
};

static __host__ __device__ __forceinline__ float __bfloat162float(__hip_bfloat16 b) {
    return (float)b;
}
static __host__ __device__ __forceinline__ __hip_bfloat16 __float2bfloat16(float f) {
    return __hip_bfloat16(f);
}
static __host__ __device__ __forceinline__ unsigned short __bfloat16_as_ushort(__hip_bfloat16 b) {
    return b.data;
}
static __host__ __device__ __forceinline__ __hip_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    return __hip_bfloat16(__hip_bfloat16_raw{u});
}
static __host__ __device__ __forceinline__ float __low2float(__hip_bfloat162 b) { return (float)b.x; }
static __host__ __device__ __forceinline__ float __high2float(__hip_bfloat162 b) { return (float)b.y; }
