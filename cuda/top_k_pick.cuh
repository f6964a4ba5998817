// The k first of a set of candidates in (value descending, id ascending) order, picked by one
// block of kPickThreads threads: the selection of seeded sampling (sample_rng.cu) and of the top-k
// log-probabilities (sampling.cu). The order is total (ids are distinct), so the list is the one
// any other way of picking gives: an exact selection whatever the split of the vocab.
#pragma once
#include "common.cuh"

namespace pick {

constexpr int kPickThreads = 256;
constexpr int kPickWarps = kPickThreads / WARP_SIZE;
constexpr int kSlice = 8192;                 // logits per select block (32 KB of shared memory)
constexpr int kPickMax = 64;                 // the longest list (LUCE_SAMPLE_TOPK_MAX, LUCE_TOPK_MAX)
constexpr int kNoId = 0x7fffffff;

struct Cand {
    float v;
    int id;
};

__device__ __forceinline__ Cand no_cand() { return Cand{-INFINITY, kNoId}; }

// a comes before b in (value descending, id ascending) order; NaN comes before nothing.
__device__ __forceinline__ bool before(Cand a, Cand b) {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

// A candidate and where it sits among the n being picked from (element j).
struct Pick {
    Cand c;
    int j;
};

__device__ __forceinline__ Pick no_pick() { return Pick{no_cand(), -1}; }

// The first of the warp's picks in candidate order (every lane gets it).
__device__ __forceinline__ Pick warp_first(Pick p) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) {
        const Pick o{Cand{warp_shfl_xor(p.c.v, m), warp_shfl_xor(p.c.id, m)}, warp_shfl_xor(p.j, m)};
        if (before(o.c, p.c)) p = o;
    }
    return p;
}

// Candidates a warp's picks come before in the sorted list `list` [n]: the first index whose
// entry does not come before c.
__device__ __forceinline__ int rank_in(const Cand *list, int n, Cand c) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (before(list[mid], c)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// The k first of n candidates (values v, ids from id_of) in (value descending, id ascending)
// order into out[0..k), no_cand past the candidates there are; NaN is never one. Lane l of warp
// w owns elements j = 32 w + l + kPickThreads i. A warp picks its k first in k rounds: each lane
// keeps its own first candidate after the warp's last pick, the warp takes the first of those
// (shuffles, no block barrier), and its 32 lanes look over the winning lane's elements (one
// or a few each) for that lane's next. Then each warp's pick goes to its rank among all the
// warps' picks (binary searches of the sorted lists). The order is total (ids are distinct), so
// the list is the one any other way of picking gives. Before this, k rounds of block-wide scans
// of all n (two barriers a round): the Coder-0.5B's sampled step ran ~0.09 ms longer than its
// greedy one on the H200 (docs/PERF.md, session 19); counted, this form takes a few us (not yet
// measured). picks: [kPickWarps][kPickMax], counts: [kPickWarps], both shared; the caller synchronizes
// before reading out.
template <typename IdOf>
__device__ void pick_sorted(const float *v, IdOf id_of, int n, int k, Cand *out, Cand *picks, int *counts) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int first = warp * WARP_SIZE;
    auto after = [&](Cand prev, int j0, int step) {  // the first element j0, j0 + step, .. after prev
        Pick best = no_pick();
        for (int j = j0; j < n; j += step) {
            const Cand c{v[j], id_of(j)};
            if (before(prev, c) && before(c, best.c)) best = Pick{c, j};
        }
        return best;
    };
    Pick mine = after(Cand{INFINITY, -1}, first + lane, kPickThreads);
    Cand *list = picks + warp * kPickMax;
    int r = 0;
    for (; r < k; ++r) {
        const Pick top = warp_first(mine);
        if (top.c.id == kNoId) break;  // the warp's elements are all picked
        if (lane == 0) list[r] = top.c;
        const int owner = top.j % kPickThreads - first;  // the lane whose element won: its next first
        const Pick next = warp_first(after(top.c, first + owner + lane * kPickThreads, WARP_SIZE * kPickThreads));
        if (lane == owner) mine = next;
    }
    if (lane == 0) counts[warp] = r;
    __syncthreads();
    int total = 0;
    for (int w = 0; w < kPickWarps; ++w) total += counts[w];
    for (int t = threadIdx.x; t < kPickWarps * kPickMax; t += kPickThreads) {
        const int w = t / kPickMax, i = t % kPickMax;
        if (i >= counts[w]) continue;
        const Cand c = picks[t];
        int rank = i;
        for (int w2 = 0; w2 < kPickWarps; ++w2)
            if (w2 != w) rank += rank_in(picks + w2 * kPickMax, counts[w2], c);
        if (rank < k) out[rank] = c;
    }
    for (int t = threadIdx.x; t < k; t += kPickThreads)
        if (t >= total) out[t] = no_cand();
}

}  // namespace pick
