// The staged form of the f16 prompt-row kernel (cuda/attention_prefill_f16.cuh: its arithmetic
// and per-warp counts; kernels and launch at the end of cuda/attention_prefill.cu).
// A pre-pass (f16_stage_kv) converts the launch's prompt keys once: every KV row of the
// prompt segments' pages (kv_indices entries 0..kv_indptr[last prompt segment + 1] - 1), K and
// V of every KV head, f32 -> f16 by the paged form's rounding (cvt.rn, nearest even), into the
// workspace (StagedKv, attention_common.cuh: K16 then V16 [Hkv][n_kv_indices * page_size][D],
// row = kv_indices entry * page_size + slot, so a segment's keys are consecutive rows). The
// tile blocks then copy f16 key blocks straight into shared memory (cp.async, 16 bytes,
// STAGES-deep ring; zero-filled past the tile's keys), with no per-tile load, conversion or
// page-table read; the MMAs and the online softmax are the paged form's functions, so a row's
// bits are the same in either form.
// Per block and key block (D = 128, B = 64, 8 warps): 2 * 16 KiB of f16 from L2 (half the
// paged form's f32 bytes, 128 FLOP/byte) in 8 cp.async a thread; per warp 128 MMAs, 64
// ldmatrix.x4 (Q's fragments stay in registers at D <= 128: 32 registers) and the softmax.
// Shared memory, rows of D + 8 halves: STAGES buffers of K [B] then V [B] rows, each as large
// as the Q tile [kTileQV]; at D <= 128 Q passes through the last buffer into registers before
// that buffer's first block lands, at D = 256 Q keeps its own tile (ldmatrix'd each block).
// Bytes: D = 128: 34,816 a buffer (3: 104,448 on sm_80/sm_90; 2: 69,632 on 99 KiB cards);
// D = 256: 33,792 + 2 buffers = 101,376 (two 128-thread blocks an SM on sm_90; more than the
// 99 KiB cards hold: they take the paged form); D = 64: 18,432 a buffer.
#pragma once

#include "attention_prefill_f16.cuh"

namespace luce_attn {
namespace {

// 16 bytes global -> shared without registers (src_ok false: zeros); commit / wait_group
// order them. Elsewhere (HIP, the host emulator) a plain copy: done at once.
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool src_ok) {
#ifdef LUCE_MMA_F16_NATIVE
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(src_ok ? 16 : 0));
#else
    *reinterpret_cast<uint4 *>(dst) = src_ok ? *reinterpret_cast<const uint4 *>(src) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef LUCE_MMA_F16_NATIVE
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>  // wait until at most N of this thread's groups are in flight
__device__ __forceinline__ void cp_async_wait() {
#ifdef LUCE_MMA_F16_NATIVE
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

template <int D>
struct F16Staged {
    using S = F16Shape<D>;
    static constexpr bool kQRegs = D <= 128;                         // Q's A fragments in registers
    static constexpr int kBufHalves = 2 * S::kBlockKeys * S::kStride;  // K then V rows of one block
    static constexpr int kChunks = D / 8;                            // 16-byte pieces of a row
    static constexpr int kCopies = 2 * S::kBlockKeys * kChunks / S::kThreads;  // cp.async a thread a block
    static constexpr int kMaxStages = D >= 256 ? 2 : 3;
    static constexpr int min_blocks() { return D >= 256 ? 2 : 1; }
    static constexpr size_t smem_bytes(int stages) {
        return sizeof(uint16_t) * (size_t)((kQRegs ? 0 : S::kTileQV * S::kStride) + stages * kBufHalves);
    }
    static constexpr size_t kStaticBytes = 2 * sizeof(int32_t) * S::kTileQV;
    static_assert(S::kTileQV * S::kStride == kBufHalves, "Q passes through one K / V buffer");
    static_assert((2 * S::kBlockKeys * kChunks) % S::kThreads == 0, "threads tile a block's copies");
};

// Pre-pass over rows [0, rows of the prompt segments) of st (grid-stride; 8 values an item):
// f16(K), f16(V) of every KV head (V false: K only; the warpgroup form stages V transposed).
template <int D, bool V = true>
__device__ __forceinline__ void f16_stage_kv(const luce_attention_params &p, const StagedKv &st, int32_t page_shift) {
    constexpr int C = D / 8;
    const int32_t last = attention_segment_of(p, p.prompt_rows - 1);
    const int64_t rows = min((int64_t)p.kv_indptr[last + 1] << page_shift, st.rows);
    const int64_t items = rows * p.n_heads_kv * C, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += step) {
        const int64_t r = i / (p.n_heads_kv * C);
        const int32_t hk = (int32_t)((i / C) % p.n_heads_kv), c = (int32_t)(i % C);
        const int64_t page = p.kv_indices[r >> page_shift];
        const int64_t src = (((page << page_shift) + (r & ((1 << page_shift) - 1))) * p.n_heads_kv + hk) * D + 8 * c;
        const int64_t dst = ((int64_t)hk * st.rows + r) * D + 8 * c;
#pragma unroll
        for (int kv = 0; kv < (V ? 2 : 1); ++kv) {
            const float4 *x = reinterpret_cast<const float4 *>((kv ? p.v_pages : p.k_pages) + src);
            const float4 a = x[0], b = x[1];
            const uint4 h = make_uint4(tc::pack_f16x2(a.x, a.y), tc::pack_f16x2(a.z, a.w), tc::pack_f16x2(b.x, b.y),
                                       tc::pack_f16x2(b.z, b.w));
            *reinterpret_cast<uint4 *>((kv ? st.v : st.k) + dst) = h;
        }
    }
}

// Sets a kernel's shared-memory limit (before any graph capture reaches here): 1 when `smem`
// dynamic and `static_bytes` static bytes fit the device, -1 when not (or on error).
template <class K>
int prepare_smem(K kernel, size_t smem, size_t static_bytes) {
    int device = 0, optin = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess && (size_t)optin < smem + static_bytes) err = cudaErrorNotSupported;
    if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err == cudaSuccess ? 1 : -1;
}

// Where a piece's keys start in the staging: KV head hk, key key0 of the segment of row r0;
// n_ok of the piece's n_tile keys lie inside the staged rows (a bad n_kv_indices: keys past them
// read as zeros). Both staged forms take their K / V rows from here.
struct StagedSource {
    const uint16_t *k, *v;
    int32_t n_ok;
};

template <int D>
__device__ __forceinline__ StagedSource staged_source(const luce_attention_params &p, const StagedKv &st, int32_t r0,
                                                      int32_t hk, int32_t key0, int32_t n_tile) {
    const int64_t row0 = (int64_t)p.kv_indptr[attention_segment_of(p, r0)] * p.page_size + key0;
    const int32_t n_ok = (int32_t)max((int64_t)0, min((int64_t)n_tile, st.rows - row0));
    const int64_t src0 = (int64_t)hk * st.rows + (n_ok > 0 ? row0 : 0);
    return {st.k + src0 * D, st.v + src0 * D, n_ok};
}

// Key block b0's K then V rows (keys j < n_ok from k_src / v_src, D halves apart; zeros past)
// into buf [2B][kStride] by a block of THREADS: this thread's kCopies pieces, all of one
// 16-byte column c of rows j0, j0 + THREADS / kChunks, ... (the source address of a zero
// piece is not read).
template <int D, int THREADS = F16Shape<D>::kThreads>
__device__ __forceinline__ void f16s_copy_block(const uint16_t *k_src, const uint16_t *v_src, int32_t b0,
                                                int32_t n_ok, uint16_t *buf) {
    using F = F16Staged<D>;
    constexpr int B = F16Shape<D>::kBlockKeys, KS = F16Shape<D>::kStride;
    constexpr int kCopies = 2 * B * F::kChunks / THREADS, kHalf = kCopies / 2, kRowStep = THREADS / F::kChunks;
    static_assert(THREADS % F::kChunks == 0 && (2 * B * F::kChunks) % (2 * THREADS) == 0, "a thread keeps one column");
    const int j0 = threadIdx.x / F::kChunks, c = threadIdx.x % F::kChunks;
    const int64_t at = (int64_t)(b0 + j0) * D + 8 * c;
#pragma unroll
    for (int u = 0; u < kCopies; ++u) {
        const int kv = u / kHalf, j = j0 + (u % kHalf) * kRowStep;
        const uint16_t *src = (kv ? v_src : k_src) + at + (int64_t)(u % kHalf) * kRowStep * D;
        cp_async16(buf + (kv * B + j) * KS + 8 * c, src, b0 + j < n_ok);
    }
}

// One block-uniform piece of the staged form: rows r0..r1-1 of one segment, all in the tile.
template <int D, int STAGES>
__device__ void f16s_prompt_piece(const luce_attention_params &p, const StagedKv &st, int32_t r0, int32_t r1,
                                  int32_t hk, int32_t split, int32_t n_parts, uint16_t *smem, int32_t *row_n,
                                  int32_t *row_state) {
    using S = F16Shape<D>;
    using F = F16Staged<D>;
    constexpr int NT = S::kKeyTiles, KS = S::kStride, B = S::kBlockKeys;
    static_assert(STAGES >= 2 && STAGES <= F::kMaxStages, "a ring of 2..kMaxStages buffers");
    const int G = p.n_heads_q / p.n_heads_kv;
    const int nq = (r1 - r0) * G;
    const int32_t key0 = split * kSplitKeys;
    uint16_t *bufs = smem + (F::kQRegs ? 0 : S::kTileQV * KS);       // buffer i: bufs + i * kBufHalves
    uint16_t *q_s = F::kQRegs ? bufs + (STAGES - 1) * F::kBufHalves : smem;

    const int32_t n_tile = f16_piece_rows<D>(p, r0, r1, key0, row_n, row_state);
    const StagedSource src = staged_source<D>(p, st, r0, hk, key0, n_tile);
    const uint16_t *k_src = src.k, *v_src = src.v;
    const int32_t n_ok = src.n_ok;
    const int n_blocks = (n_tile + B - 1) / B;
#pragma unroll
    for (int b = 0; b < STAGES - 1; ++b) {
        if (b < n_blocks) f16s_copy_block<D>(k_src, v_src, b * B, n_ok, bufs + b * F::kBufHalves);
        cp_async_commit();
    }
    if (n_tile > 0) f16_store_q<D>(p, r0, hk, nq, q_s);
    __syncthreads();

    F16Warp<D> w(row_n, row_state, nq, G);
    const int32_t q_off = f16_q_off<D>(), k_off = f16_k_off<D>(), v_off = f16_v_off<D>();
    uint32_t qf[F::kQRegs ? D / 16 : 1][4];
    if (F::kQRegs && n_tile > 0) {
#pragma unroll
        for (int kd = 0; kd < (F::kQRegs ? D / 16 : 1); ++kd) tc::ldmatrix_x4(qf[kd], q_s + (q_off + 16 * kd));
    }
    const auto q_frag = [&](int kd, uint32_t (&a)[4]) {
        if (F::kQRegs) {
            a[0] = qf[F::kQRegs ? kd : 0][0], a[1] = qf[F::kQRegs ? kd : 0][1];
            a[2] = qf[F::kQRegs ? kd : 0][2], a[3] = qf[F::kQRegs ? kd : 0][3];
        } else {
            tc::ldmatrix_x4(a, q_s + (q_off + 16 * kd));
        }
    };
    for (int b = 0; b < n_blocks; ++b) {
        cp_async_wait<STAGES - 2>();  // this thread's pieces of block b have landed
        __syncthreads();              // everyone's have; block b - 1's readers (and Q's) are done
        if (b + STAGES - 1 < n_blocks)
            f16s_copy_block<D>(k_src, v_src, (b + STAGES - 1) * B, n_ok, bufs + ((b + STAGES - 1) % STAGES) * F::kBufHalves);
        cp_async_commit();
        const int32_t b0 = b * B;
        if (b0 >= w.n_warp) continue;  // warp-uniform: no row of the warp attends a key here
        const uint16_t *k_s = bufs + (b % STAGES) * F::kBufHalves, *v_s = k_s + B * KS;
        float s[NT][4];
        f16_scores<D>(s, q_frag, k_s, k_off);
        f16_softmax_pv<D>(s, b0, w, v_s, v_off);
    }
    cp_async_wait<0>();
    f16_write_partials<D>(p, w, r0, hk, split, n_parts, nq, row_n, row_state);
}

}  // namespace
}  // namespace luce_attn
