// Greedy argmax and top-k log-probabilities over logits rows (reference: luce/ref/sampling.py
// argmax, top_k_logprobs). Shapes: logits [rows, vocab] f32 (row stride logits_stride);
// ids_out [rows] (argmax) or [rows, k] int64; logprobs_out [rows, k] f32.
// Order: higher logit first, ties to the lowest id (DESIGN 5 rule 5). Selection under that
// total order is exact whatever the scan order; the log-sum-exp is accumulated per thread in
// double over a layout fixed by vocab, then combined in a fixed butterfly: batch-invariant.
// One block per row. Top-k: each thread keeps its own sorted k best, then k rounds of a
// block-wide best-of-heads pick the winners. A row holding NaN gets id -1 (logprob NaN).
#include "common.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / WARP_SIZE;
constexpr int kNoId = 0x7fffffff;

struct Cand {
    float v;
    int id;
};

// Ranks below every real candidate.
__device__ __forceinline__ Cand no_cand() { return Cand{-INFINITY, kNoId}; }

__device__ __forceinline__ bool better(Cand a, Cand b) {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

__device__ __forceinline__ Cand warp_best(Cand c) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) {
        const Cand o{warp_shfl_xor(c.v, m), warp_shfl_xor(c.id, m)};
        if (better(o, c)) c = o;
    }
    return c;
}

// Block-wide best candidate, returned to every thread. `scratch` holds kWarps entries.
__device__ Cand block_best(Cand c, Cand *scratch) {
    c = warp_best(c);
    __syncthreads();
    if (threadIdx.x % WARP_SIZE == 0) scratch[threadIdx.x / WARP_SIZE] = c;
    __syncthreads();
    Cand best = scratch[0];
    for (int w = 1; w < kWarps; ++w)
        if (better(scratch[w], best)) best = scratch[w];
    return best;
}

// Running log-sum-exp state: sum of exp(x - m) over the values seen, in double.
struct Lse {
    float m;
    double s;
};

__device__ __forceinline__ Lse lse_combine(Lse a, Lse b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return a;
    return Lse{m, a.s * (double)expf(a.m - m) + b.s * (double)expf(b.m - m)};
}

__device__ __forceinline__ void lse_push(Lse &acc, float x) {
    if (x == -INFINITY) return;
    if (x > acc.m) {
        acc.s = acc.s * (double)expf(acc.m - x) + 1.0;
        acc.m = x;
    } else {
        acc.s += (double)expf(x - acc.m);
    }
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(luce_sampling_params p) {
    __shared__ Cand scratch[kWarps];
    __shared__ int has_nan;
    const float *row = p.logits + (int64_t)blockIdx.x * p.logits_stride;
    if (threadIdx.x == 0) has_nan = 0;
    __syncthreads();
    Cand best = no_cand();
    bool nan_seen = false;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
        const Cand c{row[i], (int)i};
        nan_seen |= c.v != c.v;
        if (better(c, best)) best = c;
    }
    if (nan_seen) has_nan = 1;  // benign race: every writer stores 1
    best = block_best(best, scratch);  // its barriers also publish has_nan
    if (threadIdx.x == 0) p.ids_out[blockIdx.x] = has_nan ? -1 : (int64_t)best.id;
}

// Inserts c into the descending list (v, id)[0..count) capped at k entries.
template <int KMAX>
__device__ __forceinline__ void list_insert(float *lv, int *li, int &count, int k, Cand c) {
    if (count == k && !better(c, Cand{lv[k - 1], li[k - 1]})) return;
    int pos = count < k ? count++ : k - 1;
    while (pos > 0 && better(c, Cand{lv[pos - 1], li[pos - 1]})) {
        lv[pos] = lv[pos - 1];
        li[pos] = li[pos - 1];
        --pos;
    }
    lv[pos] = c.v;
    li[pos] = c.id;
}

template <int KMAX>
__global__ void __launch_bounds__(kThreads) top_k_kernel(luce_sampling_params p) {
    __shared__ Cand scratch[kWarps];
    __shared__ int has_nan;
    const float *row = p.logits + (int64_t)blockIdx.x * p.logits_stride;
    if (threadIdx.x == 0) has_nan = 0;
    __syncthreads();
    float lv[KMAX];
    int li[KMAX];
    int count = 0;
    Lse lse{-INFINITY, 0.0};
    bool nan_seen = false;
    for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
        const float v = row[i];
        nan_seen |= v != v;
        lse_push(lse, v);
        list_insert<KMAX>(lv, li, count, p.k, Cand{v, (int)i});
    }
    if (nan_seen) has_nan = 1;
    // Log-normaliser: butterfly within the warp (commutative, so every lane agrees), then
    // warps in index order through shared memory (reusing scratch after block_best syncs).
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) {
        const Lse o{warp_shfl_xor(lse.m, m), warp_shfl_xor(lse.s, m)};
        lse = lse_combine(lse, o);
    }
    __shared__ Lse lse_scratch[kWarps];
    if (threadIdx.x % WARP_SIZE == 0) lse_scratch[threadIdx.x / WARP_SIZE] = lse;
    __syncthreads();
    Lse total = lse_scratch[0];
    for (int w = 1; w < kWarps; ++w) total = lse_combine(total, lse_scratch[w]);
    const double log_z = (double)total.m + log(total.s);
    const bool bad = has_nan != 0;

    int head = 0;
    int64_t *ids = p.ids_out + (int64_t)blockIdx.x * p.k;
    float *lps = p.logprobs_out + (int64_t)blockIdx.x * p.k;
    for (int r = 0; r < p.k; ++r) {
        const Cand mine = head < count ? Cand{lv[head], li[head]} : no_cand();
        const Cand win = block_best(mine, scratch);
        if (head < count && mine.id == win.id) ++head;
        if (threadIdx.x == 0) {
            ids[r] = bad || win.id == kNoId ? -1 : (int64_t)win.id;
            lps[r] = bad ? NAN : (float)((double)win.v - log_z);
        }
    }
}

int check(const luce_sampling_params &p, bool need_k) {
    if (p.rows < 0 || p.rows > 0x7fffffff || p.vocab <= 0 || p.vocab > kNoId ||
        p.logits_stride < p.vocab || (need_k && (p.k < 1 || p.k > LUCE_TOPK_MAX || p.k > p.vocab)))
        return (int)cudaErrorInvalidValue;
    return 0;
}

template <int KMAX>
void launch_top_k(const luce_sampling_params &p, cudaStream_t stream) {
    top_k_kernel<KMAX><<<(unsigned)p.rows, kThreads, 0, stream>>>(p);
}

}  // namespace

extern "C" int luce_argmax(const luce_sampling_params *p, void *stream) {
    if (int err = check(*p, false)) return err;
    if (p->rows == 0) return 0;
    argmax_kernel<<<(unsigned)p->rows, kThreads, 0, (cudaStream_t)stream>>>(*p);
    return luce_status(cudaGetLastError());
}

extern "C" int luce_top_k_logprobs(const luce_sampling_params *p, void *stream) {
    if (int err = check(*p, true)) return err;
    if (p->rows == 0) return 0;
    const cudaStream_t s = (cudaStream_t)stream;
    if (p->k <= 8) launch_top_k<8>(*p, s);
    else if (p->k <= 16) launch_top_k<16>(*p, s);
    else if (p->k <= 32) launch_top_k<32>(*p, s);
    else launch_top_k<LUCE_TOPK_MAX>(*p, s);
    return luce_status(cudaGetLastError());
}
