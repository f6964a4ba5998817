// Gated DeltaNet recurrent step (decode path: AR rows, one-token prefill chunks).
// Reference: luce/ref/gdn_recurrent.py. Params and shapes: luce_gdn_recurrent_params in
// cuda/luce_ops.h: q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv], out [T, Hv, Dv] f32,
// state [n_slots, Hv, Dk, Dv] f32 resident and updated in place.
//
// Grid (Dv / WARP_SIZE, Hv, segments), GDN_THREADS threads: a block owns WARP_SIZE columns
// of one head's state for one segment, loads them into registers once, runs the segment's
// tokens through gdn_step (cuda/gdn_common.cuh) and stores them once, so state traffic is
// the floor: Dk * Dv * 4 bytes read and written per head per segment. A column's
// arithmetic depends only on its own data: batch-invariant.
#include "gdn_common.cuh"

namespace {

template <int DK>
__global__ void __launch_bounds__(GDN_THREADS) gdn_recurrent_kernel(luce_gdn_recurrent_params p) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    __shared__ GdnScratch scratch;
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
        return;
    }
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

template <int DK>
int launch_gdn_recurrent(const luce_gdn_recurrent_params &p, cudaStream_t stream) {
    const dim3 grid((unsigned)(p.dv / WARP_SIZE), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_recurrent_kernel<DK><<<grid, GDN_THREADS, 0, stream>>>(p);
    return luce_status(cudaGetLastError());
}

}  // namespace

extern "C" int luce_gdn_recurrent(const luce_gdn_recurrent_params *p, void *stream) {
    if (p->n_segments == 0) return 0;
    if (gdn_bad_sizes(p->n_segments, p->n_heads, p->dk, p->dv) || p->n_slots < 0 ||
        ((uintptr_t)p->q | (uintptr_t)p->k) % 16 != 0)  // rows of q, k move as float4
        return (int)cudaErrorInvalidValue;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (p->dk) {
        case 64: return launch_gdn_recurrent<64>(*p, s);
        case 128: return launch_gdn_recurrent<128>(*p, s);
        case 256: return launch_gdn_recurrent<256>(*p, s);
        default: return (int)cudaErrorInvalidValue;
    }
}
