// The cluster form of the partition kernel's merge (cuda/attention.cu, LUCE_ATTN_DECODE): a launch
// without prompt rows (nor more than kTreeClusterMaxRows tree rows) whose chunk grid is
// 2..kMaxCluster runs its (row, head group) blocks of chunks 0..Z-1 as one thread block cluster
// (sm_90 and up), and the blocks merge the row's partials through distributed shared memory instead
// of the workspace: each block keeps its partial o [G][D] and (m, l) [G] in its own shared memory,
// one cluster barrier, then block b merges outputs b * kThreads + tid, ... reading the chunks'
// partials from their blocks (one round trip), and a second barrier keeps every block's shared
// memory alive until all have read it. That replaces, for the chain form's last block: the
// partial's write, the fence, the atomic count and the merge's two workspace reads. Every block of
// the cluster reaches both barriers (blocks past the row's keys and padding rows too). The merge is
// combine_heads' arithmetic for a row of chunks (merge_chunks below), so the output is bitwise the
// chain form's. The host emulator (tests/kernels/emu, LUCE_EMU) runs a cluster's blocks as one set
// of fibers; HIP and devices before sm_90 keep the chain form.
#pragma once

#include <cstdlib>
#include <cstring>

#include "attention_common.cuh"
#include "cluster.cuh"

namespace luce_attn {

constexpr int kMaxCluster = (int)cluster::kMax;  // a row's chunks at most (kRowChunks)

// Row `row`, query heads h0..h0+G-1 of a row of `keys` keys, this block being chunk `chunk` of
// a cluster of Z: o [G][D] (this block's partial, or anything where it has no keys), m [G],
// l [G] at the same shared-memory offsets in every block. Writes out [G][D] (keys <= 0: zeros,
// padding rows keys < 0: nothing) as combine_heads would from the workspace.
__device__ __forceinline__ void cluster_merge(const luce_attention_params &p, int32_t row, int32_t h0, int G,
                                              int32_t keys, int32_t cmin, const float *o_s, const float *m_s,
                                              const float *l_s, int chunk, int Z, int tid, int nthreads) {
    cluster::sync();  // every block's partial is in its shared memory
    const int D = p.head_dim;
    float *out = p.out + ((int64_t)row * p.n_heads_q + h0) * D;
    const int32_t used = keys > 0 ? chunk_count(keys, cmin) : 0;
    for (int i = chunk * nthreads + tid; keys >= 0 && i < G * D; i += Z * nthreads) {
        if (used == 0 || used > Z) {  // a row without keys: zeros; more chunks than blocks: NaN
            out[i] = used == 0 ? 0.0f : __int_as_float(0x7fc00000);
            continue;
        }
        const int g = i / D;
        float mv[kMaxCluster], lv[kMaxCluster], ov[kMaxCluster];
#pragma unroll
        for (int e = 0; e < kMaxCluster; ++e) {
            if (e >= used) break;
            mv[e] = cluster::map(m_s, e)[g];
            lv[e] = cluster::map(l_s, e)[g];
            ov[e] = cluster::map(o_s, e)[i];
        }
        // combine_heads' order: m over the entries in order, then l and o folded in order
        float m = -INFINITY, l = 0.0f, o = 0.0f;
#pragma unroll
        for (int e = 0; e < kMaxCluster; ++e) {
            if (e >= used) break;
            m = fmaxf(m, mv[e]);
        }
#pragma unroll
        for (int e = 0; e < kMaxCluster; ++e) {
            if (e >= used) break;
            const float w = expf(mv[e] - m);
            l = fmaf(lv[e], w, l);
            o = fmaf(ov[e], w, o);
        }
        out[i] = o / l;
    }
    cluster::sync();  // no block leaves (its shared memory) before the others have read it
}

}  // namespace luce_attn

namespace {

// The form when LUCE_ATTN_DECODE names neither (cluster: this form, chain: the workspace merge).
// H200, one decode row (tools/bench.py attention_decode_*): 1.5B 160 keys 5.1 us against the
// chain's 7.9, 1,024 keys 7.0 against 11.5; 0.5B 4.7 against 6.9, 6.6 against 9.7.
constexpr bool kDecodeCluster = true;

// LUCE_ATTN_DECODE (read by each launch, for A/B runs), on a device that launches clusters.
inline bool decode_cluster_form() {
    const char *e = getenv("LUCE_ATTN_DECODE");
    const bool want = e && strcmp(e, "cluster") == 0 ? true : e && strcmp(e, "chain") == 0 ? false : kDecodeCluster;
    return want && cluster::launches();
}

// Launches with tree rows (a verify) take the cluster form up to kTreeClusterMaxRows rows, where the
// decode form is the cluster one; LUCE_ATTN_TREE_CLUSTER=1 / 0 forces it on / off (A/B runs). The
// same bits either way. H100, docs/PERF.md session 27: the Coder-1.5B's 23-row tree at 128 keys 12.9
// us against the chain form's 17.1 (0.5B 10.1 against 13.6), but 64 rows 28.0 against 26.0.
constexpr int kTreeClusterMaxRows = 32;
inline bool tree_cluster_form(int n_rows) {
    const char *e = getenv("LUCE_ATTN_TREE_CLUSTER");
    const bool want = e && strcmp(e, "1") == 0 ? true : e && strcmp(e, "0") == 0 ? false : n_rows <= kTreeClusterMaxRows;
    return want && decode_cluster_form();
}

}  // namespace
