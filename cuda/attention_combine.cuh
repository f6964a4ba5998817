// The merge of a row's partials (cuda/attention.cu): the combine launch and the in-kernel merge
// of the last partition block run this one function, so both give the same bits.
// Reference: luce/ref/attention.py (the exact math; the kernel's order is below).
#pragma once

#include "attention_common.cuh"

namespace luce_attn {

// Partials folded per batch: their loads go out together (one round trip a batch).
constexpr int kMergeBatch = 8;

// Row `row`, query heads h0..h0+G-1 over the row's `keys` keys: out [G][D] (threads tid,
// tid + nthreads, ... over the G * D outputs). Each output folds the row's entries 0..used-1 in
// order: m = max m_i, l = sum l_i w_i, o = (sum o_i w_i) / l, w_i = exp(m_i - m) (rows of the
// prompt kernel, row < ws.split_rows: one entry a kSplitKeys split, m in log2 units, exp2);
// other rows one entry a chunk (chunk_count(keys, cmin)). keys <= 0: zeros; more entries than
// the workspace holds (keys past max_kv_len): NaN.
__device__ __forceinline__ void combine_heads(const luce_attention_params &p, const Workspace &ws, int32_t row,
                                              int32_t h0, int G, int32_t keys, int32_t cmin, int tid,
                                              int nthreads) {
    const int D = p.head_dim;
    float *out = p.out + ((int64_t)row * p.n_heads_q + h0) * D;
    const bool prompt = row < ws.split_rows;
    const bool over = prompt ? (keys + kPartition - 1) / kPartition > ws.n_parts
                             : chunk_count(keys, cmin) > ws.n_chunks;
    if (keys <= 0 || over) {
        const float fill = keys <= 0 ? 0.0f : __int_as_float(0x7fc00000);
        for (int i = tid; i < G * D; i += nthreads) out[i] = fill;
        return;
    }
    const int32_t used = prompt ? (keys + kSplitKeys - 1) / kSplitKeys : chunk_count(keys, cmin);
    auto weight = [&](float mi, float m) { return prompt ? exp2f(mi - m) : expf(mi - m); };
    for (int i = tid; i < G * D; i += nthreads) {
        const int g = i / D, d = i % D;
        const float *ml = ws.ml(row, h0 + g, 0);
        const float *part_o = ws.o(row, h0 + g, 0) + d;
        float m = -INFINITY, l = 0.0f, o = 0.0f;
        for (int i0 = 0; i0 < used; i0 += kMergeBatch) {
            float mv[kMergeBatch];
#pragma unroll
            for (int u = 0; u < kMergeBatch; ++u) mv[u] = i0 + u < used ? load_coherent(ml + 2 * (i0 + u)) : -INFINITY;
#pragma unroll
            for (int u = 0; u < kMergeBatch; ++u) m = fmaxf(m, mv[u]);
        }
        for (int i0 = 0; i0 < used; i0 += kMergeBatch) {
            float mv[kMergeBatch], lv[kMergeBatch], ov[kMergeBatch];
#pragma unroll
            for (int u = 0; u < kMergeBatch; ++u) {
                const bool in = i0 + u < used;
                mv[u] = in ? load_coherent(ml + 2 * (i0 + u)) : -INFINITY;
                lv[u] = in ? load_coherent(ml + 2 * (i0 + u) + 1) : 0.0f;
                ov[u] = in ? load_coherent(part_o + (int64_t)(i0 + u) * D) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < kMergeBatch; ++u) {
                if (i0 + u >= used) break;
                const float w = weight(mv[u], m);
                l = fmaf(lv[u], w, l);
                o = fmaf(ov[u], w, o);
            }
        }
        out[i] = o / l;
    }
}

// combine_heads' arithmetic at one entry (o, m0, l0): the output of a row of one chunk, which
// its only block writes itself, bitwise as through the workspace.
__device__ __forceinline__ float merge_one(float o, float m0, float l0) {
    const float m = fmaxf(-INFINITY, m0);
    const float w = expf(m0 - m);
    return fmaf(o, w, 0.0f) / fmaf(l0, w, 0.0f);
}

}  // namespace luce_attn
