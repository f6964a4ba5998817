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
#ifdef LUCE_MM_PORTABLE
    for (int i = 0; i < 16; ++i) dst[i] = i < src_bytes ? src[i] : 0;
#else
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifndef LUCE_MM_PORTABLE
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifndef LUCE_MM_PORTABLE
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Warp-wide copier of row tiles' chunks into stages with per-lane cp.async: item
// lane + 32 i is word (item % kWords) of row (item / kWords), so one instruction moves 512
// contiguous bytes (about two rows). Each lane's row offsets and word positions are computed
// once; the tile is an argument of each copy, so one warp streams chunks of successive tiles
// through one ring. Only the tile holding the matrix's last row can reach past w_end: it alone
// clamps rows to n - 1 and checks bounds (bytes at or past w_end are zero-filled, not read).
// kRows: rows a tile (16; the wide-token tile kernel's warps take 16 * MT, matmul_rows.cuh), a
// stage kRows row slots.
template <class Q, int kStages, int kRows = 16>
struct LaneCopier {
    using St = Stage<Q>;
    static constexpr int kItems = kRows * St::kWords;
    static constexpr int kStageBytes = kRows * St::kSlotBytes;
    static constexpr int kIters = (kItems + WARP_SIZE - 1) / WARP_SIZE;
    const uint8_t *w, *w_end;
    uint8_t *stages;           // the warp's kStages stages
    int64_t row_bytes, n;
    uint32_t row_off[kIters];  // from a tile's first row to the item's row
    uint32_t at[kIters];       // 16 * word (low 16 bits) | offset in the stage (high 16 bits)

    __device__ __forceinline__ LaneCopier(uint8_t *warp_stages, const uint8_t *w_, const uint8_t *end,
                                          int64_t row_bytes_, int64_t n_, int lane) {
        stages = warp_stages;
        w = w_;
        w_end = end;
        row_bytes = row_bytes_;
        n = n_;
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
            const int item = lane + i * WARP_SIZE, r = item / St::kWords, word = item % St::kWords;
            row_off[i] = (uint32_t)(r * row_bytes);
            at[i] = (uint32_t)(16 * word) | ((uint32_t)(r * St::kSlotBytes + 16 * word) << 16);
        }
    }

    // Start copying chunk `ch` of the row tile starting at row `tile` into stage s; commit()
    // closes the chunk's group.
    __device__ __forceinline__ void copy(int s, int64_t tile, int64_t ch, int lane) const {
        const uint8_t *base = w + tile * row_bytes + ch * Q::kChunkBytes;
#ifndef LUCE_MM_PORTABLE
        asm("" : "+l"(base));  // one 64-bit base per chunk (else nvcc redoes ch * kChunkBytes per item)
#endif
        uint8_t *stage = stages + s * kStageBytes;
        if (tile + kRows < n) {
#pragma unroll
            for (int i = 0; i < kIters; ++i)
                if (kItems % WARP_SIZE == 0 || lane + i * WARP_SIZE < kItems)
                    cp_async16(stage + (at[i] >> 16), source(base, row_off[i], i), 16);
        } else {
#pragma unroll
            for (int i = 0; i < kIters; ++i) {
                if (kItems % WARP_SIZE != 0 && lane + i * WARP_SIZE >= kItems) continue;
                const int64_t r = (lane + i * WARP_SIZE) / St::kWords;
                const int64_t row = tile + r < n ? tile + r : n - 1;
                const uint8_t *src = source(base, (uint32_t)((row - tile) * row_bytes), i);
                const int64_t left = w_end - src;
                cp_async16(stage + (at[i] >> 16), left > 0 ? src : w_end - 1,
                           left >= 16 ? 16 : (left > 0 ? (int)left : 0));
            }
        }
    }

    // Item i's aligned 16-byte word of the chunk starting at base (in the tile's first row).
    __device__ __forceinline__ const uint8_t *source(const uint8_t *base, uint32_t off, int i) const {
        return reinterpret_cast<const uint8_t *>(reinterpret_cast<uintptr_t>(base + off) & ~(uintptr_t)15) +
               (at[i] & 0xFFFFu);
    }

    __device__ __forceinline__ void commit() const { cp_async_commit(); }

    // The oldest chunk in flight has landed, for every lane.
    __device__ __forceinline__ void wait() {
        cp_async_wait<kStages - 1>();
        __syncwarp();
    }
};


// Where a reader finds its row's chunk in a stage: row slot plus the global misalignment.
template <class Q>
__device__ __forceinline__ const uint8_t *staged_row(const uint8_t *stage, int r, const uint8_t *global_chunk) {
    return stage + r * Stage<Q>::kSlotBytes + (reinterpret_cast<uintptr_t>(global_chunk) & 15);
}

// The device's multiprocessor count and opt-in shared memory per block (0 if unknown), asked once
// per process: the prompt-row GEMMs (int8 and f16) pick their launch shapes by it.
struct DeviceShape {
    int sms = 0, smem = 0;
};

inline const DeviceShape &device_shape() {
    static DeviceShape d;
    static bool known = false;
    if (!known) {
        int device = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
            cudaDeviceGetAttribute(&d.smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
            d = DeviceShape{};
        known = true;
    }
    return d;
}

}  // namespace mm
