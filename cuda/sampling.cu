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
//   top-k: two launches over a workspace. Select (grid slices x rows, kSlice logits a block,
//     so a row's work spreads over the GPU however few rows there are) keeps each slice's k
//     first (top_k_pick.cuh) and its log-sum-exp; finish (a block a row) picks the k first of
//     the slices' lists and adds the slices' sums in slice order.
#include "common.cuh"
#include "top_k_pick.cuh"

namespace {

using pick::Cand;
using pick::kNoId;
using pick::no_cand;

__device__ __forceinline__ bool better(Cand a, Cand b) { return pick::before(a, b); }

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
using pick::kPickThreads;
using pick::kPickWarps;
using pick::kSlice;
static_assert(pick::kPickMax == LUCE_TOPK_MAX, "a pick list holds k candidates");

// Running log-sum-exp state: sum of exp(x - m) over the values seen, in double.
struct Lse {
    float m;
    double s;
};

// A slice's share of its row: the log-sum-exp of its logits and whether one is NaN.
struct SliceSum {
    double s;
    float m;
    int nan;
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

constexpr int kLoads = 8;  // a select thread's loads in flight

int64_t top_k_slices(int64_t vocab) { return (vocab + kSlice - 1) / kSlice; }

// Grid (slices, rows): the slice's k first into lists [rows, slices, k] and its log-sum-exp into
// sums [rows, slices]. The sum's order is fixed by the vocab alone: thread t adds elements t,
// t + 256, ... in turn (-inf padding adds nothing), a butterfly within each warp, then the warps in index order.
__global__ void __launch_bounds__(kPickThreads) top_k_select_kernel(luce_sampling_params p, Cand *lists,
                                                                    SliceSum *sums) {
    __shared__ float sv[kSlice];
    __shared__ Cand picks[kPickWarps * pick::kPickMax];
    __shared__ int counts[kPickWarps];
    __shared__ Lse warp_lse[kPickWarps];
    __shared__ int has_nan;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int64_t row = blockIdx.y, slice = blockIdx.x;
    const int64_t i0 = slice * kSlice;
    const int n = (int)min((int64_t)kSlice, p.vocab - i0);
    const float *logits = p.logits + row * p.logits_stride + i0;
    if (threadIdx.x == 0) has_nan = 0;
    __syncthreads();
    bool nan_seen = false;
    Lse lse{-INFINITY, 0.0};
    for (int j0 = threadIdx.x; j0 < n; j0 += kLoads * kPickThreads) {
        float x[kLoads];
#pragma unroll
        for (int b = 0; b < kLoads; ++b) {  // the loads first, all in flight at once
            const int j = j0 + b * kPickThreads;
            x[b] = j < n ? logits[j] : -INFINITY;
        }
#pragma unroll
        for (int b = 0; b < kLoads; ++b) {
            const int j = j0 + b * kPickThreads;
            if (j < n) sv[j] = x[b];
            nan_seen |= x[b] != x[b];
            lse_push(lse, x[b]);
        }
    }
    if (nan_seen) has_nan = 1;  // benign race: every writer stores 1
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1)
        lse = lse_combine(lse, Lse{warp_shfl_xor(lse.m, m), warp_shfl_xor(lse.s, m)});
    if (lane == 0) warp_lse[warp] = lse;
    __syncthreads();
    Cand *out = lists + (row * gridDim.x + slice) * p.k;
    pick::pick_sorted(sv, [i0](int j) { return (int)(i0 + j); }, n, p.k, out, picks, counts);
    if (threadIdx.x != 0) return;
    Lse total = warp_lse[0];
    for (int w = 1; w < kPickWarps; ++w) total = lse_combine(total, warp_lse[w]);
    sums[row * gridDim.x + slice] = SliceSum{total.s, total.m, has_nan};
}

// Dynamic shared memory of top_k_finish_kernel: the lists' values and ids, then the slices' sums.
size_t top_k_finish_smem(int64_t n_slices, int k) {
    return (size_t)n_slices * ((size_t)k * (sizeof(float) + sizeof(int)) + sizeof(SliceSum));
}

// One block a row: the k first of the slices' lists, the slices' sums added in slice order. The
// block loads the sums together with the lists (one round trip; thread 0 reading them one after
// another was ~13 us of dependent reads at 31 slices under ncu, docs/PERF.md session 26).
__global__ void __launch_bounds__(kPickThreads) top_k_finish_kernel(luce_sampling_params p, const Cand *lists,
                                                                    const SliceSum *sums, int n_slices) {
    extern __shared__ float merge_v[];                         // [n_slices * k] values, then ids, then sums
    __shared__ Cand picks[kPickWarps * pick::kPickMax];
    __shared__ int counts[kPickWarps];
    __shared__ Cand top[pick::kPickMax];
    const int64_t row = blockIdx.x;
    const int k = p.k, n = n_slices * k;
    int *merge_id = reinterpret_cast<int *>(merge_v + n);
    SliceSum *row_sums = reinterpret_cast<SliceSum *>(merge_id + n);  // 8-byte aligned: n * 8 bytes before
    for (int j = threadIdx.x; j < n; j += kPickThreads) {
        const Cand c = lists[row * n + j];
        merge_v[j] = c.v;
        merge_id[j] = c.id;
    }
    for (int i = threadIdx.x; i < n_slices; i += kPickThreads) row_sums[i] = sums[row * n_slices + i];
    __syncthreads();
    pick::pick_sorted(merge_v, [merge_id](int j) { return merge_id[j]; }, n, k, top, picks, counts);
    __syncthreads();
    if (threadIdx.x != 0) return;
    Lse total{row_sums[0].m, row_sums[0].s};
    bool bad = row_sums[0].nan != 0;
    for (int i = 1; i < n_slices; ++i) {
        total = lse_combine(total, Lse{row_sums[i].m, row_sums[i].s});
        bad |= row_sums[i].nan != 0;
    }
    const double log_z = (double)total.m + log(total.s);
    int64_t *ids = p.ids_out + row * k;
    float *lps = p.logprobs_out + row * k;
    for (int r = 0; r < k; ++r) {
        ids[r] = bad || top[r].id == kNoId ? -1 : (int64_t)top[r].id;
        lps[r] = bad ? NAN : (float)((double)top[r].v - log_z);
    }
}

int check(const luce_sampling_params &p, bool need_k) {
    if (p.rows < 0 || p.rows > 65535 || p.vocab <= 0 || p.vocab >= kNoId || p.logits_stride < p.vocab ||
        (need_k && (p.k < 1 || p.k > LUCE_TOPK_MAX || p.k > p.vocab)))
        return (int)cudaErrorInvalidValue;
    return 0;
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

extern "C" int64_t luce_top_k_logprobs_workspace_bytes(int64_t rows, int64_t vocab, int32_t k) {
    return rows * top_k_slices(vocab) * ((int64_t)k * (int64_t)sizeof(Cand) + (int64_t)sizeof(SliceSum));
}

extern "C" int luce_top_k_logprobs(const luce_sampling_params *p, void *stream) {
    if (int err = check(*p, true)) return err;
    const int64_t n_slices = top_k_slices(p->vocab);
    if (n_slices > 65535 || p->workspace_bytes < luce_top_k_logprobs_workspace_bytes(p->rows, p->vocab, p->k))
        return (int)cudaErrorInvalidValue;
    if (p->rows == 0) return 0;
    const cudaStream_t s = (cudaStream_t)stream;
    Cand *lists = reinterpret_cast<Cand *>(p->workspace);
    SliceSum *sums = reinterpret_cast<SliceSum *>(lists + p->rows * n_slices * p->k);
    top_k_select_kernel<<<dim3((unsigned)n_slices, (unsigned)p->rows), kPickThreads, 0, s>>>(*p, lists, sums);
    const size_t merge_bytes = top_k_finish_smem(n_slices, p->k);
    if (merge_bytes > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(top_k_finish_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)merge_bytes);
        if (err != cudaSuccess) return luce_status(err);
    }
    top_k_finish_kernel<<<(unsigned)p->rows, kPickThreads, merge_bytes, s>>>(*p, lists, sums, (int)n_slices);
    return luce_status(cudaGetLastError());
}
