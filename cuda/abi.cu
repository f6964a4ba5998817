// Library-level entry points: ABI version, error names, synchronize. No kernels here.
#include "common.cuh"

extern "C" int luce_abi_version(void) { return LUCE_ABI_VERSION; }

extern "C" const char *luce_error_string(int status) {
    return cudaGetErrorString((cudaError_t)status);
}

extern "C" int luce_device_synchronize(void) { return luce_status(cudaDeviceSynchronize()); }
