// Shared-memory staging of weight chunks for cuda/matmul.cu.
//
// A warp owns kStages stages; a stage holds one 256-value chunk of its 16 weight rows. The
// warp copies a chunk with 16-byte cp.async of the aligned 16-byte words covering each row's
// bytes (whole 128-byte lines per instruction instead of 8 scattered rows), and the row
// readers then read their fragments from shared memory. Row r's bytes start at
// stage + r * kSlotBytes + (its global address & 15), so a reader sees the same alignment as
// in global memory. kSlotBytes is an odd number of 16-byte words: 8 rows read at one offset
// fall in different banks.
#pragma once

#include "matmul_mma.cuh"

namespace mm {

template <class Q>
struct Stage {
    static constexpr int kWords = (Q::kChunkBytes + 30) / 16;  // words a chunk can span
    static constexpr int kSlotWords = kWords % 2 ? kWords : kWords + 1;
    static constexpr int kSlotBytes = 16 * kSlotWords;
    static constexpr int kBytes = 16 * kSlotBytes;
};

__device__ __forceinline__ void cp_async16(uint8_t *dst, const uint8_t *src, int src_bytes) {
#ifdef __HIPCC__
    for (int i = 0; i < 16; ++i) dst[i] = i < src_bytes ? src[i] : 0;
#else
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifndef __HIPCC__
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifndef __HIPCC__
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Warp-wide: start copying chunk `ch` of rows tile..tile+15 (clamped to n - 1) into `stage`.
// Bytes at or past w_end are not read (zero-filled).
template <class Q>
__device__ __forceinline__ void stage_copy(uint8_t *stage, const uint8_t *w, const uint8_t *w_end,
                                           int64_t row_bytes, int64_t n, int64_t tile, int64_t ch,
                                           int lane) {
    using St = Stage<Q>;
    constexpr int kItems = 16 * St::kWords;
#pragma unroll
    for (int i = 0; i < (kItems + WARP_SIZE - 1) / WARP_SIZE; ++i) {
        const int item = lane + i * WARP_SIZE;
        if (item < kItems) {
            const int r = item / St::kWords, word = item % St::kWords;
            const int64_t row = tile + r < n ? tile + r : n - 1;
            const uint8_t *p = w + row * row_bytes + ch * Q::kChunkBytes;
            const uint8_t *src = reinterpret_cast<const uint8_t *>(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)15) + 16 * word;
            const int64_t left = w_end - src;
            cp_async16(stage + r * St::kSlotBytes + 16 * word, left > 0 ? src : w, left >= 16 ? 16 : (left > 0 ? (int)left : 0));
        }
    }
}

// Where a reader finds its row's chunk in a stage: row slot plus the global misalignment.
template <class Q>
__device__ __forceinline__ const uint8_t *staged_row(const uint8_t *stage, int r, const uint8_t *global_chunk) {
    return stage + r * Stage<Q>::kSlotBytes + (reinterpret_cast<uintptr_t>(global_chunk) & 15);
}

}  // namespace mm
