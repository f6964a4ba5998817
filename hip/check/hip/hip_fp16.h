// Build-check stand-in for ROCm's <hip/hip_fp16.h>: __half / __half2 over clang's _Float16 with
// the conversions luce uses. See hip_runtime.h beside this (not for real ROCm builds).
#pragma once

#include "hip_runtime.h"

struct __half_raw {
    unsigned short x;
};

struct __half {
    _Float16 data;
    __half() = default;
    __host__ __device__ __half(float f) : data((_Float16)f) {}
    __host__ __device__ __half(__half_raw r) : data(__builtin_bit_cast(_Float16, r.x)) {}
    __host__ __device__ operator float() const { return (float)data; }
    __host__ __device__ operator __half_raw() const {
        return __half_raw{__builtin_bit_cast(unsigned short, data)};
    }
};
typedef __half half;

struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};
typedef __half2 half2;

static __host__ __device__ __forceinline__ float __half2float(__half h) { return (float)h.data; }
static __host__ __device__ __forceinline__ __half __float2half(float f) { return __half(f); }
static __host__ __device__ __forceinline__ __half __float2half_rn(float f) { return __half(f); }
static __host__ __device__ __forceinline__ unsigned short __half_as_ushort(__half h) {
    return __builtin_bit_cast(unsigned short, h.data);
}
static __host__ __device__ __forceinline__ __half __ushort_as_half(unsigned short u) {
    return __half(__half_raw{u});
}
static __host__ __device__ __forceinline__ float __low2float(__half2 h) { return (float)h.x.data; }
static __host__ __device__ __forceinline__ float __high2float(__half2 h) { return (float)h.y.data; }
static __host__ __device__ __forceinline__ float2 __half22float2(__half2 h) {
    return make_float2((float)h.x.data, (float)h.y.data);
}
static __host__ __device__ __forceinline__ __half2 __floats2half2_rn(float a, float b) {
    return __half2{__half(a), __half(b)};
}
static __host__ __device__ __forceinline__ __half2 __float22half2_rn(float2 f) {
    return __half2{__half(f.x), __half(f.y)};
}
static __host__ __device__ __forceinline__ __half2 __halves2half2(__half a, __half b) {
    return __half2{a, b};
}
static __device__ __forceinline__ __half __hadd(__half a, __half b) {
    __half r; r.data = a.data + b.data; return r;
}
static __device__ __forceinline__ __half __hmul(__half a, __half b) {
    __half r; r.data = a.data * b.data; return r;
}
static __device__ __forceinline__ __half __hfma(__half a, __half b, __half c) {
    __half r; r.data = __builtin_fmaf16(a.data, b.data, c.data); return r;
}
