// Build-check stand-in for ROCm's vector types (float4, uint2, ...): plain aggregates with
// CUDA's sizes and alignments and make_<type>() builders. See hip_runtime.h beside this.
#pragma once

#define LUCE_HIP_VEC2(T, N, A)                                                           \
    struct __attribute__((aligned(A))) N##2 { T x, y; };                                 \
    static __host__ __device__ __forceinline__ N##2 make_##N##2(T x, T y) { return {x, y}; }
#define LUCE_HIP_VEC4(T, N, A)                                                           \
    struct __attribute__((aligned(A))) N##4 { T x, y, z, w; };                           \
    static __host__ __device__ __forceinline__ N##4 make_##N##4(T x, T y, T z, T w) {    \
        return {x, y, z, w};                                                             \
    }

LUCE_HIP_VEC2(float, float, 8)
LUCE_HIP_VEC4(float, float, 16)
LUCE_HIP_VEC2(int, int, 8)
LUCE_HIP_VEC4(int, int, 16)
LUCE_HIP_VEC2(unsigned int, uint, 8)
LUCE_HIP_VEC4(unsigned int, uint, 16)
LUCE_HIP_VEC2(short, short, 4)
LUCE_HIP_VEC4(short, short, 8)
LUCE_HIP_VEC2(unsigned short, ushort, 4)
LUCE_HIP_VEC4(unsigned short, ushort, 8)
LUCE_HIP_VEC2(signed char, char, 2)
LUCE_HIP_VEC4(signed char, char, 4)
LUCE_HIP_VEC2(unsigned char, uchar, 2)
LUCE_HIP_VEC4(unsigned char, uchar, 4)
LUCE_HIP_VEC2(double, double, 16)
LUCE_HIP_VEC2(long long, longlong, 16)
LUCE_HIP_VEC2(unsigned long long, ulonglong, 16)

#undef LUCE_HIP_VEC2
#undef LUCE_HIP_VEC4
