// Device helpers shared by the paged attention kernels: the partition kernel for every row
// kind (cuda/attention.cu) and the tensor-core prompt-row kernel (cuda/attention_prefill.cu),
// which share the row-key rule, the workspace layout and the combine kernel.
// Reference: luce/ref/attention.py.
#pragma once

#include "common.cuh"

namespace luce_attn {

constexpr int kPartition = LUCE_ATTN_PARTITION;
constexpr int kThreads = 128;     // partition kernel block; fixes its value-pass key lanes
constexpr int kLanesPerKey = 8;   // lanes that share one key's dot products (score pass)
constexpr int kMaxGroup = 16;     // query heads per KV head
// Prompt rows (cuda/attention_prefill.cu) cut their keys into splits of kSplitKeys absolute
// keys; split s's partial sits in workspace entry s of the row's head.
constexpr int kSplitKeys = 1024;
static_assert(kSplitKeys % kPartition == 0, "a split is whole partitions");

__host__ __device__ __forceinline__ int32_t prompt_splits(int32_t n_parts) {
    return (int32_t)(((int64_t)n_parts * kPartition + kSplitKeys - 1) / kSplitKeys);
}

// The partition kernel cuts a row of n keys into chunks of chunk_keys(n, cmin) keys at absolute
// (logical) key positions: the smallest power of two >= cmin that makes at most kRowChunks
// chunks, capped at kPartition. A function of the row's own key count (DESIGN 5 rule 2): a
// short row spreads over several blocks (160 keys at cmin 32: 5 chunks of 32), a long one keeps
// kPartition-key chunks. cmin (a power of two in [kChunkMin, kPartition], >= page_size) is
// fixed per launch configuration: LUCE_ATTN_CHUNK_MIN, else by head dim (attention_config.cuh
// chunk_default: 128 at D 64, 64 at D 128, kPartition at D 256).
constexpr int kChunkMin = 32;
constexpr int kRowChunks = 16;

__host__ __device__ __forceinline__ int32_t chunk_keys(int32_t n, int32_t cmin) {
    int32_t len = cmin;
    while (len < kPartition && (int64_t)len * kRowChunks < n) len *= 2;
    return len;
}

__host__ __device__ __forceinline__ int32_t chunk_count(int32_t n, int32_t cmin) {
    const int32_t len = chunk_keys(n, cmin);
    return n > 0 ? (int32_t)(((int64_t)n + len - 1) / len) : 0;
}

// The shortest chunk a launch at this head dim may take (it sizes the workspace): kChunkMin at
// D <= 128 (the small models, whose short rows need the blocks), kPartition at D = 256.
__host__ __device__ __forceinline__ int32_t chunk_floor(int32_t head_dim) {
    return head_dim <= 128 ? kChunkMin : kPartition;
}

// The most chunks a row of at most max_kv keys takes (>= 1): every n <= max_kv with
// n <= kRowChunks * cmin has ceil(n / cmin) <= min(kRowChunks, ceil(max_kv / cmin)), any
// longer one at most kRowChunks or ceil(n / kPartition).
__host__ __device__ __forceinline__ int32_t chunk_grid(int32_t max_kv, int32_t cmin) {
    const int64_t n = max_kv > 0 ? max_kv : 0;
    const int64_t short_rows = (n + cmin - 1) / cmin < kRowChunks ? (n + cmin - 1) / cmin : kRowChunks;
    const int64_t long_rows = (n + kPartition - 1) / kPartition;
    const int64_t most = short_rows > long_rows ? short_rows : long_rows;
    return (int32_t)(most > 1 ? most : 1);
}

// The workspace of one launch: partial o [entries][D], then partial (m, l) [entries][2], its
// entries row by row, head by head. Rows 0..split_rows-1 (the prompt rows, when the prompt
// kernel takes them) hold prompt_splits(n_parts) entries a head (one per kSplitKeys split;
// n_parts = ceil(max_kv_len / kPartition)), the other rows n_chunks (one per chunk, at any cmin
// the head dim allows: chunk_grid(max_kv_len, chunk_floor(D))). Every writer and reader of a partial (the prompt
// kernels, the partition kernel, combine_heads) finds entry e of (row, head) here.
struct Workspace {
    float *base;
    int32_t n_rows, split_rows, n_heads, head_dim, n_parts, n_chunks;

    __host__ __device__ int32_t entries(int32_t row) const {
        return row < split_rows ? prompt_splits(n_parts) : n_chunks;
    }
    // Index of entry 0 of (row, h) among all entries (row = n_rows, h = 0: the entry count).
    __host__ __device__ int64_t first(int32_t row, int32_t h) const {
        const int64_t before = row < split_rows ? row : split_rows;
        return (before * prompt_splits(n_parts) + (row - before) * (int64_t)n_chunks) * n_heads +
               (int64_t)h * entries(row);
    }
    __host__ __device__ int64_t total() const { return first(n_rows, 0); }
    __host__ __device__ int64_t bytes() const { return total() * (head_dim + 2) * (int64_t)sizeof(float); }
    // Entry e of (row, h): its D floats of o, and its (m, l).
    __host__ __device__ float *o(int32_t row, int32_t h, int32_t e) const {
        return base + (first(row, h) + e) * head_dim;
    }
    __host__ __device__ float *ml(int32_t row, int32_t h, int32_t e) const {
        return base + total() * head_dim + (first(row, h) + e) * 2;
    }
};

// The layout of launch p with n_parts partitions whose rows 0..split_rows-1 take the prompt kernel.
__host__ __device__ __forceinline__ Workspace workspace_of(const luce_attention_params &p, int32_t n_parts,
                                                           int32_t split_rows) {
    return Workspace{p.workspace, p.n_rows, split_rows, p.n_heads_q, p.head_dim, n_parts,
                     chunk_grid(p.max_kv_len, chunk_floor(p.head_dim))};
}

// The prompt rows' keys as f16 (the staged form of the f16 prompt kernel,
// cuda/attention_prefill_f16_staged.cuh): K16 then V16 [Hkv][rows][D] (rows = n_kv_indices *
// page_size: row e * page_size + j is slot j of kv_indices entry e) in the workspace after the
// partials, at the next multiple of 256 bytes.
struct StagedKv {
    uint16_t *k, *v;
    int64_t rows;
};

__host__ __device__ __forceinline__ int64_t staged_kv_offset(const Workspace &ws) { return (ws.bytes() + 255) / 256 * 256; }

// Workspace bytes of layout ws with stage_rows staged rows (0: no staging) of n_heads_kv heads.
__host__ __device__ __forceinline__ int64_t workspace_bytes_with_stage(const Workspace &ws, int64_t stage_rows,
                                                                       int32_t n_heads_kv) {
    return stage_rows > 0 ? staged_kv_offset(ws) + 2 * stage_rows * n_heads_kv * ws.head_dim * (int64_t)sizeof(uint16_t)
                          : ws.bytes();
}

__host__ __device__ __forceinline__ StagedKv staged_kv_of(const luce_attention_params &p, const Workspace &ws,
                                                          int64_t stage_rows) {
    uint16_t *k = reinterpret_cast<uint16_t *>(reinterpret_cast<char *>(p.workspace) + staged_kv_offset(ws));
    return StagedKv{k, k + stage_rows * p.n_heads_kv * p.head_dim, stage_rows};
}

struct RowKeys {
    int32_t keys;       // logical keys the row attends (0..keys-1); -1 on padding rows
    int32_t page_base;  // index in kv_indices of the segment's first page
    int32_t direct;     // logical keys 0..direct-1 are KV rows 0..direct-1 (all, but for tree rows)
    int32_t tree_base;  // tree rows: KV index of segment row r is tree_base + r
    int32_t seg_first;  // tree rows: the segment's first row; rows seg_first.. have their
    int32_t staged;     //   parents staged in shared memory, this many (0: none)
};

// The segment holding `row`: the last one whose first row is <= row.
__device__ __forceinline__ int32_t attention_segment_of(const luce_attention_params &p, int32_t row) {
    int lo = 0, hi = p.n_segments - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (p.qo_indptr[mid] <= row) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The prompt rows of tile blockIdx.x (kTileQV query vectors: kTileQV / G rows of G heads), one
// block-uniform piece per segment they touch: piece(r0, r1) for rows r0..r1-1 of one segment.
template <class Piece>
__device__ __forceinline__ void for_tile_pieces(const luce_attention_params &p, int kTileQV, Piece piece) {
    const int32_t rows_per_tile = kTileQV / (p.n_heads_q / p.n_heads_kv);
    const int32_t t0 = blockIdx.x * rows_per_tile;
    const int32_t t1 = min(t0 + rows_per_tile, p.prompt_rows);
    for (int32_t r0 = t0; r0 < t1;) {
        const int32_t r1 = min(t1, p.qo_indptr[attention_segment_of(p, r0) + 1]);
        piece(r0, r1);
        r0 = r1;
    }
}

// The parent of row r of a tree row's segment: staged in shared memory (rk.staged rows from
// rk.seg_first, see attention_row_keys) or, past those, the global array.
__device__ __forceinline__ int32_t row_parent(const luce_attention_params &p, const RowKeys &rk,
                                              const int32_t *stage, int32_t r) {
    return (uint32_t)(r - rk.seg_first) < (uint32_t)rk.staged ? stage[r - rk.seg_first] : p.tree_parents[r];
}

// stage: nullptr, or shared memory for stage_rows parents, where every thread of the block
// calls this for the same row: a tree row first stages its segment's parents up to itself
// (one round trip; a parent never follows its child) and walks its root path there instead
// of one dependent global load a node.
__device__ __forceinline__ RowKeys attention_row_keys(const luce_attention_params &p, int32_t row,
                                                      int32_t *stage = nullptr, int32_t stage_rows = 0) {
    const int32_t lo = attention_segment_of(p, row);
    // The segment's entries load together (one round trip; all exist for padding too).
    const int32_t slot = p.seq_slots[lo], page_base = p.kv_indptr[lo], page_end = p.kv_indptr[lo + 1];
    const int32_t last_len = p.kv_last_page_len[lo], q_first = p.qo_indptr[lo], q_end = p.qo_indptr[lo + 1];
    const int32_t parent = p.tree_parents != nullptr ? p.tree_parents[row] : -1;
    RowKeys rk{-1, 0, 0, 0, q_first, 0};
    if (slot < 0) return rk;
    const int32_t n_pages = page_end - page_base;
    const int32_t kv_len = n_pages > 0 ? (n_pages - 1) * p.page_size + last_len : 0;
    const int32_t seg_rows = q_end - q_first;
    int32_t keys = p.causal ? kv_len - seg_rows + (row - q_first) + 1 : kv_len;
    rk.page_base = page_base;
    if (parent >= 0) {
        if (stage != nullptr) {
            rk.staged = max(0, min(row - q_first + 1, stage_rows));
            for (int i = threadIdx.x; i < rk.staged; i += blockDim.x) stage[i] = p.tree_parents[q_first + i];
            __syncthreads();
        }
        // Tree row: the committed prefix, then its root path (depth + 1 nodes). The walk is
        // bounded by the segment's rows so a malformed parent array cannot hang the kernel.
        int32_t depth = 0;
        for (int32_t r = row; row_parent(p, rk, stage, r) >= 0 && depth < seg_rows; r = row_parent(p, rk, stage, r))
            ++depth;
        const int32_t prefix = kv_len - seg_rows;
        keys = prefix + depth + 1;
        rk.direct = max(0, prefix);
        rk.tree_base = prefix - q_first;
    }
    rk.keys = max(0, min(keys, kv_len));
    if (parent < 0) rk.direct = rk.keys;
    return rk;
}

// Float offset of the (KV row, KV head) of local key j from the partition's table: launches
// without tree_parents hold a page's offset there, tree launches every key's (the committed
// keys' page rows, then a tree row's path keys' scratch rows): one shared load, no branch on
// the key's kind (such a branch serialized the value pass's loads: 2.3x an AR row's time).
template <bool TREE>
__device__ __forceinline__ int64_t key_offset(const int64_t *page_off, int32_t j, int32_t page_shift,
                                              int32_t page_mask, int64_t key_stride) {
    return TREE ? page_off[j] : page_off[j >> page_shift] + (int64_t)(j & page_mask) * key_stride;
}

__device__ __forceinline__ float4 zero4() { return make_float4(0.f, 0.f, 0.f, 0.f); }

__device__ __forceinline__ void fma4(float w, const float4 &x, float4 &acc) {
    acc.x = fmaf(w, x.x, acc.x);
    acc.y = fmaf(w, x.y, acc.y);
    acc.z = fmaf(w, x.z, acc.z);
    acc.w = fmaf(w, x.w, acc.w);
}

// Asks L2 for a row of BYTES (16-byte aligned) at a: no register, no wait. sm_90 and up: one
// bulk prefetch; before: one per 128-byte line; HIP and the host emulator: nothing.
template <int BYTES>
__device__ __forceinline__ void prefetch_row_l2(const void *a) {
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "n"(BYTES));
#elif defined(__CUDA_ARCH__) && !defined(__HIPCC__)
#pragma unroll
    for (int i = 0; i < BYTES; i += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)a + i));
#else
    (void)a;
#endif
}

// Softmax statistics of one query head over a partition's scores s[0..n-1], one warp:
// m = max, s[j] = exp(s[j] - m) in place, l = sum of those (lane-strided, then the butterfly).
// Returns (m, l).
__device__ __forceinline__ float2 partition_softmax(float *s, int32_t n, int lane) {
    float m = -INFINITY;
    for (int j = lane; j < n; j += WARP_SIZE) m = fmaxf(m, s[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < n; j += WARP_SIZE) {
        const float e = expf(s[j] - m);
        s[j] = e;
        l += e;
    }
    return make_float2(m, warp_sum(l));
}

// Whether the prompt-row kernel (the one LUCE_ATTN_PROMPT picks now) runs at this head dim on
// this device: its shared memory fits (asked once per kernel and form). Where it does not, a
// launch sends its prompt rows to the partition kernel (n_parts workspace entries a head).
__attribute__((visibility("hidden"))) bool tiled_attention_fits(int32_t head_dim);

// Rows of keys the prompt-row kernel stages as f16 in the workspace for a launch of these sizes
// (n_kv_indices * page_size where its staged form runs; 0: it reads the pages).
__attribute__((visibility("hidden"))) int64_t tiled_attention_stage_rows(int32_t head_dim, int32_t page_size,
                                                                         int64_t n_kv_indices);

// The prompt-row kernel over rows [0, p.prompt_rows) (cuda/attention_prefill.cu): writes
// workspace entries 0..splits-1 of those rows (o unnormalized, m in log2 units, l) in layout
// workspace_of(p, n_parts, p.prompt_rows), staging its keys first where
// tiled_attention_stage_rows(D, page_size, n_kv_indices) > 0 (the workspace then holds
// workspace_bytes_with_stage). Returns cudaErrorNotSupported (launching nothing) where
// !tiled_attention_fits. Internal to the library (not exported beside the luce_* ABI).
__attribute__((visibility("hidden"))) int launch_tiled_attention(const luce_attention_params &p, int32_t n_parts, int32_t page_shift,
                           cudaStream_t stream);

}  // namespace luce_attn
