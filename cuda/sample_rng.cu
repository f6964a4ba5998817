// Seeded sampling of logits rows with the counter-based RNG (reference: luce/ref/sample_rng.py,
// which is the engine's host sampler, luce.engine.sampler.sample_token without penalties).
//
// Per row: the candidates are the row's top_k logits in (value descending, id ascending)
// order (a greedy row, temperature 0, takes the first). Then, in float64 and in the host's
// exact order: scaled = logit / T; p = det_exp(scaled - scaled[0]); p /= sequential sum;
// top-p keeps candidates up to the first cumulative >= top_p; min-p keeps p >= min_p * p[0];
// p /= sequential sum; the token is the first candidate whose cumulative probability exceeds
// u = uniform(seed, position) (luce/ref/sample_rng.py), else the last. Every float64 operation is
// an explicitly rounded intrinsic, never fused, so the host computes the same bits.
//
// Two launches: select (grid slices x rows) keeps each kSlice-wide slice's best top_k in the
// workspace; finish (one block per row) merges the slices' lists and runs the float64 tail in
// one thread. A row holding a NaN gets id -1.
#include "common.cuh"
#include "top_k_pick.cuh"

namespace {

using namespace pick;
constexpr int kThreads = kPickThreads;
constexpr int kWarps = kPickWarps;
constexpr int kMaxK = kPickMax;
static_assert(kMaxK == LUCE_SAMPLE_TOPK_MAX, "a pick list holds top_k candidates");

__global__ void __launch_bounds__(kThreads) select_kernel(luce_sample_rng_params p, Cand *lists, int *nan_rows) {
    __shared__ float sv[kSlice];
    __shared__ Cand picks[kWarps * kMaxK];
    __shared__ int counts[kWarps];
    const int64_t row = blockIdx.y;
    const int64_t i0 = (int64_t)blockIdx.x * kSlice;
    const int n = (int)min((int64_t)kSlice, p.vocab - i0);
    const float *logits = p.logits + row * p.logits_stride + i0;
    bool nan_seen = false;
    for (int j = threadIdx.x; j < n; j += kThreads) {
        sv[j] = logits[j];
        nan_seen |= sv[j] != sv[j];
    }
    if (nan_seen) nan_rows[row] = 1;   // benign race: every writer stores 1
    __syncthreads();
    const int k = p.temperature[row] == 0.0 ? 1 : p.top_k[row];
    Cand *out = lists + (row * gridDim.x + blockIdx.x) * kMaxK;
    pick_sorted(sv, [i0](int j) { return (int)(i0 + j); }, n, k, out, picks, counts);
}

// exp(x) for x <= 0: luce.ref.sample_rng.det_exp, operation for operation.
__device__ double det_exp(double x) {
    if (x < -700.0) return 0.0;
    const double k = rint(__dmul_rn(x, 0x1.71547652b82fep+0));
    const double r = __dsub_rn(__dsub_rn(x, __dmul_rn(k, 0x1.62e42fee00000p-1)), __dmul_rn(k, 0x1.a39ef35793c76p-33));
    const double coeffs[14] = {0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26,
                               0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16,
                               0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,
                               0x1.5555555555555p-5, 0x1.5555555555555p-3, 0x1.0p-1, 0x1.0p+0, 0x1.0p+0};
    double poly = coeffs[0];
    for (int i = 1; i < 14; ++i) poly = __dadd_rn(__dmul_rn(poly, r), coeffs[i]);
    return ldexp(poly, (int)k);
}

__device__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// luce.ref.sample_rng.uniform(seed, position, stream=0)
__device__ double uniform(uint64_t seed, int64_t position) {
    const uint64_t h = splitmix64(seed ^ splitmix64((uint64_t)position ^ splitmix64(0)));
    return __dmul_rn((double)(h >> 11), 0x1.0p-53);
}

__device__ double sequential_sum(const double *x, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s = __dadd_rn(s, x[i]);
    return s;
}

// The float64 tail of one row (one thread): top[0..n) sorted candidates -> the drawn id.
__device__ int64_t draw(const luce_sample_rng_params &p, int64_t row, const Cand *top, int n) {
    const double t = p.temperature[row];
    if (t == 0.0) return top[0].id;
    double prob[kMaxK];
    int ids[kMaxK];
    const double s0 = __ddiv_rn((double)top[0].v, t);
    for (int i = 0; i < n; ++i) {
        prob[i] = det_exp(__dsub_rn(__ddiv_rn((double)top[i].v, t), s0));
        ids[i] = top[i].id;
    }
    double total = sequential_sum(prob, n);
    for (int i = 0; i < n; ++i) prob[i] = __ddiv_rn(prob[i], total);
    if (p.top_p[row] < 1.0) {
        double cum = 0.0;
        for (int i = 0; i < n; ++i) {
            cum = __dadd_rn(cum, prob[i]);
            if (cum >= p.top_p[row]) { n = i + 1; break; }
        }
    }
    if (p.min_p[row] > 0.0) {
        const double cutoff = __dmul_rn(p.min_p[row], prob[0]);
        int kept = 0;
        for (int i = 0; i < n; ++i)
            if (prob[i] >= cutoff) { prob[kept] = prob[i]; ids[kept] = ids[i]; ++kept; }
        n = kept;
    }
    total = sequential_sum(prob, n);
    const double u = uniform(p.seed[row], p.position[row]);
    double cum = 0.0;
    for (int i = 0; i < n; ++i) {
        cum = __dadd_rn(cum, __ddiv_rn(prob[i], total));
        if (cum > u) return ids[i];
    }
    return ids[n - 1];
}

__global__ void __launch_bounds__(kThreads) finish_kernel(luce_sample_rng_params p, const Cand *lists,
                                                          const int *nan_rows, int n_slices) {
    extern __shared__ float merge_v[];                         // [n_slices * k] values, then ids
    __shared__ Cand picks[kWarps * kMaxK];
    __shared__ int counts[kWarps];
    __shared__ Cand top[kMaxK];
    const int64_t row = blockIdx.x;
    const int k = p.temperature[row] == 0.0 ? 1 : p.top_k[row];
    const int n = n_slices * k;
    int *merge_id = reinterpret_cast<int *>(merge_v + n_slices * kMaxK);
    for (int j = threadIdx.x; j < n; j += kThreads) {
        const Cand c = lists[(row * n_slices + j / k) * kMaxK + j % k];
        merge_v[j] = c.v;
        merge_id[j] = c.id;
    }
    __syncthreads();
    pick_sorted(merge_v, [merge_id](int j) { return merge_id[j]; }, n, k, top, picks, counts);
    __syncthreads();
    if (threadIdx.x != 0) return;
    if (nan_rows[row]) {
        p.ids_out[row] = -1;
        return;
    }
    int live = 0;                                              // a vocab smaller than k
    while (live < k && top[live].id != kNoId) ++live;
    p.ids_out[row] = draw(p, row, top, live);
}

int64_t slices(int64_t vocab) { return (vocab + kSlice - 1) / kSlice; }

}  // namespace

extern "C" int64_t luce_sample_rng_workspace_bytes(int64_t rows, int64_t vocab) {
    return rows * slices(vocab) * kMaxK * (int64_t)sizeof(Cand) + rows * (int64_t)sizeof(int) + 256;
}

extern "C" int luce_sample_rng(const luce_sample_rng_params *p, void *stream) {
    if (p->rows < 0 || p->rows > 65535 || p->vocab <= 0 || p->vocab >= kNoId || p->logits_stride < p->vocab ||
        slices(p->vocab) > 65535 || p->workspace_bytes < luce_sample_rng_workspace_bytes(p->rows, p->vocab))
        return (int)cudaErrorInvalidValue;
    if (p->rows == 0) return 0;
    const cudaStream_t s = (cudaStream_t)stream;
    const int64_t n_slices = slices(p->vocab);
    Cand *lists = reinterpret_cast<Cand *>(p->workspace);
    int *nan_rows = reinterpret_cast<int *>(lists + p->rows * n_slices * kMaxK);
    cudaError_t err = cudaMemsetAsync(nan_rows, 0, (size_t)p->rows * sizeof(int), s);
    if (err != cudaSuccess) return luce_status(err);
    select_kernel<<<dim3((unsigned)n_slices, (unsigned)p->rows), kThreads, 0, s>>>(*p, lists, nan_rows);
    const size_t merge_bytes = (size_t)n_slices * kMaxK * (sizeof(float) + sizeof(int));
    if (merge_bytes > 48 * 1024) {
        err = cudaFuncSetAttribute(finish_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)merge_bytes);
        if (err != cudaSuccess) return luce_status(err);
    }
    finish_kernel<<<(unsigned)p->rows, kThreads, merge_bytes, s>>>(*p, lists, nan_rows, (int)n_slices);
    return luce_status(cudaGetLastError());
}
