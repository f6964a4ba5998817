// The Gated DeltaNet recurrent step kernel (cuda/gdn_recurrent.cu launches it plainly, the
// fused decode cuda/gdn_decode.cu with the gated RMSNorm epilogue). Params and shapes:
// luce_gdn_recurrent_params in cuda/luce_ops_sequence.h: q, k [T, Hv, Dk], v [T, Hv, Dv],
// g, beta [T, Hv], out [T, Hv, Dv] f32, state [n_slots, Hv, Dk, Dv] f32 resident and
// updated in place.
//
// Grid (Dv / WARP_SIZE, Hv, segments), GDN_THREADS threads: a block owns WARP_SIZE columns
// of one head's state for one segment, loads them into registers once, runs the segment's
// tokens through gdn_step (cuda/gdn_common.cuh) and stores them once, so state traffic is
// the floor: Dk * Dv * 4 bytes read and written per head per segment. A column's
// arithmetic depends only on its own data: batch-invariant.
//
// NORM: gdn_norm_epilogue.cuh over the segment's rows (arrivals[seg * Hv + head]), so normed is
// bitwise luce_gated_rmsnorm of out.
#pragma once

#include "gdn_common.cuh"
#include "gdn_norm_epilogue.cuh"
#include "pdl.cuh"

template <int DK, bool NORM>
__global__ void __launch_bounds__(GDN_THREADS) gdn_recurrent_kernel(luce_gdn_recurrent_params p,
                                                                    GdnNormEpilogue e) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    __shared__ GdnScratch scratch;
    wait_for_prior_kernels();  // a no-op unless launched overlapped (the fused decode chain)
    let_dependents_start();
    const int seg = blockIdx.z;
    const int head = blockIdx.y;
    const int lane = threadIdx.x % WARP_SIZE;
    const int kgroup = threadIdx.x / WARP_SIZE;
    const int64_t col = (int64_t)blockIdx.x * WARP_SIZE + lane;
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg], r1 = p.qo_indptr[seg + 1];
    if (slot < 0 || r1 <= r0) return;  // padding segment: nothing written
    const int64_t H = p.n_heads, dv = p.dv;
    if (slot >= p.n_slots) {           // bad slot: poison the outputs, leave every state alone
        if (kgroup == 0)
            for (int64_t t = r0; t < r1; ++t) p.out[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
    } else {
        float *hp = p.state + ((slot * H + head) * DK + (int64_t)kgroup * ROWS) * dv + col;
        float h[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) h[r] = hp[r * dv];

        for (int64_t t = r0; t < r1; ++t) {
            const int64_t th = t * H + head;
            float k[ROWS], q[ROWS];
            gdn_load_rows<ROWS>(p.k + th * DK + kgroup * ROWS, k);
            gdn_load_rows<ROWS>(p.q + th * DK + kgroup * ROWS, q);
            const float v = p.v[th * dv + col];
            const float decay = expf(p.g[th]);
            float u;
            const float o = gdn_step<ROWS>(h, k, q, v, decay, p.beta[th], scratch, &u);
            if (kgroup == 0) p.out[th * dv + col] = o;
        }

#pragma unroll
        for (int r = 0; r < ROWS; ++r) hp[r * dv] = h[r];
    }
    if constexpr (NORM) gdn_norm_epilogue(e, p.out, seg, r0, r1, H, head, dv);
}
