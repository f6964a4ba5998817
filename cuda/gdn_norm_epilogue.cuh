// The gated RMSNorm epilogue of the GDN kernels that write out [T, Hv, Dv] a head's Dv /
// WARP_SIZE blocks at a time (gdn_recurrent.cuh's NORM form, gdn_tree.cu's tree verify): each
// block counts itself in arrivals[arrival] (zero before the launch); the last to arrive, once
// every block's out columns are visible, runs gated_rmsnorm_row over the head's rows r0..r1-1
// (z rows z_stride elements apart; weight [Dv]) into normed, so normed is bitwise
// luce_gated_rmsnorm of out.
#pragma once

#include "gated_rmsnorm.cuh"
#include "gdn_common.cuh"

struct GdnNormEpilogue {
    const float *z;        // [T, Hv, Dv], rows z_stride elements apart
    int64_t z_stride;
    const float *weight;   // [Dv]
    float *normed;         // [T, Hv, Dv]
    int32_t *arrivals;     // [segments, Hv], zero before the launch
    float eps;
};

// Called by every thread of the block after its out columns are written.
__device__ __forceinline__ void gdn_norm_epilogue(const GdnNormEpilogue &e, const float *out, int64_t arrival,
                                                  int64_t r0, int64_t r1, int64_t H, int64_t head, int64_t dv) {
    __shared__ int last;
    __threadfence();   // this block's out columns, before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(e.arrivals + arrival, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();   // every other block's columns are visible from here
    for (int64_t t = r0 + threadIdx.x / WARP_SIZE; t < r1; t += GDN_KGROUPS) {
        const int64_t row = (t * H + head) * dv;
        gated_rmsnorm_row(out + row, e.z + t * e.z_stride + head * dv, e.weight, e.normed + row, dv, e.eps);
    }
}
