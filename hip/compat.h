// CUDA names to HIP, so cuda/*.cu compile for AMD unchanged (the ggml vendors/hip.h pattern).
// common.cuh includes this when __HIPCC__ is defined (hipcc, or clang -x hip).
// RDNA (gfx10, gfx11, gfx12) runs wave32; GCN/CDNA (gfx6..gfx9) wave64 (LUCE_WAVE64 below).
// A real ROCm (>= 6.0) build resolves these includes to ROCm's headers; the CI compile check
// (tools/build_check.py) resolves them to the stand-ins under hip/check/ instead.
#pragma once

#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bf16.h>

// Wave size: host launch code sizes blocks and grids with the WARP_SIZE it was compiled with,
// so the build defines LUCE_WAVE64 for host and device alike when every arch runs 64-lane waves
// (hip/hip_build.py; one library never mixes wave sizes). Each device pass checks it agrees.
#if defined(__GFX6__) || defined(__GFX7__) || defined(__GFX8__) || defined(__GFX9__)
#define LUCE_ARCH_RUNS_WAVE64 1
#endif
#if defined(__HIP_DEVICE_COMPILE__) && defined(LUCE_ARCH_RUNS_WAVE64) && !defined(LUCE_WAVE64)
#error "GCN/CDNA (gfx6..gfx9) runs 64-lane waves: build with -DLUCE_WAVE64=1 (hip/hip_build.py does)"
#endif
#if defined(__HIP_DEVICE_COMPILE__) && !defined(LUCE_ARCH_RUNS_WAVE64) && defined(LUCE_WAVE64)
#error "LUCE_WAVE64 is set but this arch runs 32-lane waves (RDNA: gfx10, gfx11, gfx12)"
#endif

// ---- runtime API --------------------------------------------------------------------------
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorInvalidConfiguration hipErrorInvalidConfiguration
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaGetDevice hipGetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDeviceAttr hipDeviceAttribute_t
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeMaxSharedMemoryPerBlock
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost

// ---- device types -------------------------------------------------------------------------
#define __nv_bfloat16 __hip_bfloat16
#define __nv_bfloat162 __hip_bfloat162
