// The f16 prompt-row kernel's __global__ functions and launch (its device code:
// cuda/attention_prefill_f16.cuh, the shared arithmetic; _paged.cuh and _staged.cuh, its two
// ways of bringing K and V to shared memory; _wide.cuh, the staged form with 4 warps of two
// m-tiles, two blocks an SM; _long.cuh, the staged form whose blocks walk runs of splits).
// cuda/attention_prefill.cu includes this and picks between it and
// the TF32 kernel (LUCE_ATTN_PROMPT).
#pragma once

#include <stdlib.h>
#include <string.h>

#include "attention_prefill_f16_paged.cuh"
#include "attention_prefill_f16_staged.cuh"
#include "attention_prefill_f16_wide.cuh"
#include "attention_prefill_f16_long.cuh"
#if (defined(__CUDACC__) && !defined(__HIPCC__)) || defined(LUCE_MMA_F16_HOST)
#define LUCE_ATTN_WG 1  // the warpgroup form: NVIDIA builds (run on sm_90a only) and the host emulator
#include "attention_prefill_f16_wg.cuh"
#endif

namespace luce_attn {
namespace {

// The prompt kernel of a launch without LUCE_ATTN_PROMPT; DEFAULT_KIND in
// luce/ref/attention_prefill.py names the same one.
constexpr bool kPromptF16ByDefault = true;
// Head dims whose staged keys take the wide form by default (LUCE_ATTN_PROMPT unset or f16)
// where it fits; f16w asks for it at any D <= 128, f16s for the 8-warp form.
template <int D>
constexpr bool f16_wide_by_default() { return D == 128; }
// Head dims whose staged keys take the long form of 6 warps by default where it fits (before the
// wide one): at the Coder-1.5B's D = 128 it ran 512 rows at 4K keys in 80 us against 115 and 2,048
// rows at 12K in 706 against 923 on the H200, prefill 12K/4K 0.851 against 0.80 (docs/PERF.md,
// session 17). D = 64 is not measured.
template <int D>
constexpr bool f16_long_by_default() { return D == 128; }
// Head dims where the warpgroup form runs (sm_90a), and their default staged form (before the long
// one): at D = 128 the Coder-1.5B's prefill ran 4K at 71.0K tok/s against 68.4K and 12K at 61.2K
// against 57.3K on the H200, 12K/4K 0.861 against 0.836 (docs/PERF.md, session 21). Not D = 64:
// there it gave other bits than the other forms on the H200 (the GPU test
// test_prompt_forms_at_a_long_context_give_the_default_bits, session 21), so it does not run,
// not even when asked for, until that is found.
template <int D>
constexpr bool f16_wg_runs() { return D == 128; }

// The paged form (cuda/attention_prefill_f16_paged.cuh).
template <int D, bool PIPE>
__global__ void __launch_bounds__(F16Shape<D>::kThreads, F16Shape<D>::min_blocks(PIPE))
attention_prompt_f16_kernel(luce_attention_params p, int32_t n_parts, int32_t page_shift) {
    using S = F16Shape<D>;
    extern __shared__ float4 smem4[];
    __shared__ int64_t key_off[2][S::kBlockKeys];
    __shared__ int32_t row_n[S::kTileQV], row_state[S::kTileQV];
    for_tile_pieces(p, S::kTileQV, [&](int32_t r0, int32_t r1) {
        f16_prompt_piece<D, PIPE>(p, r0, r1, blockIdx.y, blockIdx.z, n_parts, page_shift,
                                  reinterpret_cast<uint16_t *>(smem4), key_off, row_n, row_state);
    });
}

// The staged form (cuda/attention_prefill_f16_staged.cuh): its pre-pass, then the tiles.
template <int D>
__global__ void __launch_bounds__(256) attention_stage_kv_kernel(luce_attention_params p, StagedKv st,
                                                                 int32_t page_shift) {
    f16_stage_kv<D>(p, st, page_shift);
}

template <int D, int STAGES>
__global__ void __launch_bounds__(F16Shape<D>::kThreads, F16Staged<D>::min_blocks())
attention_prompt_f16s_kernel(luce_attention_params p, StagedKv st, int32_t n_parts) {
    using S = F16Shape<D>;
    extern __shared__ float4 smem4[];
    __shared__ int32_t row_n[S::kTileQV], row_state[S::kTileQV];
    for_tile_pieces(p, S::kTileQV, [&](int32_t r0, int32_t r1) {
        f16s_prompt_piece<D, STAGES>(p, st, r0, r1, blockIdx.y, blockIdx.z, n_parts,
                                     reinterpret_cast<uint16_t *>(smem4), row_n, row_state);
    });
}

// The wide form (cuda/attention_prefill_f16_wide.cuh), after the same pre-pass.
template <int D>
__global__ void __launch_bounds__(F16Wide<D>::kThreads, 2)
attention_prompt_f16w_kernel(luce_attention_params p, StagedKv st, int32_t n_parts) {
    using S = F16Shape<D>;
    extern __shared__ float4 smem4[];
    __shared__ int32_t row_n[S::kTileQV], row_state[S::kTileQV];
    for_tile_pieces(p, S::kTileQV, [&](int32_t r0, int32_t r1) {
        f16w_prompt_piece<D>(p, st, r0, r1, blockIdx.y, blockIdx.z, n_parts, reinterpret_cast<uint16_t *>(smem4),
                             row_n, row_state);
    });
}

// The long form (cuda/attention_prefill_f16_long.cuh), after the same pre-pass: grid z runs of
// per_block splits; MT m-tiles a warp.
template <int D, int WARPS, int STAGES, int MT>
__global__ void __launch_bounds__(F16Long<D, WARPS, STAGES, MT>::kThreads, F16Long<D, WARPS, STAGES, MT>::kMinBlocks)
attention_prompt_f16l_kernel(luce_attention_params p, StagedKv st, int32_t n_parts, int32_t per_block, int32_t G) {
    using L = F16Long<D, WARPS, STAGES, MT>;
    extern __shared__ float4 smem4[];
    __shared__ int32_t row_keys[L::kTileQV], row_n[L::kTileQV], row_state[L::kTileQV];
    __shared__ F16LongRun<WARPS * MT> run;
    const int32_t s0 = (int32_t)blockIdx.z * per_block, s1 = min(s0 + per_block, prompt_splits(n_parts));
    const int32_t rows_per_tile = L::kTileQV / G;  // G = Hq / Hkv (a parameter: no register holds it)
    if (threadIdx.x == 0) {
        run.next = (int32_t)blockIdx.x * rows_per_tile;
        run.end = min(run.next + rows_per_tile, p.prompt_rows);
        run.group = G;
    }
    __syncthreads();
    while (run.next < run.end)  // for_tile_pieces' loop
        f16l_prompt_piece<D, WARPS, STAGES, MT>(p, st, G, blockIdx.y, s0, s1, n_parts,
                                                reinterpret_cast<uint16_t *>(smem4), row_keys, row_n, row_state, &run);
}

// The paged form on this device, decided once: 2 the two-buffer form where it fits (D <= 128
// and ~104 KiB at D = 128: sm_80, sm_90), 1 one buffer (e.g. a 99 KiB sm_86/89/120 block), 0
// neither (the partition kernel takes the prompt rows). Both do the same arithmetic in the
// same order: a row's bits do not depend on the choice.
template <int D>
int prompt_f16_form() {
    using S = F16Shape<D>;
    constexpr bool kCanPipe = D <= 128;
    static int ready_pipe = 0, ready_one = 0;
    if (kCanPipe && ready_pipe == 0)
        ready_pipe = prepare_smem(attention_prompt_f16_kernel<D, kCanPipe>, S::smem_bytes(true), S::kStaticBytes);
    if ((!kCanPipe || ready_pipe < 0) && ready_one == 0)
        ready_one = prepare_smem(attention_prompt_f16_kernel<D, false>, S::smem_bytes(false), S::kStaticBytes);
    return kCanPipe && ready_pipe > 0 ? 2 : ready_one > 0 ? 1 : 0;
}

// The staged form's ring depth on this device, decided once: kMaxStages where it fits, else
// 2, else 0 (the paged form runs).
template <int D>
int prompt_f16s_stages() {
    using F = F16Staged<D>;
    static int ready_max = 0, ready_two = 0;
    if (ready_max == 0)
        ready_max = prepare_smem(attention_prompt_f16s_kernel<D, F::kMaxStages>, F::smem_bytes(F::kMaxStages), F::kStaticBytes);
    if (F::kMaxStages > 2 && ready_max < 0 && ready_two == 0)
        ready_two = prepare_smem(attention_prompt_f16s_kernel<D, 2>, F::smem_bytes(2), F::kStaticBytes);
    return ready_max > 0 ? F::kMaxStages : ready_two > 0 ? 2 : 0;
}

// Whether the wide form fits this device (D <= 128; asked once): 104,448 bytes at D = 128.
template <int D>
bool prompt_f16w_ready() {
    if constexpr (D > 128) {
        return false;
    } else {
        static int ready = 0;
        if (ready == 0) {
            ready = prepare_smem(attention_prompt_f16w_kernel<D>, F16Wide<D>::kSmemBytes, F16Wide<D>::kStaticBytes);
#if defined(__CUDACC__) && !defined(__HIPCC__)
            // All of L1 as shared memory where the driver would pick less: two blocks an SM
            // (a hint; nothing depends on it but the rate).
            if (ready > 0 && cudaFuncSetAttribute(attention_prompt_f16w_kernel<D>,
                                                  cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess)
                (void)cudaGetLastError();
#endif
        }
        return ready > 0;
    }
}

// Whether the long form <D, WARPS, STAGES, MT> fits this device (D <= 128; asked once).
template <int D, int WARPS, int STAGES, int MT>
bool prompt_f16l_ready() {
    if constexpr (D > 128) {
        return false;
    } else {
        using L = F16Long<D, WARPS, STAGES, MT>;
        static int ready = 0;
        if (ready == 0) {
            ready = prepare_smem(attention_prompt_f16l_kernel<D, WARPS, STAGES, MT>, L::kSmemBytes, L::kStaticBytes);
#if defined(__CUDACC__) && !defined(__HIPCC__)
            if (ready > 0 && cudaFuncSetAttribute(attention_prompt_f16l_kernel<D, WARPS, STAGES, MT>,
                                                  cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess)
                (void)cudaGetLastError();  // a hint: all of L1 as shared memory, kMinBlocks an SM
#endif
        }
        return ready > 0;
    }
}

// Blocks of the long form <D, WARPS, STAGES, MT> the device holds at once (asked once; 0 unknown).
template <int D, int WARPS, int STAGES, int MT>
int64_t prompt_f16l_slots() {
    static int64_t slots = -1;
    if (slots < 0) {
        using L = F16Long<D, WARPS, STAGES, MT>;
        int device = 0, sms = 0, per_sm = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            sms = 0;
#ifdef __HIPCC__
        per_sm = L::kMinBlocks;
#else
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_prompt_f16l_kernel<D, WARPS, STAGES, MT>,
                                                          L::kThreads, L::kSmemBytes) != cudaSuccess)
            per_sm = 0;
#endif
        (void)cudaGetLastError();
        slots = (int64_t)sms * per_sm;
    }
    return slots;
}

#ifndef LUCE_ATTN_WG
template <int D>
bool prompt_f16g_ready() { return false; }  // no warpgroup form in this build (HIP)
#endif

// LUCE_ATTN_PROMPT, read per launch so one process can time each: "tf32" the TF32 kernel
// above, "f16p" the f16 kernel's paged form, "f16s" its 8-warp staged form, "f16w" its wide
// form (D <= 128), "f16l" / "f16l4" its long form of 6 / 4 warps, "f16l2" its long form of 4
// warps of two m-tiles (D <= 128), "f16g" its warpgroup form (sm_90a, D = 128: f16_wg_runs;
// elsewhere the long form), any other value the f16 kernel in its default form (staged where the
// launch gives it a staging workspace: warpgroup where f16_wg_runs and it is ready, else long
// where f16_long_by_default, else wide where f16_wide_by_default); unset or empty:
// kPromptF16ByDefault. Every f16 form gives the same bits.
enum PromptKind { kPromptTf32, kPromptF16Paged, kPromptF16, kPromptF16Staged, kPromptF16Wide, kPromptF16Long,
                  kPromptF16Long4, kPromptF16Long2, kPromptF16Wg };
PromptKind prompt_kind() {
    const char *kind = getenv("LUCE_ATTN_PROMPT");
    if (kind == nullptr || kind[0] == 0) return kPromptF16ByDefault ? kPromptF16 : kPromptTf32;
    return strcmp(kind, "tf32") == 0   ? kPromptTf32
           : strcmp(kind, "f16p") == 0 ? kPromptF16Paged
           : strcmp(kind, "f16s") == 0 ? kPromptF16Staged
           : strcmp(kind, "f16w") == 0 ? kPromptF16Wide
           : strcmp(kind, "f16l") == 0 ? kPromptF16Long
           : strcmp(kind, "f16l4") == 0 ? kPromptF16Long4
           : strcmp(kind, "f16l2") == 0 ? kPromptF16Long2
           : strcmp(kind, "f16g") == 0 ? kPromptF16Wg
                                       : kPromptF16;
}

// The long forms: <WARPS, STAGES> of f16l and f16l4 (one m-tile a warp), of f16l2 (two).
constexpr int kLongWarps = 6, kLongStages = 3, kLong4Warps = 4, kLong4Stages = 2, kLong2Warps = 4, kLong2Stages = 2;

// The staged form a launch of this kind takes at D where the launch stages its keys: 6 the
// warpgroup form, 5 the long form of two m-tiles a warp, 4 the long form of 4 warps, 3 of 6, 2
// wide, 1 the 8-warp form, 0 none (the paged form). Asks every form it may take, so that their
// shared-memory limits are set before any graph capture.
template <int D>
int prompt_staged_form(PromptKind kind) {
    if (kind == kPromptTf32 || kind == kPromptF16Paged) return 0;
    if ((kind == kPromptF16Wg || kind == kPromptF16) && f16_wg_runs<D>() && prompt_f16g_ready<D>()) return 6;
    const bool long6 = kind == kPromptF16Long || kind == kPromptF16Wg || (kind == kPromptF16 && f16_long_by_default<D>());
    if (long6 && prompt_f16l_ready<D, kLongWarps, kLongStages, 1>()) return 3;
    if (kind == kPromptF16Long4 && prompt_f16l_ready<D, kLong4Warps, kLong4Stages, 1>()) return 4;
    if (kind == kPromptF16Long2 && prompt_f16l_ready<D, kLong2Warps, kLong2Stages, 2>()) return 5;
    const bool wide = kind == kPromptF16Wide || (kind == kPromptF16 && f16_wide_by_default<D>());
    if (wide && prompt_f16w_ready<D>()) return 2;
    return prompt_f16s_stages<D>() > 0 ? 1 : 0;
}

// Whether the f16 kernel fits at head dim D in the form a launch of this kind may take (the
// paged form asked too, for a launch without a staging workspace).
template <int D>
bool prompt_f16_fits(PromptKind kind) {
    const bool staged = prompt_staged_form<D>(kind) > 0, paged = prompt_f16_form<D>() > 0;
    return staged || paged;
}

template <int D>
int64_t prompt_stage_rows(int32_t page_size, int64_t n_kv_indices) {
    return n_kv_indices > 0 && prompt_staged_form<D>(prompt_kind()) > 0 ? n_kv_indices * page_size : 0;
}

// The long form's tiles (kTileQV / G rows), KV heads and runs of splits, after the pre-pass.
template <int D, int WARPS, int STAGES, int MT>
int launch_prompt_f16l(const luce_attention_params &p, const StagedKv &st, int32_t n_parts, cudaStream_t stream) {
    using L = F16Long<D, WARPS, STAGES, MT>;
    const int32_t rows_per_tile = L::kTileQV / (p.n_heads_q / p.n_heads_kv);
    const int64_t tiles = (p.prompt_rows + rows_per_tile - 1) / rows_per_tile;
    const int32_t splits = prompt_splits(n_parts);
    const int32_t per_block = f16l_per_block(tiles * p.n_heads_kv, splits, prompt_f16l_slots<D, WARPS, STAGES, MT>());
    const dim3 grid((unsigned)tiles, (unsigned)p.n_heads_kv, (unsigned)((splits + per_block - 1) / per_block));
    attention_prompt_f16l_kernel<D, WARPS, STAGES, MT><<<grid, L::kThreads, L::kSmemBytes, stream>>>(
        p, st, n_parts, per_block, p.n_heads_q / p.n_heads_kv);
    return luce_status(cudaGetLastError());
}

template <int D>
int launch_prompt_f16(const luce_attention_params &p, int32_t n_parts, int32_t page_shift, cudaStream_t stream) {
    using S = F16Shape<D>;
    using F = F16Staged<D>;
    const int G = p.n_heads_q / p.n_heads_kv;
    const int32_t rows_per_tile = S::kTileQV / G;
    const dim3 grid((unsigned)((p.prompt_rows + rows_per_tile - 1) / rows_per_tile), (unsigned)p.n_heads_kv,
                    (unsigned)prompt_splits(n_parts));
    const int64_t stage_rows = prompt_stage_rows<D>(p.page_size, p.n_kv_indices);
    if (stage_rows > 0) {
        const StagedKv st = staged_kv_of(p, workspace_of(p, n_parts, p.prompt_rows), stage_rows);
        const int64_t items = stage_rows * p.n_heads_kv * (D / 8);
        const unsigned blocks = (unsigned)min((items + 255) / 256, (int64_t)4096);
        const int stages = prompt_f16s_stages<D>();
        int form = D <= 128 ? prompt_staged_form<D>(prompt_kind()) : 1;
        const bool q16 = reinterpret_cast<uintptr_t>(p.q) % 16 == 0;  // the long and warpgroup forms load q as float4
#ifdef LUCE_ATTN_WG
        if constexpr (D == 64 || D == 128) {
            if (form == 6 && q16) {
                attention_stage_kvt_kernel<D><<<blocks, 256, 0, stream>>>(p, st, page_shift);
                return launch_prompt_f16g<D>(p, st, n_parts, stream);
            }
        }
#endif
        attention_stage_kv_kernel<D><<<blocks, 256, 0, stream>>>(p, st, page_shift);
        if constexpr (D <= 128) {
            if (form >= 3 && q16)
                return form == 3   ? launch_prompt_f16l<D, kLongWarps, kLongStages, 1>(p, st, n_parts, stream)
                       : form == 4 ? launch_prompt_f16l<D, kLong4Warps, kLong4Stages, 1>(p, st, n_parts, stream)
                                   : launch_prompt_f16l<D, kLong2Warps, kLong2Stages, 2>(p, st, n_parts, stream);
            if (form >= 3) form = prompt_staged_form<D>(f16_wide_by_default<D>() ? kPromptF16Wide : kPromptF16Staged);
            if (form == 2) {
                attention_prompt_f16w_kernel<D><<<grid, F16Wide<D>::kThreads, F16Wide<D>::kSmemBytes, stream>>>(p, st, n_parts);
                return luce_status(cudaGetLastError());
            }
        }
        if (stages > 2)
            attention_prompt_f16s_kernel<D, F::kMaxStages><<<grid, S::kThreads, F::smem_bytes(F::kMaxStages), stream>>>(p, st, n_parts);
        else
            attention_prompt_f16s_kernel<D, 2><<<grid, S::kThreads, F::smem_bytes(2), stream>>>(p, st, n_parts);
        return luce_status(cudaGetLastError());
    }
    constexpr bool kCanPipe = D <= 128;
    const int form = prompt_f16_form<D>();
    if (form == 0) return (int)cudaErrorNotSupported;
    if (form == 2)
        attention_prompt_f16_kernel<D, kCanPipe><<<grid, S::kThreads, S::smem_bytes(true), stream>>>(p, n_parts, page_shift);
    else
        attention_prompt_f16_kernel<D, false><<<grid, S::kThreads, S::smem_bytes(false), stream>>>(p, n_parts, page_shift);
    return luce_status(cudaGetLastError());
}

}  // namespace
}  // namespace luce_attn
