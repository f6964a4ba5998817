// Token ids carried between forward calls on the device (reference: luce/ref/step_ids.py).
// The engine launches a greedy decode step before the previous step's ids reach the host
// (luce/engine/ahead.py): the previous step keeps each AR segment's greedy id by slot (keep),
// the next step's AR rows take them (feed); a draft model's chain keeps every segment's last
// row (luce/spec/drafters/draft_model.py). Shapes: ids [L] int64, the step's logits_indices [L]
// int64, qo_indptr [S+1], slots [S] (-1: keep nothing; feed: ar_slots), token_ids [T] int32
// (its metadata arena), last_ids [max_slots] int32. One block strides over segments: a step
// has few; the kernels are tiny links of a captured graph.
#include "common.cuh"

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) keep_ids_kernel(luce_step_ids_params p) {
    for (int s = threadIdx.x; s < p.n_segments; s += kThreads) {
        const int slot = p.slots[s];
        const int row = p.qo_indptr[s + 1] - 1;
        if (slot < 0 || row < p.qo_indptr[s]) continue;
        for (int i = 0; i < p.n_logits; ++i) {
            if (p.logits_indices[i] == row) {
                p.last_ids[slot] = (int32_t)p.ids[i];
                break;
            }
        }
    }
}

__global__ void __launch_bounds__(kThreads) feed_ids_kernel(luce_step_ids_params p) {
    for (int s = threadIdx.x; s < p.n_segments; s += kThreads) {
        const int slot = p.slots[s];
        if (slot < 0) continue;
        const int32_t id = p.last_ids[slot];
        p.token_ids[p.qo_indptr[s]] = id >= 0 && id < p.vocab ? id : 0;
    }
}

int check(const luce_step_ids_params &p) {
    if (p.n_segments < 0 || p.n_segments > 65535 || p.n_logits < 0 || p.vocab <= 0)
        return (int)cudaErrorInvalidValue;
    return 0;
}

}  // namespace

extern "C" int luce_keep_ids(const luce_step_ids_params *p, void *stream) {
    if (int err = check(*p)) return err;
    if (p->n_segments == 0) return 0;
    keep_ids_kernel<<<1, kThreads, 0, (cudaStream_t)stream>>>(*p);
    return luce_status(cudaGetLastError());
}

extern "C" int luce_feed_ids(const luce_step_ids_params *p, void *stream) {
    if (int err = check(*p)) return err;
    if (p->n_segments == 0) return 0;
    feed_ids_kernel<<<1, kThreads, 0, (cudaStream_t)stream>>>(*p);
    return luce_status(cudaGetLastError());
}
