// The rows a partition block takes (cuda/attention.cu): its own row, or, in launches with tree
// rows, the rows of its group when the block's chunk is the same whole run of committed keys for
// each of them. A verify's tree rows share their prefix: without this, each row's blocks read
// the prefix's K and V again (a 64-row tree over 4,096 keys of the 27B shape: 2.2 GB a layer
// through L2, 534 us; docs/PERF.md session 30). The rows of a group are consecutive rows of one
// segment (seg_first + i * R ..); the block of the group's first row takes the chunk for all of
// them, the others' blocks return. Each (row, head) keeps its own arithmetic: its dots, softmax,
// value sums and merge are the one-row block's in the same order (a query vector more is another
// head), so a row's bits do not depend on the rows beside it (DESIGN 5 rule 2).
#pragma once

#include <cstdlib>

#include "attention_common.cuh"

namespace luce_attn {

constexpr int kTreeVectors = 24;  // query vectors (rows x heads) a tree launch's block may take
constexpr int kTreeRows = 8;      // rows a block may take

// Query vectors a partition kernel form holds: MAXG heads, or for the tree form without
// clusters (the cluster form merges one row's chunks) up to kTreeVectors of rows x heads.
__host__ __device__ constexpr int partition_vectors(int MAXG, bool tree, bool cluster) {
    return tree && !cluster && MAXG < kTreeVectors ? kTreeVectors : MAXG;
}

// Floats of dynamic shared memory ahead of the partition kernel's float area: page_off [kPartition]
// (int64), m_s and l_s [MAXQ] (partition_vectors), table_s [D], rounded to whole float4s.
__host__ __device__ constexpr int partition_smem_head(int D, int MAXQ) { return (2 * kPartition + 2 * MAXQ + D + 3) / 4 * 4; }
// Floats of the area after it for nq query vectors: q [nq][D] and scores [nq][kPartition], then
// the value pass's key-lane sums [kThreads / (D / 4)][nq][D].
__host__ __device__ constexpr int partition_smem_body(int D, int nq) {
    return nq * (D + kPartition) > kThreads / (D / 4) * nq * D ? nq * (D + kPartition) : kThreads / (D / 4) * nq * D;
}

// Rows of a group at G heads a block (the same for every block of a launch).
__host__ __device__ __forceinline__ int group_rows(int vectors, int G) {
    const int r = vectors / G;
    return r < 1 ? 1 : (r > kTreeRows ? kTreeRows : r);
}

// Rows a tree block may take: kTreeRows, or LUCE_ATTN_TREE_ROWS (read by each launch, for A/B
// runs; 1: one row a block, the form before). The same bits at any value.
inline int32_t tree_rows_per_block() {
    const char *e = getenv("LUCE_ATTN_TREE_ROWS");
    const int v = e ? atoi(e) : 0;
    return v >= 1 && v <= kTreeRows ? v : kTreeRows;
}

struct RowSet {
    int32_t first, n;  // rows first..first+n-1; n = 0: another block of the group takes this chunk
};

// The rows the block of `row` (rk its keys, parents staged through its group) takes at chunk
// [key0, key0 + len): the group's rows where the chunk is whole and committed (a direct key
// run of len keys at this chunk length) for every row of it, else the row alone. keys_s[i]: the
// keys of the set's row i (written by thread 0; read after a barrier).
__device__ __forceinline__ RowSet partition_row_set(const luce_attention_params &p, const RowKeys &rk,
                                                    const int32_t *stage, int32_t row, int R, int32_t len,
                                                    int32_t key0, int32_t cmin, int32_t *keys_s) {
    const int32_t g0 = rk.seg_first + (row - rk.seg_first) / R * R, g1 = min(g0 + R, rk.seg_end);
    bool shared = g1 - g0 > 1 && rk.kv_len >= 0;
    for (int32_t m = g0; shared && m < g1; ++m) {
        const KeySpan s = m == row ? KeySpan{rk.keys, rk.direct}
                                   : row_key_span(p, rk, stage, m, p.tree_parents ? row_parent(p, rk, stage, m) : -1);
        shared = chunk_keys(s.keys, cmin) == len && key0 + len <= s.direct;
        if (threadIdx.x == 0) keys_s[m - g0] = s.keys;
    }
    if (!shared) {
        if (threadIdx.x == 0) keys_s[0] = rk.keys;
        return RowSet{row, 1};
    }
    return RowSet{g0, row == g0 ? g1 - g0 : 0};
}

}  // namespace luce_attn
