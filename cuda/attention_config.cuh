// Host-side launch configuration of the paged attention kernels (cuda/attention.cu): partition
// count, shortest chunk, query heads per block and the L2 prefetch choice. None of them moves a
// bit of a row's result (DESIGN 5 rule 2): they size grids and pick equivalent forms.
#pragma once

#include <cstdlib>

#include "attention_common.cuh"

namespace {

using namespace luce_attn;

int32_t parts_for(int32_t max_kv_len) {
    return max_kv_len <= kPartition ? 1 : (int32_t)(((int64_t)max_kv_len + kPartition - 1) / kPartition);
}

// The shortest chunk by head dim where LUCE_ATTN_CHUNK_MIN does not set it. H100, Coder C1 decode
// over 128-428 keys (docs/PERF.md, session 26; against 32): D = 64 (the 0.5B) 128 keys +4.1% tok/s
// (64: +1.8%), D = 128 (the 1.5B) 64 keys +1.3% (128: -3.5%); at 1,024 and 2,048 keys the same
// (16 chunks either way). Fewer, longer chunks: fewer blocks and partials to merge where a short
// row's blocks are latency-bound anyway. D = 256: chunk_floor (kPartition).
constexpr int32_t chunk_default(int32_t head_dim) { return head_dim <= 64 ? 128 : head_dim <= 128 ? 64 : kPartition; }

// The shortest chunk (chunk_keys): chunk_default(D), or LUCE_ATTN_CHUNK_MIN where it is a power
// of two in [chunk_floor(D), kPartition] (kPartition: one chunk a partition, the kernel before
// chunks; for A/B runs); never below a page (a chunk's keys start on a page).
int32_t chunk_min_for(int32_t head_dim, int32_t page_size) {
    int32_t c = max(chunk_default(head_dim), chunk_floor(head_dim));
    if (const char *e = getenv("LUCE_ATTN_CHUNK_MIN")) {
        const int v = atoi(e);
        if (v >= chunk_floor(head_dim) && v <= kPartition && (v & (v - 1)) == 0) c = v;
    }
    return max(c, page_size);
}

// Query heads per partition block: all G of a KV head, or fewer (halving, not below floor)
// while the launch has under kFewBlocks blocks (a one-row decode step over a short context is
// otherwise Hkv blocks). LUCE_ATTN_GROUP_HEADS sets it (tests, benchmarks); the bits are the same.
constexpr int64_t kFewBlocks = 256;

int group_heads_for(int G, int64_t blocks, int floor = 1) {
    if (const char *e = getenv("LUCE_ATTN_GROUP_HEADS"))
        if (atoi(e) >= 1) return min(atoi(e), G);
    int gh = G;
    while (gh > floor && blocks * ((G + gh - 1) / gh) < kFewBlocks) gh = max((gh + 1) / 2, floor);
    return gh;
}

// The fewest query heads a block of the cluster form takes (cuda/attention_cluster.cuh): two
// where they split G evenly. H200, one decode row, 64..3,000 keys: 1.5B (G 6, D 128) 2 heads
// 4.97-16.4 us against 1 head's 5.88-26.7; 0.5B (G 7, D 64) 1 head best (4.53-14.9 us).
int cluster_group_floor(int G) { return G % 2 == 0 ? 2 : 1; }

// Partition blocks prefetch their K and V rows into L2 where the launch's KV (its rows' K
// and V over the padded span, an upper bound) fits in a quarter of L2, so the lines stay
// until read; larger launches have the blocks to hide the latency. No effect on the bits.
bool prefetch_fits(int64_t kv_bytes) {
#if defined(__HIPCC__)
    return false;  // prefetch_l2 is nothing there
#else
    static const int l2 = [] {
        int device = 0, bytes = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) return 0;
        return bytes;
    }();
    return kv_bytes <= l2 / 4;
#endif
}

}  // namespace
