// The decode attention input fused into the partition kernel (luce_rope_kv_attention,
// cuda/attention.cu; reference luce/ref/rope_kv_attention.py): for a launch whose rows are
// all AR decode rows (every live segment one row, its own new key the last of its keys), the
// kernel takes the q | k | v projection (the views luce_rope_kv takes) instead of a roped q.
// Every block of a row norms and rotates its query heads (the row's cos/sin table in shared
// memory, a warp a head) into its q rows; the blocks of the chunk that holds the row's last
// key (the row's new key, at its kv_dst) also write that key, normed and rotated, and its
// value to the pages before they read them (several head groups of one KV head write the
// same bytes). The device code is luce_rope_kv's (rope_head.cuh): the same q', k' and KV
// bytes, and the attention that follows is the unfused kernel's, order and all.
#pragma once

#include "attention_common.cuh"
#include "rope_head.cuh"

namespace luce_attn {

// The chunk of a row of n keys whose blocks write the row's new key (key n - 1): its last
// (chunk 0 for a row without keys, so a KV row is written whatever the row's keys).
__device__ __forceinline__ int32_t new_key_chunk(int32_t n, int32_t cmin) {
    return max(chunk_count(n, cmin), 1) - 1;
}

// Warp w takes items w, w + warps, ...: the block's G query heads, normed and rotated from
// raw [G][D] (the projection's q rows, staged) into q [G][D]; then, where write_kv and
// dst >= 0, the key (normed, rotated) and value of KV head hk of the row into KV row dst, the
// key normed in key_scratch [D] (shared, the block's own) so the page gets final values only
// (the other head groups' blocks write the same row at once). The caller syncs before (table,
// raw) and after (q, and the KV row its threads then read).
__device__ __forceinline__ void rope_block_input(const luce_rope_kv_params &r, int64_t row, const float *raw,
                                                 float *q, int G, const float *table, int64_t dst, int hk,
                                                 bool write_kv, float *key_scratch) {
    const int lane = threadIdx.x % WARP_SIZE, D = r.head_dim;
    const int items = G + (write_kv && dst >= 0 ? 2 : 0);
    for (int i = threadIdx.x / WARP_SIZE; i < items; i += kThreads / WARP_SIZE) {
        if (i < G) rope::head_norm_rope(raw + i * D, q + i * D, r.q_norm, r.eps, table, D, r.rope_dim, lane);
        else rope::kv_head_write(r, row, dst, i == G ? hk : r.heads_kv + hk, table, lane, key_scratch);
    }
}

}  // namespace luce_attn
