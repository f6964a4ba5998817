// Host launch of the partition kernel (cuda/attention.cu, included after the kernels): the
// grid, shared memory and form of a launch's non-prompt rows, then the merge they need.
#pragma once

namespace {

// clustered: the cluster form where the device takes it (then *merged: no workspace merge follows).
template <int D, int MAXG>
int launch_partitions(const luce_attention_params &p, int32_t n_parts, int32_t page_shift, int32_t row0, int gh,
                      int32_t cmin, cudaStream_t stream, const luce_rope_kv_params *rope, bool clustered, bool *merged) {
    const bool prefetch = prefetch_fits((int64_t)(p.n_rows - row0) * p.n_heads_kv * p.max_kv_len * D * 8);
    const int groups = (p.n_heads_q / p.n_heads_kv + gh - 1) / gh;
    const int key_lanes = kThreads / (D / 4);
    const size_t smem = sizeof(float) * (size_t)(partition_smem_head(D, MAXG) +
                                                 max(gh * D + gh * kPartition, key_lanes * gh * D));
    const dim3 grid((unsigned)(p.n_rows - row0), (unsigned)(p.n_heads_kv * groups), (unsigned)chunk_grid(p.max_kv_len, cmin));
    // Overlapped with the kernel ahead (rope_kv, or the q|k|v matmul when fused) where no prompt kernel runs first.
    const bool overlap = chain_overlap(D <= 128 ? kPdlAttn : kPdlAttnWide) && row0 == 0;
    const luce_rope_kv_params r = rope ? *rope : luce_rope_kv_params{};
#if !defined(__HIPCC__)
    if constexpr (D <= 128) {
        constexpr auto k_rope = attention_partition_kernel<D, MAXG, false, true, true>;
        constexpr auto k_plain = attention_partition_kernel<D, MAXG, false, false, true>;
        constexpr auto k_tree = attention_partition_kernel<D, MAXG, true, false, true>;  // tree_cluster_form
        const bool tree = p.tree_parents != nullptr;
        const bool fits = rope ? cluster::fits<k_rope>(grid.z, kThreads, smem)
                          : tree ? cluster::fits<k_tree>(grid.z, kThreads, smem)
                                 : cluster::fits<k_plain>(grid.z, kThreads, smem);
        if (clustered && fits) {
            *merged = true;
            return luce_status(cluster::launch(rope ? k_rope : tree ? k_tree : k_plain, grid, dim3(kThreads), smem,
                                               stream, overlap, grid.z, p, n_parts, page_shift, row0, gh, cmin,
                                               prefetch, r));
        }
    }
#endif
    if constexpr (D <= 128)  // the fused decode input (luce_rope_kv_attention): D 64 and 128
        if (rope)
            return luce_status(launch_overlapped(attention_partition_kernel<D, MAXG, false, true, false>, grid,
                                                 dim3(kThreads), smem, stream, overlap, p, n_parts, page_shift, row0,
                                                 gh, cmin, prefetch, r));
    return luce_status(p.tree_parents != nullptr
        ? launch_overlapped(attention_partition_kernel<D, MAXG, true, false, false>, grid, dim3(kThreads), smem, stream,
                            overlap, p, n_parts, page_shift, row0, gh, cmin, prefetch, r)
        : launch_overlapped(attention_partition_kernel<D, MAXG, false, false, false>, grid, dim3(kThreads), smem, stream,
                            overlap, p, n_parts, page_shift, row0, gh, cmin, prefetch, r));
}

// Rows 0..row0-1 take the prompt kernel (row0 = p.prompt_rows where it fits the device, else 0),
// rows row0.. the partition kernel; the workspace is workspace_of(p, n_parts, row0).
template <int D>
int launch_attention_d(const luce_attention_params &p, int32_t n_parts, int32_t row0, int32_t page_shift,
                       cudaStream_t s, const luce_rope_kv_params *rope) {
    const int32_t cmin = chunk_min_for(D, p.page_size);
    if (row0 > 0) {
        const int status = launch_tiled_attention(p, n_parts, page_shift, s);
        if (status != 0) return status;
    }
    if (row0 < p.n_rows) {
        const int G = p.n_heads_q / p.n_heads_kv;
        const int32_t z = chunk_grid(p.max_kv_len, cmin);
        const bool cl = D <= 128 && row0 == 0 && (!p.tree_parents || tree_cluster_form(p.n_rows)) && z >= 2 &&
                        z <= kMaxCluster && decode_cluster_form();
        const int gh = group_heads_for(G, (int64_t)(p.n_rows - row0) * p.n_heads_kv * z, cl ? cluster_group_floor(G) : 1);
        const int64_t counts = (int64_t)p.n_rows * p.n_heads_kv * ((G + gh - 1) / gh);
        luce_attention_params q = p;
        const bool fused = row0 == 0 && p.counters != nullptr && counts <= p.n_counters;
        if (!fused) q.counters = nullptr;
        bool merged = false;
        int status;
        if (gh <= 1) status = launch_partitions<D, 1>(q, n_parts, page_shift, row0, gh, cmin, s, rope, cl, &merged);
        else if (gh <= 2) status = launch_partitions<D, 2>(q, n_parts, page_shift, row0, gh, cmin, s, rope, cl, &merged);
        else if (gh <= 4) status = launch_partitions<D, 4>(q, n_parts, page_shift, row0, gh, cmin, s, rope, cl, &merged);
        else if (gh <= 8) status = launch_partitions<D, 8>(q, n_parts, page_shift, row0, gh, cmin, s, rope, cl, &merged);
        else status = launch_partitions<D, kMaxGroup>(q, n_parts, page_shift, row0, gh, cmin, s, rope, cl, &merged);
        if (status != 0 || fused || merged) return status;
    }
    const int32_t hb = combine_heads_per_block(row0, D, p.n_heads_q);
    attention_combine_kernel<<<dim3((unsigned)p.n_rows, (unsigned)((p.n_heads_q + hb - 1) / hb)), kThreads, 0, s>>>(
        p, n_parts, row0, cmin, hb);
    return luce_status(cudaGetLastError());
}

}  // namespace
