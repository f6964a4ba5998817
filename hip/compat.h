// CUDA names to HIP, so cuda/*.cu compile for AMD unchanged (the ggml vendors/hip.h pattern).
// RDNA (gfx11, gfx12) runs wave32; CDNA (gfx9) runs wave64 and sets LUCE_WAVE64.
#pragma once

#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bfloat16.h>

#if defined(__GFX9__)
#define LUCE_WAVE64 1
#endif

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaStream_t hipStream_t
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define __nv_bfloat16 hip_bfloat16
