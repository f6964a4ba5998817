// One-row matmul, staged form (IQ4_XS; Q4_K, Q5_K, Q6_K, session 37): the same integers and float
// steps as the tile kernel (cuda/matmul.cu) and as the register form of cuda/matmul_gemv.cuh, so
// the same bits (DESIGN 5 rule 6), with the weights streamed through shared memory instead of
// registers. The readers (a lane's group of a row's chunk from the stage) are
// matmul_gemv_staged_readers.cuh; what follows counts IQ4_XS.
//
// Why (docs/PERF.md, session 13): the register form held a batch's weights in registers (72 a
// thread: 5 blocks of 5 warps an SM at the 27B gate), formed a 64-bit address for each of its 12
// loads a batch (79 of ~496 instructions a warp and batch), kept one batch in flight a warp and
// paid ~25 a batch for the shared counter that elects the chain warp; ncu had its issue slots 44%
// busy with 1.6 eligible warps a scheduler and DRAM at 42%.
//
// Layout. A batch is R consecutive rows: R * row_bytes contiguous bytes (16-byte aligned: R is
// even, a row is a whole number of 136-byte chunks (Q4_K 144, Q5_K 176, Q6_K 210), the weights 16-byte aligned), copied into one
// of S stages (S = 2, or 3 where a block has two batches: launch_gemv_staged). On sm_90 and later
// thread 0 copies a batch with one bulk copy (cp.async.bulk) that completes on the stage's
// mbarrier; elsewhere every thread copies 16-byte words with cp.async (LUCE_GEMV_BULK). The last
// batch starts at row n - R (it overlaps the one before; only its rows from b * R on are stored),
// so no copy reaches past the matrix (with an odd chunk count n must be even for that row to be
// 16-byte aligned; else the register form runs). Lane L of warp w owns group j = L % 8 of chunk
// ch = 4w + L / 8 (W = ceil(chunks / 4) warps cover k, one chunk slot a lane; lanes past k read
// the last chunk and drop their sums) and keeps that group's x in registers for the launch; for each row of a batch
// it reads the chunk header and its group's 16 qs bytes from the stage (3 8-byte shared loads; the
// 8 lanes of a chunk read 8 bytes at a 16-byte stride, the next chunk 136 bytes on: no bank
// conflicts), one integer scale a row.
//
// Per batch t (one block barrier): __syncthreads (every warp is done with batch t - 1: its stage
// may refill and its c is whole), wait for batch t's copy (cp.async: wait for this thread's words,
// then the barrier), warp (t - 1) % W runs the ordered chains of batch t - 1 (thread 4r + kp:
// chunks kp, kp + 4, ... of row r in order, then ((acc0 + acc1) + acc2) + acc3 (+ bias) by
// shuffles), batch t + S - 1's copy is issued, then batch t's sums: a lane's integer SH, SL a row,
// the 8 lanes of a chunk add them (rows8_sum, transposed: lane j ends with row j * R / 8), and the
// row's lane writes c = d * fma(SH, 256, SL) (Q4_K / Q5_K: + negmin * MS; chunk_c) into c's ring of two batches.
//
// Table lookup (kSplit): T[n] = R1 + R2 with R1 = prmt(T[0..7], n) (n's bit 3 set: the sign of a
// negative entry, -1) and R2 = prmt(T[8..15] + 1, n ^ 8) (bit 3 clear: the sign of a positive
// entry, 0); the dot products take R1 and R2 apart (8 dp4a a word of 8 values instead of 4) and
// the lookup needs 7 ALU-pipe instructions a word instead of 11 (iq4_pairs): the same 15 issue
// slots a word, the ALU pipe (the busiest in ncu) relieved and the dp4a pipe loaded. Exact either
// way: the integers are the same.
//
// sm_90a SASS (IQ4_XS, R = 4, cuobjdump, counted): a warp and batch issues ~375 instructions
// outside the chains (the register form: ~496 with them): 351 for the sums, the reduction and c
// (128 IDP, 64 PRMT, 41 SHF, 26 LOP3, 13 LDS), ~15 for the barrier and the wait, ~8 to skip the
// copy (thread 0: ~35); the chain warp adds ~60-80 (the 27B gate) once a batch.
#pragma once

#include "matmul_gemv.cuh"
#include "matmul_gemv_staged_readers.cuh"
#include "matmul_gemv_x.cuh"
#include "matmul_stage.cuh"

namespace mm {

constexpr int kStagedMaxWarps = 1024 / WARP_SIZE;  // 1,024 threads (CUDA: 32 warps, k up to 32,768 = 128 chunks)

// IQ4_XS: 56 registers a thread: two blocks of 17 warps an SM at the 27B down projection (64 leave
// one), seven of 5 warps at its gate (64: six); the K types 64 (G::kMaxRegs). nvcc takes
// __maxnreg__ or __launch_bounds__, not both.
#if defined(__HIPCC__)
#define LUCE_GEMV_STAGED_REGS __launch_bounds__(kStagedMaxWarps * WARP_SIZE)
#elif defined(__CUDACC__)
#define LUCE_GEMV_STAGED_REGS __maxnreg__(R == 8 ? 64 : G::kMaxRegs)
#else
#define LUCE_GEMV_STAGED_REGS
#endif


struct GemvStagedArgs {
    const uint8_t *w;
    const float *bias;
    float *y;
    XLayout x;  // token 0 of it (with xf: its chunks and groups only)
    int64_t n, row_bytes;
    int warps;   // W = ceil(chunks / 4)
    int stages;  // S, 2..kStagedMaxStages
    const float *xf;  // token 0's f32 x where the kernel quantizes it in lane (matmul_gemv_x.cuh), else null
};

constexpr int kStagedMaxStages = 3;

// How a batch reaches its stage. sm_90 and later: one bulk copy (cp.async.bulk, the TMA's 1-D
// form) by thread 0, completing on the stage's mbarrier, which every thread waits on; the host
// emulator runs the same code with the copy done at once and the mbarrier's phases emulated
// (tests/kernels/test_matmul_emulated.py). Elsewhere (HIP, sm_80-89, or LUCE_GEMV_COOPERATIVE):
// every thread copies 16-byte words of it with cp.async and waits for its own; the block barrier
// after that makes them everyone's.
#if defined(__HIPCC__) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900) || defined(LUCE_GEMV_COOPERATIVE)
#define LUCE_GEMV_BULK 0
#else
#define LUCE_GEMV_BULK 1
#endif

#if LUCE_GEMV_BULK
#ifdef LUCE_MM_PORTABLE
// The emulator's mbarrier: phase parity (bit 63), pending arrivals (bits 32..47), bytes still to
// land (bits 0..31, as a signed count).
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) { *bar = (uint64_t)count << 32; }
__device__ __forceinline__ void mbar_fence_init() {}
__device__ __forceinline__ void mbar_step(uint64_t *bar, int arrivals, int64_t bytes) {
    const uint64_t phase = *bar >> 63;
    int pending = (int)((*bar >> 32) & 0xFFFF) - arrivals;
    int64_t tx = (int64_t)(int32_t)(uint32_t)*bar + bytes;
    if (pending < 0) abort();
    if (pending == 0 && tx == 0) {  // the phase completes; the next one expects one arrival again
        *bar = ((phase ^ 1) << 63) | ((uint64_t)1 << 32);
        return;
    }
    *bar = (phase << 63) | ((uint64_t)pending << 32) | (uint32_t)(int32_t)tx;
}
__device__ __forceinline__ void bulk_copy(uint8_t *dst, const uint8_t *src, uint32_t bytes, uint64_t *bar) {
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) != 0)
        abort();  // the device's bulk copy takes 16-byte aligned addresses and sizes only
    mbar_step(bar, 1, bytes);  // arrive.expect_tx
    std::memcpy(dst, src, bytes);
    mbar_step(bar, 0, -(int64_t)bytes);  // complete_tx
}
// Waits for the phase of parity `parity` to complete. The emulator copies at once, so the phase
// is complete when the kernel waits; a wait on the wrong parity would never end: abort instead.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    if ((*bar >> 63) == parity) abort();
}
#else
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// The initialized mbarriers visible to the async proxy (the bulk copies) before their first use.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void bulk_copy(uint8_t *dst, const uint8_t *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    const uint32_t b = smem_u32(bar);
    uint32_t done = 0;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.b32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
    } while (!done);
}
#endif
#endif

// Bytes of one stage (R rows) and the dynamic shared memory of a launch: S stages, then c
// [2][R][chunks] and the x scales [chunks] (floats).
template <int R>
__host__ __device__ inline uint32_t staged_stage_bytes(int64_t row_bytes) { return (uint32_t)(R * row_bytes); }

template <int R>
size_t gemv_staged_smem_bytes(const XLayout &x, int64_t row_bytes, int stages) {
    return (size_t)stages * staged_stage_bytes<R>(row_bytes) + (size_t)(2 * R + 1) * x.chunks * sizeof(float);
}

// kX: x quantized in lane from a.xf (matmul_gemv_x.cuh), else read from the workspace a.x.
template <class G, int R, bool kX>
__global__ void LUCE_GEMV_STAGED_REGS gemv_staged_kernel(GemvStagedArgs a) {
    static_assert(R == 2 || R == 4 || R == 8, "R even (16-byte aligned batches), rows8_sum takes 2, 4 or 8 rows");
    extern __shared__ uint4 gemv_stage_words[];  // 16-byte aligned
    uint8_t *stages = reinterpret_cast<uint8_t *>(gemv_stage_words);
    const int chunks = (int)a.x.chunks, W = a.warps, n = (int)a.n, S = a.stages;
    const uint32_t rb = (uint32_t)a.row_bytes, stage_bytes = staged_stage_bytes<R>(a.row_bytes);
    float *c_s = reinterpret_cast<float *>(stages + (size_t)S * stage_bytes);  // [2][R][chunks]
    float *xd_s = c_s + 2 * R * chunks;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, j = lane % 8;
    int ch = warp * kGemvChunksPerWarp + lane / 8;
    const bool live = ch < chunks;
    if (!live) ch = chunks - 1;  // reads stay inside the row; the sums are dropped

    // The block's batches: blockIdx.x, + gridDim.x, ... (turn t: the t-th of them), rows as int
    // (n < 2^31 / R). A batch's first row: b * R, or n - R for a last batch past n.
    const int batches = (n + R - 1) / R, row_step = (int)gridDim.x * R;
    const int turns = (int)blockIdx.x < batches ? (batches - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    auto first_row = [&](int row) { return row + R <= n ? row : n - R; };  // n >= R (launch)
    int issue_row = (int)blockIdx.x * R, issue_slot = 0;
#if LUCE_GEMV_BULK
    __shared__ uint64_t full[kStagedMaxStages];  // stage s's copy has landed (phase parity: its uses so far, & 1)
    if (tid == 0) {
        for (int s = 0; s < kStagedMaxStages; ++s) mbar_init(&full[s], 1);
        mbar_fence_init();
    }
    auto issue = [&](int t) {
        if (tid == 0 && t < turns) {
            bulk_copy(stages + issue_slot * stage_bytes, a.w + (size_t)first_row(issue_row) * rb, stage_bytes,
                      &full[issue_slot]);
        }
        issue_row += row_step;
        issue_slot = issue_slot + 1 == S ? 0 : issue_slot + 1;
    };
#else
    // Copies: 16-byte word i of a stage by thread i % blockDim.x; at most kWords a thread (a stage
    // is R * kChunkBytes / 16 words a chunk, a block at least 8 lanes a chunk: IQ4_XS R + 1, Q5_K
    // 6 at 4 rows). One 64-bit source a batch, stepped.
    constexpr int kWords = (R * G::kChunkBytes + 127) / 128;
    const uint32_t step = blockDim.x * 16, mine = (stage_bytes / 16 + blockDim.x - 1 - tid) / blockDim.x;
    const uint8_t *w_thread = a.w + 16 * tid;
#ifdef LUCE_MM_PORTABLE
    uint8_t *const dst_thread = stages + 16 * tid;
#else
    const uint32_t dst_thread = (uint32_t)__cvta_generic_to_shared(stages) + 16 * tid;
#endif
    auto issue = [&](int t) {
        if (t < turns) {
            const uint8_t *src = w_thread + (size_t)first_row(issue_row) * rb;
            auto dst = dst_thread + issue_slot * stage_bytes;
#pragma unroll
            for (int i = 0; i < kWords; ++i) {
                if (i < (int)mine) {
#ifdef LUCE_MM_PORTABLE
#ifndef __HIPCC__  // the emulator: cp.async of 16 bytes takes 16-byte aligned addresses only
                    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) != 0) abort();
#endif
                    cp_async16(dst, src, 16);
#else
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
                    asm("" : "+l"(src));  // one running pointer (else nvcc re-forms each address)
#endif
                }
                src += step;
                dst += step;
            }
        }
        cp_async_commit();  // one group a turn, empty or not: the wait for S - 2 pending counts turns
        issue_row += row_step;
        issue_slot = issue_slot + 1 == S ? 0 : issue_slot + 1;
    };
#endif
    for (int t = 0; t < S - 1; ++t) issue(t);  // weights before the kernel ahead ends
    wait_for_prior_kernels();                  // x is written by the kernel ahead
    let_dependents_start();
    GroupX gx;
    if constexpr (kX) {
        float xd, xs;
        gemv_quantize_x<G, G::kOwnLayout>(a.xf, ch, j, gx, xd, xs);
        if (live && j == 0) xd_s[ch] = xd;
    } else {
        gemv_load_x<G>(a.x, ch, j, gx);
        for (int c = tid; c < chunks; c += blockDim.x) xd_s[c] = __ldg(a.x.xd + (int64_t)c * a.x.tp);
    }

    // Ordered chains of a batch's R rows (one warp): thread 4r + kp takes acc[kp] of row r.
    int chain_row = (int)blockIdx.x * R, chain_warp = 0;
    auto chains = [&](int t) {
        if (warp == chain_warp) {
            const int r = lane / 4, kp = lane % 4;
            const float *c_row = c_s + ((t & 1) * R + (r < R ? r : 0)) * chunks;
            float acc = 0.0f;
            for (int c = kp; c < chunks; c += 4) acc = fmaf(xd_s[c], c_row[c], acc);
            const float a1 = warp_shfl_xor(acc, 1), a2 = warp_shfl_xor(acc, 2), a3 = warp_shfl_xor(acc, 3);
            const int row = first_row(chain_row) + r;
            if (r < R && kp == 0 && row >= chain_row) {  // rows before chain_row: the batch before stores them
                float v = acc;
                v = v + a1;
                v = v + a2;
                v = v + a3;
                if (a.bias) v = v + a.bias[row];
                a.y[row] = v;
            }
        }
        chain_row += row_step;
        chain_warp = chain_warp + 1 == W ? 0 : chain_warp + 1;
    };

    const uint8_t *lane_chunk = stages + (uint32_t)ch * G::kChunkBytes;
    const int myrow = j * R / 8;
    const bool writer = (j % (8 / R)) == 0 && live;
    int slot = 0;
    uint32_t parity = 0;  // of the stages' current phase (bulk copies): flips when the ring wraps
    for (int t = 0; t < turns; ++t) {
#if LUCE_GEMV_BULK
        __syncthreads();  // every warp is done with turn t - 1: its stage refills, its c is whole
        mbar_wait(&full[slot], parity);
#else
        if (S == 2)  // this thread's copies of turn t
            cp_async_wait<0>();
        else
            cp_async_wait<kStagedMaxStages - 2>();
        __syncthreads();         // everyone's; every warp is done with turn t - 1
#endif
        if (t > 0) chains(t - 1);
        issue(t + S - 1);
        const uint8_t *c0 = lane_chunk + slot * stage_bytes;
        int sh[R], sl[R], ms[R];
#pragma unroll
        for (int r = 0; r < R; ++r) G::sums(c0 + r * rb, j, gx, sh[r], sl[r], ms[r]);
        const int SH = rows8_sum<R>(sh), SL = rows8_sum<R>(sl), MS = G::kOffset ? rows8_sum<R>(ms) : 0;
        if (writer) {
            const uint8_t *head = c0 + myrow * rb;
            c_s[((t & 1) * R + myrow) * chunks + ch] = chunk_c<G::kOffset>(G::d(head), G::negmin(head), SH, SL, MS);
        }
        if (++slot == S) {
            slot = 0;
            parity ^= 1;
        }
    }
    __syncthreads();
    if (turns > 0) chains(turns - 1);
}

// Launch of the staged form (R rows a batch); 0 on success. The caller checked
// gemv_staged_runs. Stages: 2, or 3 where a block then has two batches, both in flight from its
// start (the 27B's 5120 x 6144 output projection: at 2 stages the second waits for the first; 3
// cost it one block of 6 an SM).
template <class G, int R, bool kX>
int launch_gemv_staged_x(GemvStagedArgs a, cudaStream_t stream) {
    a.warps = (int)((a.x.chunks + kGemvChunksPerWarp - 1) / kGemvChunksPerWarp);
    const int threads = a.warps * WARP_SIZE;
    auto kernel = gemv_staged_kernel<G, R, kX>;
    // Blocks an SM by chunk count and stages (registers and shared memory depend on them), asked
    // once; the kernel's shared-memory limit raised to the largest launch so far.
    static int resident[4 * kStagedMaxWarps + 1][kStagedMaxStages + 1] = {};
    static size_t smem_set = 48 << 10;
    auto blocks = [&](int stages) {
        const size_t smem = gemv_staged_smem_bytes<R>(a.x, a.row_bytes, stages);
        int &res = resident[a.x.chunks][stages];
        if (res == 0) {
            if (smem > smem_set &&
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess)
                smem_set = smem;
            res = smem <= smem_set ? resident_blocks(kernel, threads, smem) : -1;
        }
        return res;
    };
    const int64_t batches = (a.n + R - 1) / R;
    const int res2 = blocks(2), res3 = blocks(3);
    a.stages = res3 > 0 && (batches + res3 - 1) / res3 == 2 ? 3 : 2;
    const int res = a.stages == 3 ? res3 : res2;
    if (res < 0) return (int)cudaErrorInvalidValue;
    // A one-wave grid of every resident block (0: unknown, one a batch); block b takes batches b,
    // b + grid, ...: they differ by one batch at most, and an SM's blocks by as little.
    const int64_t grid = res > 0 && res < batches ? res : batches;
    const size_t smem = gemv_staged_smem_bytes<R>(a.x, a.row_bytes, a.stages);
    return luce_status(launch_overlapped(kernel, dim3((unsigned)grid), dim3(threads), smem, stream, true, a));
}

// a.xf set: x quantized in lane (the workspace neither read nor written).
template <class G, int R>
int launch_gemv_staged(const GemvStagedArgs &a, cudaStream_t stream) {
    return a.xf ? launch_gemv_staged_x<G, R, true>(a, stream) : launch_gemv_staged_x<G, R, false>(a, stream);
}

// The staged form can run: weights 16-byte aligned, at least R rows, every batch's first row
// 16-byte aligned (R rows a whole number of 16-byte words: Q6_K's 210-byte chunks an even count;
// and the last batch's row n - R: IQ4_XS an even chunk count or n even), k at most 128 chunks, and
// two stages' shared memory within the device's opt-in limit (48 KiB if unknown).
template <int R>
bool gemv_staged_runs(const uint8_t *w, int64_t n, const XLayout &x, int64_t row_bytes, int smem_limit) {
    const size_t smem = gemv_staged_smem_bytes<R>(x, row_bytes, 2);
    return (reinterpret_cast<uintptr_t>(w) & 15) == 0 && n >= R && (R * row_bytes) % 16 == 0 &&
           ((n - R) * row_bytes) % 16 == 0 &&
           x.chunks <= 4 * kStagedMaxWarps && smem <= (size_t)(smem_limit > 0 ? smem_limit : 48 << 10);
}

}  // namespace mm
