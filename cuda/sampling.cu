// Greedy argmax and top-k log-probabilities over logits rows (reference: luce/ref/sampling.py
// argmax, top_k_logprobs). Shapes: logits [rows, vocab] f32 (row stride logits_stride);
// ids_out [rows] (argmax) or [rows, k] int64; logprobs_out [rows, k] f32.
// Order: higher logit first, ties to the lowest id (DESIGN 5 rule 5). Selection under that
// total order is exact whatever the scan or merge order, so any split of the vocab gives the
// same ids; the log-sum-exp is accumulated per thread in double over a layout fixed by
// vocab and combined in a fixed order: batch-invariant. A row holding NaN gets id -1.
//   argmax: blocks of a row each reduce a vocab slice to one packed 64-bit key (ordered
//     value, inverted id) and atomicMax it into ids_out (zeroed first); a last pass turns
//     keys into ids. Three launches, no workspace, graph-capturable.
//   top-k: one block per row; each thread keeps its own sorted k best (loads batched 8 at a
//     time), each warp merges its lanes' lists, warp 0 merges the warps' lists.
#include "common.cuh"

namespace {

constexpr int kNoId = 0x7fffffff;
constexpr int kBatch = 8;  // loads in flight per thread per step

struct Cand {
    float v;
    int id;
};

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

// ---- argmax --------------------------------------------------------------------------------
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPerBlock = kArgmaxThreads * 16;
constexpr unsigned long long kNanKey = ~0ull;

// Monotonic map of a non-NaN float to uint32 (larger float, larger key).
__device__ __forceinline__ uint32_t ordered_bits(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_partial_kernel(luce_sampling_params p) {
    __shared__ unsigned long long warp_keys[kArgmaxThreads / WARP_SIZE];
    const int64_t row = blockIdx.y;
    const float *logits = p.logits + row * p.logits_stride;
    const int64_t begin = (int64_t)blockIdx.x * kArgmaxPerBlock;
    const int64_t end = begin + kArgmaxPerBlock < p.vocab ? begin + kArgmaxPerBlock : p.vocab;
    Cand best = no_cand();
    bool nan_seen = false;
#pragma unroll 4
    for (int64_t i = begin + threadIdx.x; i < end; i += kArgmaxThreads) {
        const Cand c{logits[i], (int)i};
        nan_seen |= c.v != c.v;
        if (better(c, best)) best = c;
    }
    best = warp_best(best);
    // any lane's NaN poisons the warp's key
    unsigned long long key = best.id == kNoId ? 0ull
        : ((unsigned long long)ordered_bits(best.v) << 32) | (UINT32_MAX - (uint32_t)best.id);
    if (warp_sum(nan_seen ? 1.0f : 0.0f) > 0.0f) key = kNanKey;
    if (threadIdx.x % WARP_SIZE == 0) warp_keys[threadIdx.x / WARP_SIZE] = key;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long top = warp_keys[0];
        for (int w = 1; w < kArgmaxThreads / WARP_SIZE; ++w) top = warp_keys[w] > top ? warp_keys[w] : top;
        atomicMax(reinterpret_cast<unsigned long long *>(p.ids_out + row), top);
    }
}

__global__ void argmax_finish_kernel(int64_t *ids, int64_t rows) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const unsigned long long key = (unsigned long long)ids[r];
    ids[r] = key == kNanKey ? -1 : (int64_t)(UINT32_MAX - (uint32_t)key);  // low 32 bits
}

// ---- top-k log-probs -----------------------------------------------------------------------
constexpr int kTopThreads = 1024;
constexpr int kTopWarps = kTopThreads / WARP_SIZE;

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

// Inserts c into the descending list (v, id)[0..count) capped at k entries; `last` mirrors
// the list's last entry once it is full (the admission threshold, kept in registers).
template <int KMAX>
__device__ __forceinline__ void list_insert(float *lv, int *li, int &count, int k, Cand &last, Cand c) {
    if (count == k && !better(c, last)) return;
    int pos = count < k ? count++ : k - 1;
    while (pos > 0 && better(c, Cand{lv[pos - 1], li[pos - 1]})) {
        lv[pos] = lv[pos - 1];
        li[pos] = li[pos - 1];
        --pos;
    }
    lv[pos] = c.v;
    li[pos] = c.id;
    if (count == k) last = Cand{lv[k - 1], li[k - 1]};
}

template <int KMAX>
__global__ void __launch_bounds__(kTopThreads) top_k_kernel(luce_sampling_params p) {
    __shared__ Cand warp_lists[kTopWarps][KMAX];
    __shared__ Lse warp_lse[kTopWarps];
    __shared__ int has_nan;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const float *row = p.logits + (int64_t)blockIdx.x * p.logits_stride;
    if (threadIdx.x == 0) has_nan = 0;
    __syncthreads();
    float lv[KMAX];
    int li[KMAX];
    int count = 0;
    Cand last = no_cand();
    Lse lse{-INFINITY, 0.0};
    bool nan_seen = false;
    for (int64_t base = threadIdx.x; base < p.vocab; base += (int64_t)kTopThreads * kBatch) {
        float v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t i = base + (int64_t)b * kTopThreads;
            v[b] = i < p.vocab ? row[i] : -INFINITY;
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t i = base + (int64_t)b * kTopThreads;
            if (i >= p.vocab) break;
            nan_seen |= v[b] != v[b];
            lse_push(lse, v[b]);
            list_insert<KMAX>(lv, li, count, p.k, last, Cand{v[b], (int)i});
        }
    }
    if (nan_seen) has_nan = 1;  // benign race: every writer stores 1

    // Each warp merges its lanes' lists into warp_lists[warp] (k rounds of a warp-wide pick).
    int head = 0;
    for (int r = 0; r < p.k; ++r) {
        const Cand mine = head < count ? Cand{lv[head], li[head]} : no_cand();
        const Cand win = warp_best(mine);
        if (head < count && mine.id == win.id) ++head;
        if (lane == 0) warp_lists[warp][r] = win;
    }
    // Log-normaliser: butterfly within the warp (commutative: every lane agrees), then the
    // warps in index order.
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1)
        lse = lse_combine(lse, Lse{warp_shfl_xor(lse.m, m), warp_shfl_xor(lse.s, m)});
    if (lane == 0) warp_lse[warp] = lse;
    __syncthreads();
    if (warp != 0) return;
    Lse total = warp_lse[0];
    for (int w = 1; w < kTopWarps; ++w) total = lse_combine(total, warp_lse[w]);
    const double log_z = (double)total.m + log(total.s);
    const bool bad = has_nan != 0;
    // Warp 0 merges the warps' lists: lane w walks warp w's list (kTopWarps lanes at most).
    int64_t *ids = p.ids_out + (int64_t)blockIdx.x * p.k;
    float *lps = p.logprobs_out + (int64_t)blockIdx.x * p.k;
    head = 0;
    for (int r = 0; r < p.k; ++r) {
        const Cand mine = lane < kTopWarps && head < p.k ? warp_lists[lane][head] : no_cand();
        const Cand win = warp_best(mine);
        if (lane < kTopWarps && head < p.k && mine.id == win.id) ++head;
        if (lane == 0) {
            ids[r] = bad || win.id == kNoId ? -1 : (int64_t)win.id;
            lps[r] = bad ? NAN : (float)((double)win.v - log_z);
        }
    }
}

int check(const luce_sampling_params &p, bool need_k) {
    if (p.rows < 0 || p.rows > 65535 || p.vocab <= 0 || p.vocab >= kNoId || p.logits_stride < p.vocab ||
        (need_k && (p.k < 1 || p.k > LUCE_TOPK_MAX || p.k > p.vocab)))
        return (int)cudaErrorInvalidValue;
    return 0;
}

template <int KMAX>
void launch_top_k(const luce_sampling_params &p, cudaStream_t stream) {
    top_k_kernel<KMAX><<<(unsigned)p.rows, kTopThreads, 0, stream>>>(p);
}

}  // namespace

extern "C" int luce_argmax(const luce_sampling_params *p, void *stream) {
    if (int err = check(*p, false)) return err;
    if (p->rows == 0) return 0;
    const cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cudaMemsetAsync(p->ids_out, 0, (size_t)p->rows * sizeof(int64_t), s);
    if (err != cudaSuccess) return luce_status(err);
    const dim3 grid((unsigned)((p->vocab + kArgmaxPerBlock - 1) / kArgmaxPerBlock), (unsigned)p->rows);
    argmax_partial_kernel<<<grid, kArgmaxThreads, 0, s>>>(*p);
    argmax_finish_kernel<<<(unsigned)((p->rows + 255) / 256), 256, 0, s>>>(p->ids_out, p->rows);
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
