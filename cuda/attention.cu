// Paged GQA attention for prefill, AR and tree rows over the CSR KV layout of
// luce/models/batch.py. Reference: luce/ref/attention.py. Params: luce_attention_params in
// cuda/luce_ops.h: q, out [n_rows, Hq, D] f32; k_pages, v_pages [n_pages, page_size, Hkv, D].
//
// luce_rope_kv_attention: a launch of AR rows alone (D 64, 128) takes the attention input too
// (the q | k | v projection: q/k norm, rotary, the new key's KV write; attention_rope_input.cuh),
// one launch fewer than luce_rope_kv then luce_attention, the same bits.
// Two launches (three with prompt rows):
// 0. rows 0..prompt_rows-1: the prompt-row kernel (cuda/attention_prefill.cu; f16 or TF32
//    tensor cores, its own arithmetic: DESIGN 5 rule 1), one block per tile of rows, KV head
//    and split of kSplitKeys absolute keys, writing one workspace entry per split (the f16
//    kernel first stages the prompt segments' keys as f16 after the partials, where
//    n_kv_indices > 0: tiled_attention_stage_rows).
// 1. partition kernel, grid (rows, Hkv, chunks) over the other rows: block (row, KV head,
//    c) takes the row's keys [c * L, (c + 1) * L) (absolute KV indices; L = chunk_keys(n, cmin)
//    of the row's key count n: 32..256 keys, at most 16 chunks a row up to 4,096 keys, see
//    cuda/attention_common.cuh; cmin = 256 makes L = LUCE_ATTN_PARTITION, the kernel before chunks)
//    for the Hq / Hkv query heads that share the KV head (each K/V row is read once), and
//    writes an unnormalized partial output with its max score m and sum of exponentials l
//    to the workspace (layout: Workspace in cuda/attention_common.cuh): partial o, then
//    partial (m, l), entries row by row and head by head; a row of the prompt kernel holds one
//    entry a head per split (prompt_splits(n_parts)), any other row one per chunk (n_chunks).
// 2. combine kernel, grid (n_rows, Hq): merges the row's own chunks 0..used-1 in order
//    (prompt rows: its splits, with m in log2 units). Without prompt rows and with the
//    caller's zeroed counters, no combine launch: the last partition block of a row's head
//    group to finish (an atomic count per row and group) merges them, by the same code
//    (combine_heads, cuda/attention_combine.cuh); a row of one chunk skips the workspace,
//    fence and count (its block writes the output by the combine's arithmetic: merge_one).
//    The cluster form (the default where the device launches clusters, LUCE_ATTN_DECODE;
//    launches without prompt or tree rows, D <= 128, 2..16 chunks: cuda/attention_cluster.cuh)
//    runs a row's chunk blocks of a head group as one cluster that merges the partials in
//    distributed shared memory by the same arithmetic: no workspace, fence, count nor re-read.
// A block takes a group of the KV head's query heads (all G, or fewer when the launch has
// few rows: a decode step of one row and a short context is a handful of blocks otherwise);
// each head's arithmetic is the same in any group, so the bits do not depend on it.
// Every reduction's order is fixed by the key positions and the row's key count alone, so a
// row's output is bitwise the same in any batch (DESIGN 5 rule 2). The chunk count comes from
// the launch's max_kv_len (the padded KV span) and only sizes the grid: chunks past a row's
// keys exit at once. Short chunks exist for latency: a one-row decode step of the Coder-1.5B
// (D 128: chunks of 64 keys and up, attention_config.cuh chunk_default) over 160 keys is 2 (Hkv)
// x 3 (chunks) x G blocks, not Hkv x G blocks of 160 keys each.
// Latency: a decode step's partition block is a chain of dependent memory round trips, so
// loads are issued together: the q rows before the row's keys and page table; the score
// pass loads several passes' keys (16 float4s a thread) before their dots; the value pass
// 8-16 keys a thread, its first batch before the softmax; and where the launch's KV fits in
// a quarter of L2 (a decode step's few blocks), each block first asks L2 for the rest of
// its K rows and all its V rows (prefetch_row_l2), so the later batches wait on L2, not
// memory. A tree row's block stages its segment's parents in shared memory before walking
// its root path (attention_row_keys): one round trip, not one a node. Each dot and each
// value sum keeps its arithmetic and order (per-lane fmas, the kLanesPerKey butterfly; keys
// kl, kl + KEY_LANES, ... then the key-lane sum): only the timing of loads changed, not bits.
// Tree rows (tree_parents, reference luce/ref/tree_attention.py): a row's keys are indexed
// LOGICALLY (the committed prefix 0..P-1, then its root path at P, P+1, ...) and everything
// above (partitions, reduction order) runs on logical indices; only the address of a
// logical key past the prefix comes from a per-block table of its scratch KV row. So a tree
// row reduces bitwise like the AR row it becomes once its path is committed.
#include "attention_cluster.cuh"
#include "attention_combine.cuh"
#include "attention_config.cuh"
#include "attention_rope_input.cuh"
#include "pdl.cuh"

namespace {

using namespace luce_attn;

// Tree rows stage up to this many of their segment's parents in shared memory (a larger
// tree walks its deeper rows partly in global memory: the same result).
constexpr int kTreeStage = 512;

// Floats of dynamic shared memory ahead of the partition kernel's float area: page_off [kPartition]
// (int64), m_s and l_s [MAXG], table_s [D], rounded to whole float4s.
__host__ __device__ constexpr int partition_smem_head(int D, int MAXG) { return (2 * kPartition + 2 * MAXG + D + 3) / 4 * 4; }

// Grid (rows, Hkv * groups, chunks): block (row, hk * groups + gi, c) takes query heads
// hk * G + gi * group_heads .. (at most group_heads of them) over chunk c of the row's keys.
// ROPE (decode launches, attention_rope_input.cuh): q from the projection (r), normed and
// rotated here, and the row's new key and value written by the blocks that read them.
// CLUSTER (attention_cluster.cuh): the blocks of chunks 0..gridDim.z-1 are one cluster and
// merge through distributed shared memory (no workspace, fence nor count).
template <int D, int MAXG, bool TREE, bool ROPE, bool CLUSTER>
__global__ void __launch_bounds__(kThreads)
attention_partition_kernel(luce_attention_params p, int32_t n_parts, int32_t page_shift, int32_t row0,
                           int32_t group_heads, int32_t cmin, bool prefetch, luce_rope_kv_params r) {
    constexpr int C4 = D / (4 * kLanesPerKey);     // float4s of a key row per lane
    constexpr int COLS = D / 4;                    // float4 columns of a row
    constexpr int KEY_LANES = kThreads / COLS;     // keys in flight in the value pass
    constexpr int KEYS_PER_PASS = kThreads / kLanesPerKey;
    constexpr int WARPS = kThreads / WARP_SIZE;
    // Loads in flight (the kernel is latency-bound): the score pass loads PASSES passes' keys
    // (16 float4s a thread) before their dots, the value pass VKEYS keys a thread.
    constexpr int PASSES = C4 >= 16 ? 1 : 16 / C4;
    constexpr int VKEYS = MAXG >= 8 ? 8 : 16;
    constexpr int QN = (MAXG * D + kThreads - 1) / kThreads;  // q floats a thread stages
    static_assert(!ROPE || 2 * D <= kPartition, "ROPE: the new key's scratch row follows the staged q rows in s_s");
    extern __shared__ float4 smem4[];
    // Dynamic (a cluster's blocks read each other's): page_off, m_s, l_s, table_s, then smem.
    // [kPartition] float offset of (page, 0, hk, 0); tree launches: of local key j's (KV row, hk)
    int64_t *page_off = reinterpret_cast<int64_t *>(smem4);
    float *m_s = reinterpret_cast<float *>(smem4) + 2 * kPartition, *l_s = m_s + MAXG;  // [MAXG] each
    float *table_s = l_s + MAXG;                   // [D] ROPE: the row's cos [half] then sin [half]
    float *smem = reinterpret_cast<float *>(smem4) + partition_smem_head(D, MAXG);

    const int groups = (p.n_heads_q / p.n_heads_kv + group_heads - 1) / group_heads;
    const int32_t row = row0 + (int32_t)blockIdx.x, hk = blockIdx.y / groups, chunk = blockIdx.z;
    if constexpr (ROPE)  // positions come from the step's upload (as in rope_kv_kernel)
        rope::fill_table(table_s, r.positions, row, r.n_pos, r.sections, r.rope_dim, r.theta, threadIdx.x, kThreads);
    wait_for_prior_kernels();  // q from rope_kv (ROPE: q, k, v from the matmul), the page table from the step's upload
    let_dependents_start();    // the kernel after may be scheduled; it waits for this one to end
    const int g_first = (blockIdx.y % groups) * group_heads;
    const int G = min(group_heads, p.n_heads_q / p.n_heads_kv - g_first);  // this block's heads
    const bool fused = p.counters != nullptr;
    const Workspace ws = workspace_of(p, n_parts, row0);  // rows below row0 took the prompt kernel
    // q rows of the block's heads: loaded before the row's keys and page table, which they do not need.
    const int64_t head0 = (int64_t)row * p.n_heads_q + (int64_t)hk * (p.n_heads_q / p.n_heads_kv) + g_first;
    const int32_t h0 = (int32_t)(head0 - (int64_t)row * p.n_heads_q);  // the block's first query head
    const float *q_src = ROPE ? r.q + (int64_t)row * r.q_stride + (head0 - (int64_t)row * p.n_heads_q) * D
                              : p.q + head0 * D;
    const int64_t kv_dst = ROPE ? r.kv_dst[row] : -1;  // ROPE: the KV row of the row's new key
    float qv[QN];
#pragma unroll
    for (int u = 0; u < QN; ++u) {
        const int i = threadIdx.x + u * kThreads;
        qv[u] = i < G * D ? q_src[i] : 0.0f;
    }
    __shared__ int32_t parent_s[TREE ? kTreeStage : 1];  // tree rows: their segment's parents
    const RowKeys rk = attention_row_keys(p, row, TREE ? parent_s : nullptr, kTreeStage);
    const int32_t len = chunk_keys(rk.keys, cmin), key0 = chunk * len;
    if (rk.keys <= key0) {                         // padding row, or past the row's keys
        if (ROPE && chunk == 0 && rk.keys <= 0) {  // a row without keys: its KV row all the same
            __syncthreads();
            rope_block_input(r, row, nullptr, nullptr, 0, table_s, kv_dst, hk, true, smem);  // no q staged: smem is free
        }
        if (CLUSTER)                               // every block of the cluster merges a share
            cluster_merge(p, row, h0, G, rk.keys, cmin, smem, m_s, l_s, chunk, gridDim.z, threadIdx.x, kThreads);
        else if (fused && chunk == 0 && rk.keys == 0)   // a row without keys: zeros (padding: nothing)
            combine_heads(p, ws, row, hk * (p.n_heads_q / p.n_heads_kv) + g_first, G, 0, cmin, threadIdx.x, kThreads);
        return;
    }
    const int32_t n_local = min(len, rk.keys - key0);
    const int32_t n_direct = TREE ? max(0, min(n_local, rk.direct - key0)) : n_local;
    const int64_t key_stride = (int64_t)p.n_heads_kv * D;
    const int32_t page_mask = (1 << page_shift) - 1;
    float *q_s = smem;                             // [G][D]
    float *s_s = smem + G * D;                     // [G][kPartition] scores, then exp(s - m)

    if constexpr (TREE) {  // every key's offset in one table: one shared load a key, no branch on the key's kind
        for (int j = threadIdx.x; j < n_direct; j += kThreads) {
            const int64_t page = p.kv_indices[rk.page_base + (key0 >> page_shift) + (j >> page_shift)];
            page_off[j] = ((page << page_shift) + (j & page_mask)) * key_stride + (int64_t)hk * D;
        }
    } else {
        const int32_t pages = (n_direct + page_mask) >> page_shift;
        for (int i = threadIdx.x; i < pages; i += kThreads) {
            const int64_t page = p.kv_indices[rk.page_base + (key0 >> page_shift) + i];
            page_off[i] = (page << page_shift) * key_stride + (int64_t)hk * D;
        }
    }
    if (TREE && n_direct < n_local && threadIdx.x == 0) {
        // Path keys of this partition: walk up from the row (logical key direct + depth)
        // and keep the nodes whose logical index falls in [key0 + n_direct, key0 + n_local).
        int32_t j = rk.keys - 1 - key0;
        for (int32_t r = row; j >= n_direct; r = row_parent(p, rk, parent_s, r), --j) {
            if (j < n_local) {
                const int32_t kv = rk.tree_base + r;
                const int64_t page = p.kv_indices[rk.page_base + (kv >> page_shift)];
                page_off[j] = ((page << page_shift) + (kv & page_mask)) * key_stride + (int64_t)hk * D;
            }
            if (row_parent(p, rk, parent_s, r) < 0) break;
        }
    }
    float *q_in = ROPE ? s_s : q_s;                // ROPE: the projection's rows, normed and rotated into q_s
#pragma unroll
    for (int u = 0; u < QN; ++u)
        if (threadIdx.x + u * kThreads < G * D) q_in[threadIdx.x + u * kThreads] = qv[u];
    __syncthreads();
    if constexpr (ROPE) {  // then the new key, where this block reads it, is in its page for the reads below
        rope_block_input(r, row, s_s, q_s, G, table_s, kv_dst, hk, chunk == new_key_chunk(rk.keys, cmin),
                         s_s + G * D);   // past the staged q rows: s_s holds G * kPartition floats
        __syncthreads();
    }
    // Row of local key j in k_pages or v_pages.
    auto key_row = [&](const float *pages_base, int j) {
        return reinterpret_cast<const float4 *>(
            pages_base + key_offset<TREE>(page_off, j, page_shift, page_mask, key_stride));
    };

    if (prefetch) {
        // Into L2: the K and V rows past the first score and value batches (which load at
        // once), so the later batches read L2 instead of waiting on memory.
        const int k_first = PASSES * KEYS_PER_PASS, nk = max(0, n_local - k_first);
        const int v_first = VKEYS * KEY_LANES, nv = max(0, n_local - v_first);
        for (int r = threadIdx.x; r < nk + nv; r += kThreads)  // K rows k_first.., then V rows v_first..
            prefetch_row_l2<D * 4>(key_row(r < nk ? p.k_pages : p.v_pages, r < nk ? k_first + r : v_first + r - nk));
    }

    // Scores: kLanesPerKey lanes per key, each lane C4 float4s of k against every query head;
    // the keys of PASSES passes (KEYS_PER_PASS keys each) are loaded before their dots.
    const int li = threadIdx.x % kLanesPerKey, jt = threadIdx.x / kLanesPerKey;
    for (int base = 0; base < n_local; base += PASSES * KEYS_PER_PASS) {
        float4 kr[PASSES][C4];
#pragma unroll
        for (int u = 0; u < PASSES; ++u) {
            if (base + u * KEYS_PER_PASS >= n_local) break;  // the same for the whole block
            // a lane past the keys loads the last key again; its dot is never stored
            const float4 *src = key_row(p.k_pages, min(base + u * KEYS_PER_PASS + jt, n_local - 1));
#pragma unroll
            for (int c = 0; c < C4; ++c) kr[u][c] = src[c * kLanesPerKey + li];
        }
#pragma unroll
        for (int u = 0; u < PASSES; ++u) {
            const int j = base + u * KEYS_PER_PASS + jt;
            if (base + u * KEYS_PER_PASS >= n_local) break;  // the same for the whole block
#pragma unroll
            for (int g = 0; g < MAXG; ++g) {
                if (g >= G) break;
                const float4 *q4 = reinterpret_cast<const float4 *>(q_s + g * D);
                float dot = 0.0f;
#pragma unroll
                for (int c = 0; c < C4; ++c) {
                    const float4 a = q4[c * kLanesPerKey + li];
                    dot = fmaf(a.x, kr[u][c].x, dot);
                    dot = fmaf(a.y, kr[u][c].y, dot);
                    dot = fmaf(a.z, kr[u][c].z, dot);
                    dot = fmaf(a.w, kr[u][c].w, dot);
                }
#pragma unroll
                for (int m = kLanesPerKey / 2; m > 0; m >>= 1) dot += warp_shfl_xor(dot, m);
                if (j < n_local && li == 0) s_s[g * kPartition + j] = dot * p.scale;
            }
        }
    }
    // Values: thread (key lane kl, float4 column col) sums keys kl, kl + KEY_LANES, ... in
    // that order; VKEYS of them load at a time, the first batch before the softmax.
    const int col = threadIdx.x % COLS, kl = threadIdx.x / COLS;
    float4 vr[VKEYS];
    auto load_values = [&](int j0) {  // a key lane past n_local (never summed): the last key again
#pragma unroll
        for (int u = 0; u < VKEYS; ++u)
            if (j0 - kl + u * KEY_LANES < n_local)  // the same for the whole block
                vr[u] = key_row(p.v_pages, min(j0 + u * KEY_LANES, n_local - 1))[col];
    };
    load_values(kl);
    __syncthreads();

    // Softmax statistics of the partition, one warp per query head.
    const int lane = threadIdx.x % WARP_SIZE;
    for (int g = threadIdx.x / WARP_SIZE; g < G; g += WARPS) {
        const float2 ml = partition_softmax(s_s + g * kPartition, n_local, lane);
        if (lane == 0) { m_s[g] = ml.x; l_s[g] = ml.y; }
    }
    __syncthreads();

    float4 acc[MAXG];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) acc[g] = zero4();
    for (int j0 = kl; j0 < n_local; j0 += VKEYS * KEY_LANES) {
        if (j0 != kl) load_values(j0);
#pragma unroll
        for (int u = 0; u < VKEYS; ++u) {
            const int j = j0 + u * KEY_LANES;
            if (j >= n_local) break;
#pragma unroll
            for (int g = 0; g < MAXG; ++g) {
                if (g >= G) break;
                fma4(s_s[g * kPartition + j], vr[u], acc[g]);
            }
        }
    }
    __syncthreads();  // q_s and s_s are dead: reuse the space for the key-lane sums

    float *red = smem;  // [KEY_LANES][G][D]
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
        if (g >= G) break;
        reinterpret_cast<float4 *>(red + ((int64_t)kl * G + g) * D)[col] = acc[g];
    }
    __syncthreads();
    // A row of one partition merged in this launch: its only block writes the output itself
    // (no workspace, fence, counter, nor re-read), by combine_head's arithmetic (merge_one).
    const int32_t chunks = chunk_count(rk.keys, cmin);
    const bool direct = !CLUSTER && fused && chunks == 1;
    for (int i = threadIdx.x; i < G * D; i += kThreads) {
        float o = red[i];
#pragma unroll
        for (int k = 1; k < KEY_LANES; ++k) o += red[k * G * D + i];
        if (CLUSTER) red[i] = o;  // this thread's own slot: the partial the cluster's blocks read
        else if (direct) p.out[head0 * D + i] = merge_one(o, m_s[i / D], l_s[i / D]);
        else ws.o(row, h0 + i / D, chunk)[i % D] = o;
    }
    if (CLUSTER) {
        cluster_merge(p, row, h0, G, rk.keys, cmin, red, m_s, l_s, chunk, gridDim.z, threadIdx.x, kThreads);
        return;
    }
    if (direct) return;
    if (threadIdx.x < G) {
        float *ml = ws.ml(row, h0 + (int32_t)threadIdx.x, chunk);
        ml[0] = m_s[threadIdx.x];
        ml[1] = l_s[threadIdx.x];
    }
    if (!fused) return;
    // The last of the row's partition blocks of this head group merges them (the
    // threadFenceReduction pattern): every writer fences, then one atomic count per group.
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *count = p.counters + ((int64_t)(row - row0) * gridDim.y + blockIdx.y);
        last = atomicAdd(count, 1) == min(chunks, ws.n_chunks) - 1;
        if (last) *count = 0;  // zero again for the next launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    combine_heads(p, ws, row, h0, G, rk.keys, cmin, threadIdx.x, kThreads);
}

// Block (row, j): heads j * heads_per_block .. of the row (combine_heads: each output's own
// chain, so the heads a block takes change no bit).
__global__ void __launch_bounds__(kThreads)
attention_combine_kernel(luce_attention_params p, int32_t n_parts, int32_t split_rows, int32_t cmin,
                         int32_t heads_per_block) {
    const int32_t row = blockIdx.x, h0 = (int32_t)blockIdx.y * heads_per_block;
    const RowKeys rk = attention_row_keys(p, row);
    if (rk.keys < 0) return;  // padding: nothing written
    const int G = heads_per_block < p.n_heads_q - h0 ? heads_per_block : p.n_heads_q - h0;
    combine_heads(p, workspace_of(p, n_parts, split_rows), row, h0, G, rk.keys, cmin, threadIdx.x, kThreads);
}

// Heads a combine block merges: 512 / D where the launch has prompt rows (a 2,048-row prompt
// chunk of the Coder-1.5B as blocks of one head, 24,576 of them, took 72-83 us on the H200 for
// ~10-40 MB of partials: the blocks' scheduling, not the bytes; docs/PERF.md, session 19), one
// for decode and tree rows alone (a few rows: the heads spread over the SMs).
inline int32_t combine_heads_per_block(int32_t prompt_rows, int32_t head_dim, int32_t n_heads_q) {
    const int32_t hb = head_dim > 0 && 512 / head_dim > 1 ? 512 / head_dim : 1;
    return prompt_rows > 0 ? (hb < n_heads_q ? hb : n_heads_q) : 1;
}

// Rows of a launch that take the prompt kernel and its compact workspace entries: its prompt
// rows where that kernel fits the device, else none (the partition kernel takes them).
int32_t split_rows_for(int32_t prompt_rows, int32_t head_dim) {
    return prompt_rows > 0 && tiled_attention_fits(head_dim) ? prompt_rows : 0;
}

}  // namespace

#include "attention_launch.cuh"  // launch_attention_d: the grid, form and merge of a launch

extern "C" int64_t luce_attention_workspace_bytes(int32_t n_rows, int32_t prompt_rows, int32_t n_heads_q,
                                                  int32_t head_dim, int32_t max_kv_len, int32_t n_heads_kv,
                                                  int32_t page_size, int64_t n_kv_indices) {
    if (n_rows < 0 || prompt_rows < 0 || prompt_rows > n_rows || n_heads_q < 0 || head_dim < 0 || n_heads_kv < 0 ||
        page_size < 0 || n_kv_indices < 0)
        return -1;
    const int32_t split_rows = split_rows_for(prompt_rows, head_dim);
    const Workspace ws{nullptr, n_rows, split_rows, n_heads_q, head_dim, parts_for(max_kv_len),
                       chunk_grid(max_kv_len, chunk_floor(head_dim))};
    const int64_t stage_rows = split_rows > 0 ? tiled_attention_stage_rows(head_dim, page_size, n_kv_indices) : 0;
    return workspace_bytes_with_stage(ws, stage_rows, n_heads_kv);
}

// luce_attention, or with rope its fused decode form (luce_rope_kv_attention).
static int attention_launch(const luce_attention_params *p, void *stream, const luce_rope_kv_params *rope) {
    if (p->n_rows == 0) return 0;
    const int32_t ps = p->page_size;
    const bool bad_shape = p->n_rows < 0 || p->n_segments <= 0 || p->n_heads_kv <= 0 ||
        p->n_heads_q <= 0 || p->n_heads_q % p->n_heads_kv != 0 ||
        p->n_heads_q / p->n_heads_kv > kMaxGroup || p->n_heads_q > 65535 ||
        ps <= 0 || (ps & (ps - 1)) != 0 || ps > kPartition || p->max_kv_len < 0 ||
        p->prompt_rows < 0 || p->prompt_rows > p->n_rows;
    if (bad_shape) return (int)cudaErrorInvalidValue;
    const int32_t n_parts = parts_for(p->max_kv_len);
    if (n_parts > 65535) return (int)cudaErrorInvalidValue;
    const int32_t row0 = split_rows_for(p->prompt_rows, p->head_dim);
    const int64_t stage_rows = row0 > 0 ? tiled_attention_stage_rows(p->head_dim, ps, p->n_kv_indices) : 0;
    if (p->workspace == nullptr || p->n_kv_indices < 0 ||
        p->workspace_bytes < workspace_bytes_with_stage(workspace_of(*p, n_parts, row0), stage_rows, p->n_heads_kv))
        return (int)cudaErrorInvalidValue;
    const uintptr_t addr_bits = (uintptr_t)p->k_pages | (uintptr_t)p->v_pages |
                                (uintptr_t)p->workspace;
    if (addr_bits % 16 != 0) return (int)cudaErrorInvalidValue;  // rows move as float4
    int32_t page_shift = 0;
    while ((1 << page_shift) < ps) ++page_shift;
    const cudaStream_t s = (cudaStream_t)stream;
    const luce_attention_params &q = *p;
    switch (p->head_dim) {
        case 64: return launch_attention_d<64>(q, n_parts, row0, page_shift, s, rope);
        case 128: return launch_attention_d<128>(q, n_parts, row0, page_shift, s, rope);
        case 256:  // no fused input (luce_rope_kv_attention refuses D = 256)
            return rope ? (int)cudaErrorInvalidValue : launch_attention_d<256>(q, n_parts, row0, page_shift, s, rope);
        default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int luce_attention(const luce_attention_params *p, void *stream) {
    return attention_launch(p, stream, nullptr);
}

extern "C" int luce_rope_kv_attention(const luce_rope_kv_params *r, const luce_attention_params *p, void *stream) {
    if (!rope::params_valid(*r) || r->n_pos != 1 || r->rows != p->n_rows || r->heads_q != p->n_heads_q ||
        r->heads_kv != p->n_heads_kv || r->head_dim != p->head_dim || (p->head_dim != 64 && p->head_dim != 128) ||
        (r->q_head_stride != 0 && r->q_head_stride != r->head_dim) ||  // a block's q heads are read as one run
        p->prompt_rows != 0 || p->tree_parents != nullptr || !p->causal)
        return (int)cudaErrorInvalidValue;
    return attention_launch(p, stream, r);
}
