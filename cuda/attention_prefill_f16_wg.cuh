// The warpgroup form of the staged f16 prompt-row kernel (LUCE_ATTN_PROMPT=f16g; sm_90a, D = 64
// or 128): the long form's blocks (cuda/attention_prefill_f16_long.cuh: runs of splits, a
// cp.async ring of key blocks, partials per split) with the two products on Hopper warpgroup
// MMAs (cuda/wgmma_f16.cuh) instead of mma.sync and ldmatrix:
//   - a block is one warpgroup (4 warps, a tile of 64 query vectors, warp w its m-tile 16w..);
//     Q's A fragments stay in registers as in the long form;
//   - S = q16 K^T: D/16 wgmma m64n64k16, B = the key block in shared memory as D/64 swizzled
//     tiles [64 keys][64 dims] (K-major: a key's 64 dims are one 128-byte row);
//   - the online softmax is f16_softmax on S, which per warp is the long form's s [8][4];
//   - o += f16(e) V: 4 wgmma m64nDk16 (A = the softmax's P fragments in registers), B = the key
//     block's V^T [D dims][64 keys], one 128-byte row a dim. This form's pre-pass
//     (attention_stage_kvt_kernel) stages K as the others do and V transposed: V16T
//     [Hkv][D][rows] where the other forms have V16 [Hkv][rows][D].
// Every output element is the mma.sync chain's (wgmma gives mma.sync's bits on the H200:
// test_f16_wgmma_bits_are_the_mma_bits), in the same order: s over D in 16-dim steps from zero,
// o over the block's keys in 16-key steps; masks, softmax and partials are the other forms'
// functions, so every form gives the same bits. A block skips a key block only where no row of
// its 64 vectors has keys there (a warpgroup issues its MMAs together); for a warp whose rows
// end before it the block is an exact no-op (a = 1, e = 0), as in the wide form.
// Why (docs/PERF.md, session 19): at 12K keys the Coder-1.5B's prompt attention ran at ~220
// TFLOP/s on mma.sync, whose K / V fragments each warp reads from shared memory by ldmatrix
// (32 KB a warp and key block); here the tensor cores read B from shared memory themselves.
// The copies of a key block are cp.async (16 a thread at D = 128); each thread fences them to the
// async proxy (the MMAs' operand reads) before the barrier that hands the block over.
// LUCE_ATTN_WG_OVERLAP=1 (3 stages, two S register sets): a step runs block b's softmax stats and
// o *= a, issues block b + 1's Q K^T, then block b's exps (the MUFU work) while the tensor cores
// run it, then P V; a split's first block has no S ahead. No accumulator is written while a wgmma
// is in flight (o's scale before the issue; an S set zeroed after the wait that ends its use):
// ptxas serializes every wgmma otherwise (C7515).
// Shared memory: STAGES x (K 128 D + V^T 128 D bytes) + 1 KB for the 1,024-byte alignment the
// swizzle needs: D = 128, 2 stages: 66,560 (x3 an SM, 12 warps), 3 (LUCE_ATTN_WG_STAGES=3):
// 99,328 (x2); Q passes through the last stage before its first key block lands. Elsewhere (not
// sm_90a) the kernel is empty and the launch never takes it; the host emulator runs it
// (LUCE_WGMMA_HOST). sm_90a ptxas (CUDA 13.0): D = 128 168 registers (3 stages 188, overlapped
// 210), D = 64 106 (overlapped 154), no spill; per key block a thread issues ~145 instructions of
// copies and ~400 of products and softmax (12 HGMMA), against ~500 with 128 HMMA and 55 LDSM a
// warp in the 6-warp long form.
#pragma once

#include "attention_prefill_f16_long.cuh"
#include "wgmma_f16.cuh"

namespace luce_attn {
namespace {

template <int D, int STAGES>
struct F16Wg {
    using S = F16Shape<D>;
    static constexpr int kWarps = 4, kThreads = kWarps * WARP_SIZE, kTileQV = 16 * kWarps;
    static constexpr int kAtom = 64 * 128;               // one swizzled tile: 64 rows of 128 bytes
    static constexpr int kKBytes = (D / 64) * kAtom;     // K block [64 keys][D]
    static constexpr int kVBytes = D * 128;              // V^T block [D dims][64 keys]
    static constexpr int kStageBytes = kKBytes + kVBytes;
    static constexpr size_t kSmemBytes = 1024 + (size_t)STAGES * kStageBytes;
    static constexpr int kMinBlocks = STAGES == 2 ? 3 : 2;
    static constexpr size_t kStaticBytes = sizeof(int32_t) * (3 * kTileQV + 2 * kWarps + 14);
    static_assert(D == 64 || D == 128, "m64n64 / m64n128 products and one 128-byte V^T row a dim");
    static_assert(S::kBlockKeys == 64, "a key block is one 128-byte V^T row");
    static_assert(kTileQV * S::kStride * (int)sizeof(uint16_t) <= kStageBytes, "Q passes through one stage");
};

// 16 bytes of which the first `bytes` (0..16) from global memory, the rest zeros (bytes 0: src
// not read).
__device__ __forceinline__ void cp_async16_part(void *dst, const void *src, int bytes) {
#ifdef LUCE_MMA_F16_NATIVE
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes));
#else
    uint8_t *d = reinterpret_cast<uint8_t *>(dst);
    for (int i = 0; i < 16; ++i) d[i] = i < bytes ? reinterpret_cast<const uint8_t *>(src)[i] : 0;
#endif
}

// The pre-pass of this form: K as f16_stage_kv's, V transposed: V16T [Hkv][D][st.rows] (8 rows of
// one dim an item, consecutive dims on consecutive threads: the f32 reads coalesce).
template <int D>
__device__ __forceinline__ void f16_stage_vt(const luce_attention_params &p, const StagedKv &st, int32_t page_shift) {
    const int32_t last = attention_segment_of(p, p.prompt_rows - 1);
    const int64_t rows = min((int64_t)p.kv_indptr[last + 1] << page_shift, st.rows);
    const int64_t items = (rows + 7) / 8 * p.n_heads_kv * D, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += step) {
        const int32_t d = (int32_t)(i % D), hk = (int32_t)((i / D) % p.n_heads_kv);
        const int64_t r0 = 8 * (i / ((int64_t)D * p.n_heads_kv));
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            float x[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int64_t r = r0 + j + e;
                x[e] = 0.0f;
                if (r < rows) {
                    const int64_t page = p.kv_indices[r >> page_shift];
                    x[e] = p.v_pages[(((page << page_shift) + (r & ((1 << page_shift) - 1))) * p.n_heads_kv + hk) * D + d];
                }
            }
            h[j / 2] = tc::pack_f16x2(x[0], x[1]);
        }
        *reinterpret_cast<uint4 *>(st.v + ((int64_t)hk * D + d) * st.rows + r0) = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

// The run's first key in dim 0's row of V16T, from its first key k in K16 (the same staged row;
// the head's row 0 for a run without staged data, as staged_source gives k).
template <int D>
__device__ __forceinline__ const uint16_t *staged_vt(const StagedKv &st, const uint16_t *k, int32_t hk) {
    const int64_t row = (k - st.k) / D - (int64_t)hk * st.rows;
    return st.v + ((int64_t)hk * D * st.rows + row);
}

// Key block at key j0 of the run into `stage` (this form's layout above; zeros past n_ok): K
// unit u of key n at tile u / 8, swizzled unit u % 8 of row n; V^T keys j0 + 8u.. of dim d at
// swizzled unit u of row d. k: the run's first key in K16 (V^T: staged_vt). Thread i copies K unit
// i % (D / 8) of keys i / (D / 8) + R j (R = 128 / (D / 8) = 8 or 16) and V^T unit i % 8 of dims
// i / 8 + 16 j: its swizzle (row % 8) is the same for every j.
template <int D>
__device__ __forceinline__ void f16g_copy_block(const StagedKv &st, const uint16_t *k, int32_t hk, int32_t n_ok,
                                                int32_t j0, uint8_t *stage) {
    using W = F16Wg<D, 2>;
    constexpr int C = D / 8, R = W::kThreads / C, N = D / 16;  // N: copies of each a thread
    static_assert(R % 8 == 0, "a thread's rows share their swizzle");
    const int tid = (int)threadIdx.x, n0 = tid / C, u = tid % C, d0 = tid / 8, v = tid % 8;
    uint8_t *kd = stage + (u / 8) * W::kAtom + wg::swizzle_unit(n0, u % 8);
    const uint16_t *ks = k + ((int64_t)(j0 + n0) * D + 8 * u);
    uint8_t *vd = stage + W::kKBytes + wg::swizzle_unit(d0, v);
    const int64_t vt_stride = st.rows;
    const uint16_t *vs = staged_vt<D>(st, k, hk) + ((int64_t)d0 * vt_stride + j0 + 8 * v);
    const int32_t left = n_ok - (j0 + 8 * v);
    const int v_bytes = left >= 8 ? 16 : left > 0 ? 2 * left : 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        cp_async16(kd + j * R * 128, ks + (int64_t)j * R * D, j0 + n0 + R * j < n_ok);
        cp_async16_part(vd + j * 16 * 128, vs + (int64_t)j * 16 * vt_stride, v_bytes);
    }
}

#if defined(LUCE_WGMMA) || defined(LUCE_WGMMA_HOST)
// One block-uniform piece (the long form's f16l_prompt_piece with one warpgroup): rows
// r0 = run->next .. r1 - 1 of one segment, splits s0..s1-1; sets run->next = r1. smem: the
// 1,024-byte aligned stages.
template <int D, int STAGES, bool OVL>
__device__ void f16g_prompt_piece(const luce_attention_params &p, const StagedKv &st, int32_t G, int32_t hk,
                                  int32_t s0, int32_t s1, int32_t n_parts, uint8_t *smem, int32_t *row_keys,
                                  int32_t *row_n, int32_t *row_state, F16LongRun<4> *run) {
    using S = F16Shape<D>;
    using W = F16Wg<D, STAGES>;
    constexpr int NT = S::kKeyTiles, B = S::kBlockKeys;
    const int32_t r0 = run->next, r1 = min(run->end, p.qo_indptr[attention_segment_of(p, r0) + 1]);
    const int nq = (r1 - r0) * G;
    uint16_t *q_s = reinterpret_cast<uint16_t *>(smem + (STAGES - 1) * W::kStageBytes);

    f16l_piece_start<D, W::kTileQV>(p, st, hk, s0, s1, r0, r1, row_keys, row_state, run);
    const int n_blocks = run->n_blocks;
#pragma unroll
    for (int b = 0; b < STAGES - 1; ++b) {
        if (b < n_blocks) f16g_copy_block<D>(st, run->k, hk, run->n_ok, b * B, smem + b * W::kStageBytes);
        cp_async_commit();
    }
    uint32_t qf[D / 16][4];
    if (n_blocks > 0) {
        f16l_store_q<D, W::kTileQV, W::kThreads>(p, G, r0, hk, nq, q_s);
        __syncthreads();
        const int32_t q_off = f16_q_off<D>();
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) tc::ldmatrix_x4(qf[kd], q_s + (q_off + 16 * kd));
    }
    const int warp = (int)(threadIdx.x / WARP_SIZE);
    // S of key block bb (landed: after its turn's barrier) into sc (zeros: each step zeroes its S
    // after the wait that ends its stage, so no accumulator is written while a wgmma runs), in
    // flight (committed).
    const auto zero = [](float (&sc)[NT][4]) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
    };
    const auto issue_scores = [&](float (&sc)[NT][4], int bb) {
        const uint8_t *stage = smem + (bb % STAGES) * W::kStageBytes;
        wg::fence();
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd)
            wg::mma_64x64x16(sc, qf[kd], wg::desc_sw128(stage + (kd / 4) * W::kAtom + 32 * (kd % 4)));
        wg::commit();
    };
    // Block bb's turn in the ring: its copies (OVL: and bb + 1's) landed everywhere, every MMA of
    // the turn before ended; then block bb + STAGES - 1's copies go out (into the stage that
    // turn read).
    const auto turn = [&](int bb) {
        cp_async_wait<OVL ? 0 : STAGES - 2>();
        wg::fence_proxy_async();  // this thread's copies, seen by the MMAs after the barrier
        __syncthreads();
        if (bb + STAGES - 1 < run->n_blocks)
            f16g_copy_block<D>(st, run->k, hk, run->n_ok, (bb + STAGES - 1) * B,
                               smem + ((bb + STAGES - 1) % STAGES) * W::kStageBytes);
        cp_async_commit();
    };
    int b = 0;
    for (int32_t s = s0; s < s1; ++s) {
        const int32_t key0 = s * kSplitKeys;
        if (key0 >= run->n_any) break;
        if (threadIdx.x < W::kTileQV) row_n[threadIdx.x] = min(kSplitKeys, row_keys[threadIdx.x] - key0);
        __syncthreads();
        F16Warp<D> w(row_n, row_state, (run->piece_end - run->next) * run->group, run->group);
        if (threadIdx.x % WARP_SIZE == 0) run->warp[warp][0] = w.n_warp, run->warp[warp][1] = w.n_warp_min;
        const int32_t b_first = b, b_end = min(b_first + kSplitKeys / B, run->n_blocks);
        // Whether block bb of the split is attended by a row of the tile (block-uniform; a prefix).
        const auto live = [&](int bb) {
            const int32_t n_block = max(max(run->warp[0][0], run->warp[1][0]), max(run->warp[2][0], run->warp[3][0]));
            return bb < b_end && (bb - b_first) * B < n_block;
        };
        bool have = false;  // OVL: the current block's S is in flight or done (issued the turn before)
        // Block bb with its S in cur (OVL: issued the turn before, where `have`); OVL issues block
        // bb + 1's S into next before the softmax, so the tensor cores run it meanwhile.
        const auto step = [&](int bb, float (&cur)[NT][4], float (&next)[NT][4]) {
            turn(bb);
            w.n_warp = run->warp[warp][0], w.n_warp_min = run->warp[warp][1];
            if (!live(bb)) return;
            if (!have) {  // (OVL: the turn before issued it, and its last wait ended it)
                issue_scores(cur, bb);
                wg::wait<0>();
            }
            wg::fence_operands(cur);
            uint32_t pa[NT / 2][4];
            float mx[2], alpha[2];
            f16_softmax_stats<D>(cur, (bb - b_first) * B, w, mx, alpha);
            f16_softmax_scale<D>(w, alpha);  // o's last write before the MMAs below (ptxas: no
                                             // accumulator defined while a wgmma is in flight)
            have = OVL && live(bb + 1);
            if (have) issue_scores(next, bb + 1);  // runs on the tensor cores during the exps
            f16_softmax_exp<D>(cur, mx, w, pa);
            wg::fence();  // the softmax wrote o and P before the MMAs read them
            const uint8_t *stage = smem + (bb % STAGES) * W::kStageBytes;
#pragma unroll
            for (int kk = 0; kk < NT / 2; ++kk) {
                const uint64_t v = wg::desc_sw128(stage + W::kKBytes + 32 * kk);
                if constexpr (D == 128)
                    wg::mma_64x128x16(w.o, pa[kk], v);
                else
                    wg::mma_64x64x16(w.o, pa[kk], v);
            }
            wg::commit();
            wg::wait<0>();  // before the next turn's barrier, after which this stage may refill
            wg::fence_operands(w.o);
            if constexpr (OVL) wg::fence_operands(next);
            zero(cur);  // for its next S
        };
        float sc0[NT][4];
        zero(sc0);
        if constexpr (OVL) {
            float sc1[NT][4];
            zero(sc1);
            for (; b < b_end; b += 2) {  // two steps a pass: cur and next swap without a copy
                step(b, sc0, sc1);
                if (b + 1 < b_end) step(b + 1, sc1, sc0);
            }
        } else {
            for (; b < b_end; ++b) step(b, sc0, sc0);  // next is never issued
        }
        b = b_end;
        const int32_t r0w = run->next, gw = run->group, nqw = (run->piece_end - r0w) * gw;
        f16_write_warp<D>(p, w, gw, r0w, blockIdx.y, s, n_parts);
        f16_write_end<W::kThreads>(p, gw, r0w, blockIdx.y, s, n_parts, nqw, row_n, row_state);  // ends with a sync
    }
    cp_async_wait<0>();
    if (threadIdx.x == 0) run->next = run->piece_end;
    __syncthreads();
}
#endif

// The kernels: this form's pre-pass (K, then V transposed), then its tiles as the long form's
// (grid z: runs of per_block splits; empty where the build has no sm_90a code: the launch does
// not take it there).
template <int D>
__global__ void __launch_bounds__(256) attention_stage_kvt_kernel(luce_attention_params p, StagedKv st,
                                                                  int32_t page_shift) {
    f16_stage_kv<D, false>(p, st, page_shift);
    f16_stage_vt<D>(p, st, page_shift);
}

template <int D, int STAGES, bool OVL>
__global__ void __launch_bounds__(F16Wg<D, STAGES>::kThreads, F16Wg<D, STAGES>::kMinBlocks)
attention_prompt_f16g_kernel(luce_attention_params p, StagedKv st, int32_t n_parts, int32_t per_block, int32_t G) {
#if defined(LUCE_WGMMA) || defined(LUCE_WGMMA_HOST)
    using W = F16Wg<D, STAGES>;
    extern __shared__ float4 smem4[];
    __shared__ int32_t row_keys[W::kTileQV], row_n[W::kTileQV], row_state[W::kTileQV];
    __shared__ F16LongRun<W::kWarps> run;
    const int32_t s0 = (int32_t)blockIdx.z * per_block, s1 = min(s0 + per_block, prompt_splits(n_parts));
    const int32_t rows_per_tile = W::kTileQV / G;
    if (threadIdx.x == 0) {
        run.next = (int32_t)blockIdx.x * rows_per_tile;
        run.end = min(run.next + rows_per_tile, p.prompt_rows);
        run.group = G;
    }
    __syncthreads();
    uint8_t *smem = wg::align_1024(reinterpret_cast<uint8_t *>(smem4));
    while (run.next < run.end)
        f16g_prompt_piece<D, STAGES, OVL>(p, st, G, blockIdx.y, s0, s1, n_parts, smem, row_keys, row_n, row_state, &run);
#else
    (void)p, (void)st, (void)n_parts, (void)per_block, (void)G;
#endif
}

// The warpgroup form's ring: LUCE_ATTN_WG_STAGES (read once) 3, else 2 (two blocks an SM with 3,
// three with 2); LUCE_ATTN_WG_OVERLAP=1 (read once, 3 stages): each key block's Q K^T is issued
// before the softmax of the block ahead, so the tensor cores run it meanwhile (two S register
// sets). Only the timing depends on them.
inline int wg_variant() {  // 2, 3 (stages) or 4 (3 stages, overlapped)
    static const int v = [] {
        const char *o = getenv("LUCE_ATTN_WG_OVERLAP"), *s = getenv("LUCE_ATTN_WG_STAGES");
        return o && atoi(o) == 1 ? 4 : s && atoi(s) == 3 ? 3 : 2;
    }();
    return v;
}

// Whether the warpgroup form <D, STAGES, OVL> runs here, decided once (D 64 / 128, sm_90a code for
// the device, its shared memory).
template <int D, int STAGES, bool OVL>
bool prompt_f16g_fits() {
    using W = F16Wg<D, STAGES>;
    static int ready = 0;
    if (ready == 0) {
        auto kernel = attention_prompt_f16g_kernel<D, STAGES, OVL>;
#ifdef LUCE_MMA_F16_HOST
        const bool arch = true;  // the host emulator runs it
#else
        cudaFuncAttributes attr{};
        const bool arch = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
        (void)cudaGetLastError();
#endif
        ready = arch ? prepare_smem(kernel, W::kSmemBytes, W::kStaticBytes) : -1;
#if defined(__CUDACC__)
        if (ready > 0 && cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess)
            (void)cudaGetLastError();
#endif
    }
    return ready > 0;
}

template <int D>
bool prompt_f16g_ready() {
    if constexpr (D != 64 && D != 128)
        return false;
    else
        return wg_variant() == 4   ? prompt_f16g_fits<D, 3, true>()
               : wg_variant() == 3 ? prompt_f16g_fits<D, 3, false>()
                                   : prompt_f16g_fits<D, 2, false>();
}

// The warpgroup form's tiles (64 / G rows), KV heads and runs of splits, after its pre-pass.
template <int D, int STAGES, bool OVL>
int launch_prompt_f16g(const luce_attention_params &p, const StagedKv &st, int32_t n_parts, cudaStream_t stream) {
    using W = F16Wg<D, STAGES>;
    auto kernel = attention_prompt_f16g_kernel<D, STAGES, OVL>;
    static int64_t slots = -1;  // blocks the device holds at once (asked once; 0 unknown)
    if (slots < 0) {
        int device = 0, sms = 0, per_sm = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, W::kThreads, W::kSmemBytes) != cudaSuccess)
            sms = per_sm = 0;
        (void)cudaGetLastError();
        slots = (int64_t)sms * per_sm;
    }
    const int32_t G = p.n_heads_q / p.n_heads_kv, rows_per_tile = W::kTileQV / G;
    const int64_t tiles = (p.prompt_rows + rows_per_tile - 1) / rows_per_tile;
    const int32_t splits = prompt_splits(n_parts);
    const int32_t per_block = f16l_per_block(tiles * p.n_heads_kv, splits, slots);
    const dim3 grid((unsigned)tiles, (unsigned)p.n_heads_kv, (unsigned)((splits + per_block - 1) / per_block));
    kernel<<<grid, W::kThreads, W::kSmemBytes, stream>>>(p, st, n_parts, per_block, G);
    return luce_status(cudaGetLastError());
}

template <int D>
int launch_prompt_f16g(const luce_attention_params &p, const StagedKv &st, int32_t n_parts, cudaStream_t stream) {
    return wg_variant() == 4   ? launch_prompt_f16g<D, 3, true>(p, st, n_parts, stream)
           : wg_variant() == 3 ? launch_prompt_f16g<D, 3, false>(p, st, n_parts, stream)
                               : launch_prompt_f16g<D, 2, false>(p, st, n_parts, stream);
}

}  // namespace
}  // namespace luce_attn
