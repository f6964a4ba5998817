// Library-level entry points: ABI version, error names, synchronize, the decode chain's overlap.
// No kernels here.
#include "common.cuh"
#include "pdl.cuh"

extern "C" int luce_abi_version(void) { return LUCE_ABI_VERSION; }

extern "C" const char *luce_error_string(int status) {
    return cudaGetErrorString((cudaError_t)status);
}

extern "C" int luce_device_synchronize(void) { return luce_status(cudaDeviceSynchronize()); }

extern "C" int luce_set_decode_overlap(int every_kind) {
    if (every_kind != 0 && every_kind != 1) return (int)cudaErrorInvalidValue;
    decode_overlap_kinds().store(every_kind ? kPdlEvery : kPdlAttn, std::memory_order_relaxed);
    return 0;
}
