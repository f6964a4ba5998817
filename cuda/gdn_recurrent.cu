// Gated DeltaNet recurrent step (decode path: AR rows, one-token prefill chunks): the kernel
// of cuda/gdn_recurrent.cuh, launched plainly. Reference: luce/ref/gdn_recurrent.py.
#include "gdn_recurrent.cuh"

namespace {

template <int DK>
int launch_gdn_recurrent(const luce_gdn_recurrent_params &p, cudaStream_t stream) {
    const dim3 grid((unsigned)(p.dv / WARP_SIZE), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_recurrent_kernel<DK, false><<<grid, GDN_THREADS, 0, stream>>>(p, GdnNormEpilogue{});
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
