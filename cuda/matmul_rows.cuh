// The wide-token tile kernel of the quantized matmul (cuda/matmul.cu) for decode calls of 16 to
// 80+ rows (verify trees, draft blocks): the same integers and float steps per output element as
// mmq_kernel (matmul_chunk.cuh), the same bits, with what a block loads reused:
// - a block is WM warps x 16 * MT weight rows by 8 * NT tokens; x's 16-bit integers of a chunk
//   (8 * NT tokens x 512 B) go to shared memory once per block (cp.async, with the warps' weight
//   chunks, 2 stages deep, up to 4 by LUCE_MATMUL_ROWS_STAGES) instead of every warp reading them from L2 per row tile;
// - a warp decodes each group's A fragment once per m-tile and multiplies it by the NT token
//   tiles, and each B fragment (one 16-byte shared load a lane) by its MT m-tiles;
// - a warp runs the 4 k parts itself, one after another: chunks 0, 4, 8, .. into acc, then
//   tot = acc; chunks 1, 5, .. into acc, tot = tot + acc; .. (mmq_kernel's
//   y = ((acc0 + acc1) + acc2) + acc3 with its 4 warps' accumulators: the same order), so the
//   whole block steps through one chunk sequence and shares each staged x chunk.
// - or (tunes 13 / 14; 15: Z counted by rows_auto_cluster) a cluster of Z = 2 / 4 blocks along z
//   shares the 4 k parts: block z runs parts z, z + Z, .., keeps each part's sum in its shared
//   memory, and after a cluster barrier each block forms a share of the outputs as
//   ((p0 + p1) + p2) + p3 from the cluster's blocks (cluster.cuh): the same order, Z times the
//   blocks for matrices whose row blocks leave SMs idle (the 5,120-row down and out projections:
//   80 blocks of 64 rows), each walking k / Z.
// Per warp and group (IQ4_XS, MT = 2, NT = 5): 2 decodes, 5 B loads (2.5 KB of shared memory),
// 20 mma; mmq_kernel (NT = 2): 1 decode, 2 B loads from L2 (1 KB), 4 mma.
// A token block's x of a chunk sits at a stride of 576 B a token (8 lanes of one 16-byte load
// phase, two tokens, fall in different banks); padding tokens are zero-filled.
#pragma once

#include "cluster.cuh"
#include "matmul_chunk.cuh"
#include "matmul_stage.cuh"
#include "pdl.cuh"

namespace mm {

constexpr int kRowsXStride = 36;  // uint4 words a token's staged x chunk takes (512 B + 64)

// Bytes of one stage: x of the block's tokens, then each warp's 16 * MT weight rows.
template <class Q, int NT, int MT, int WM>
__host__ __device__ constexpr int rows_stage_bytes() {
    return 8 * NT * kRowsXStride * 16 + WM * 16 * MT * Stage<Q>::kSlotBytes;
}

// k-part sums a warp keeps: one running sum alone (Z = 1), else one per k part of its block (4 / Z).
__host__ __device__ constexpr int rows_tot_slots(int z) { return z == 1 ? 1 : 4 / z; }

// Bytes of the warps' k-part sums (after the stages).
template <int NT, int MT, int WM>
__host__ __device__ constexpr int rows_tot_bytes(int z) {
    return rows_tot_slots(z) * WM * MT * NT * 4 * WARP_SIZE * 4;
}

// Stages where they fit `limit` bytes of shared memory: `most` (2..4) down to 2, 0 where 2 do not
// fit. Two by default (measured on the H200 in docs/PERF.md session 15: 2 stages only);
// LUCE_MATMUL_ROWS_STAGES=3 or 4 (read once) for the A/B.
template <class Q, int NT, int MT, int WM>
inline int rows_stages(int limit, int most, int z) {
    for (int s = most; s >= 2; --s)
        if (limit == 0 || s * rows_stage_bytes<Q, NT, MT, WM>() + rows_tot_bytes<NT, MT, WM>(z) <= limit) return s;
    return 0;
}

// The chunk sequence of a block of a cluster of `step` (Z) blocks, from k part `first` (its rank):
// k part first's chunks first, first + 4, .., then part first + Z's, .. (Z = 1: all four parts in
// turn). k parts without chunks (k < 1024) come last: the cursor is then past the sequence.
struct KPartCursor {
    int kp, ch, step;
    __device__ __forceinline__ KPartCursor(int first, int step_) : kp(first), ch(first), step(step_) {}
    __device__ __forceinline__ bool live(int chunks) const { return kp < 4 && ch < chunks; }
    __device__ __forceinline__ bool next(int chunks) {  // true where k part kp just ended
        ch += 4;
        if (ch < chunks) return false;
        kp += step;
        ch = kp;
        return true;
    }
};

// Chunks of the k parts first, first + step, ..
__device__ __forceinline__ int kpart_chunks(int chunks, int first, int step) {
    int n = 0;
    for (int kp = first; kp < 4; kp += step) n += chunks > kp ? (chunks - kp + 3) / 4 : 0;
    return n;
}

// Block blockIdx.x: token block blockIdx.x % token_blocks (the token blocks of one row block run
// side by side and share its weights in L2), row block blockIdx.x / token_blocks; blockIdx.z: the
// block's rank in a cluster of gridDim.z (1, 2 or 4) sharing the k parts. `stages`: 2..4.
template <class Q, int NT, int MT, int WM>
__global__ void __launch_bounds__(WM * WARP_SIZE) mmq_rows_kernel(MmqArgs a, int token_blocks, int stages) {
    constexpr int kT = 8 * NT, kRows = 16 * MT, kXWords = kT * kRowsXStride, kElems = MT * NT * 4;
    const int Z = (int)gridDim.z, rank = (int)blockIdx.z;
    constexpr int kStageBytes = rows_stage_bytes<Q, NT, MT, WM>();
    extern __shared__ uint4 stage_words[];  // 16-byte aligned
    uint8_t *stage_mem = reinterpret_cast<uint8_t *>(stage_words);
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const int chunks = (int)a.x.chunks;
    const int64_t t_first = (int64_t)(blockIdx.x % token_blocks) * kT;
    const int64_t wtile = (int64_t)(blockIdx.x / token_blocks) * (WM * kRows) + warp * kRows;  // the warp's rows
    constexpr int kWarpBytes = LaneCopier<Q, 2, kRows>::kStageBytes;
    auto warp_stage = [&](int s) { return stage_mem + s * kStageBytes + kXWords * 16 + warp * kWarpBytes; };
    // The copier's stage 0 is set to stage s of the block before each copy (stages are block-wide).
    LaneCopier<Q, 2, kRows> copier(warp_stage(0), a.w, a.w_end, a.row_bytes, a.n, lane);
    auto copy_weights = [&](int s, const KPartCursor &c) {
        if (!c.live(chunks)) return;
        copier.stages = warp_stage(s);
        copier.copy(0, wtile, c.ch, lane);
    };
    // x: lane copies word `lane` (group lane / 4, quad lane % 4) of tokens warp, warp + WM, ..
    auto copy_x = [&](int s, const KPartCursor &c) {
        if (!c.live(chunks)) return;
        uint4 *dst = stage_words + s * (kStageBytes / 16) + lane;
        const bool live_group = (int64_t)c.ch * kGroups + (lane >> 2) < a.x.groups;
        const uint4 *src = a.x.xq + (int64_t)c.ch * (kGroups * 4) + lane;
#pragma unroll
        for (int u = 0; u < kT / WM; ++u) {
            const int t = warp + u * WM;
            const bool live = live_group && t_first + t < a.rows;
            cp_async16(reinterpret_cast<uint8_t *>(dst + t * kRowsXStride),
                       reinterpret_cast<const uint8_t *>(live ? src + (t_first + t) * a.x.groups * 4 : a.x.xq),
                       live ? 16 : 0);
        }
    };
    // Prologue: the weights of the first stages - 1 chunks before the kernel ahead ends, their x after.
    KPartCursor wfill(rank, Z), fill(rank, Z);
    for (int s = 0; s < stages - 1; ++s) {
        copy_weights(s, wfill);
        wfill.next(chunks);
    }
    wait_for_prior_kernels();  // x is written by the kernel ahead (quantize_x or another)
    let_dependents_start();
    for (int s = 0; s < stages - 1; ++s) {
        copy_x(s, fill);
        fill.next(chunks);
        cp_async_commit();
    }
    const uint8_t *wrow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t row = wtile + 16 * m + grp + 8 * h;
            wrow[m][h] = a.w + (row < a.n ? row : a.n - 1) * a.row_bytes;
        }
    // tot: Z = 1 the k parts done so far, ((acc0 + acc1) + ..), else slot s part rank + s * Z's
    // sum, in shared memory (registers hold acc).
    const int slots = rows_tot_slots(Z);
    float *tot = reinterpret_cast<float *>(stage_mem + stages * kStageBytes) + warp * (slots * kElems * WARP_SIZE) + lane;
    float acc[MT][NT][4] = {};
    KPartCursor use(rank, Z);
    const int count = kpart_chunks(chunks, rank, Z);
    for (int i = 0, st = 0, fs = stages - 1; i < count; ++i) {
        if (stages == 4) cp_async_wait<2>();
        else if (stages == 3) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();  // chunk i has landed for every thread; every warp is done with stage fs
        copy_weights(fs, fill);
        copy_x(fs, fill);
        fill.next(chunks);
        cp_async_commit();
        const uint8_t *stage = stage_mem + st * kStageBytes, *wst = warp_stage(st);
        const int64_t ch = use.ch;
        // Token tile n's pointers sit at fixed offsets from tile 0's; a tile of padding tokens reads
        // none of them (s_live false, its B staged as zeros).
        const int64_t at = ch * a.x.tp + t_first + 2 * quad;
        const float *xd0 = a.x.xd + at;
        const uint4 *xqp0 = a.x.xqp + at * 2;
        const float4 *xs0 = a.x.xs + ch * kGroups * (a.x.tp / 2) + t_first / 2 + quad;
        const uint4 *sb0 = reinterpret_cast<const uint4 *>(stage) + grp * kRowsXStride + quad;
        StagedXTile xt[NT];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            xt[n].xd = xd0 + 8 * n;
            xt[n].xqp = xqp0 + 16 * n;
            xt[n].xs = xs0 + 4 * n;
            xt[n].sb = sb0 + 8 * n * kRowsXStride;
            xt[n].s_live = t_first + 8 * n + 2 * quad < a.rows;
        }
        Q rd[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m)
            rd[m].load(staged_row<Q>(wst, 16 * m + grp, wrow[m][0] + ch * Q::kChunkBytes),
                       staged_row<Q>(wst, 16 * m + grp + 8, wrow[m][1] + ch * Q::kChunkBytes), quad,
                       chunk_groups<Q>(a.x, ch));
        if constexpr (Q::kIntScale)
            mmq_chunk_int<Q, NT, false, MT>(rd, xt, quad, acc);
        else
            mmq_chunk_float<Q, NT, true, MT>(rd, a.x, ch, xt, quad, acc);
        st = st + 1 == stages ? 0 : st + 1;
        fs = fs + 1 == stages ? 0 : fs + 1;
        const int kp = use.kp;
        if (use.next(chunks)) {  // k part kp is complete: Z = 1 tot = ((acc0 + acc1) + acc2) + acc3 so far
            float *flat = &acc[0][0][0];  // element (m, n, e) at (m * NT + n) * 4 + e, as in tot
            float *slot = tot + (Z == 1 ? 0 : kp / Z) * (kElems * WARP_SIZE);
#pragma unroll
            for (int i = 0; i < kElems; ++i) {
                slot[i * WARP_SIZE] = Z == 1 && kp != 0 ? slot[i * WARP_SIZE] + flat[i] : flat[i];
                flat[i] = 0.0f;
            }
        }
    }
    cp_async_wait<0>();
    auto store = [&](int i, float v) {  // y of element i = (m * NT + n) * 4 + e
        const int m = i / (NT * 4), n = (i / 4) % NT, e = i % 4;
        const int64_t row = wtile + 16 * m + grp + 8 * (e >> 1), tok = t_first + 8 * n + 2 * quad + (e & 1);
        if (row < a.n && tok < a.rows) {
            if (a.bias) v = v + a.bias[row];
            a.y[tok * a.n + row] = v;
        }
    };
    if (Z == 1) {
        // k parts without chunks (k < 1024): mmq_kernel adds their zero accumulators too.
        for (int kp = use.kp; kp < 4; ++kp)
#pragma unroll
            for (int i = 0; i < kElems; ++i) tot[i * WARP_SIZE] = tot[i * WARP_SIZE] + 0.0f;
#pragma unroll
        for (int i = 0; i < kElems; ++i) store(i, tot[i * WARP_SIZE]);
        return;
    }
    // Part kp's sum of element i sits in block kp % Z, slot kp / Z; parts without chunks add 0.
    cluster::sync();  // every block's part sums are in its shared memory
    for (int i = rank; i < kElems; i += Z) {
        float v = cluster::map(tot, 0)[i * WARP_SIZE];
        for (int kp = 1; kp < 4; ++kp)
            v = v + (kp < chunks ? cluster::map(tot, kp % Z)[((kp / Z) * kElems + i) * WARP_SIZE] : 0.0f);
        store(i, v);
    }
    cluster::sync();  // no block leaves (its shared memory) before the others have read it
}

}  // namespace mm

// The host side has internal linkage: its statics (once-per-process queries) are per library (the
// CPU emulator loads several builds into one process). In the file's anonymous namespace, not one
// nested in mm: nvcc's kernel stubs find the two ambiguous.
namespace {

using namespace mm;

inline int rows_smem_limit() {
    static const int limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    return limit;
}

inline int rows_max_stages() {
    static const int most = [] {
        const char *v = getenv("LUCE_MATMUL_ROWS_STAGES");
        const int s = v ? atoi(v) : 2;
        return s >= 2 && s <= 4 ? s : 2;
    }();
    return most;
}

// Token blocks and tiles a block (NT) for `rows` tokens: the fewest blocks of at most 5 tiles, the
// tiles spread evenly (23 rows: one block of 3 tiles; 64: two of 4; 80: two of 5), at least 2.
inline int rows_tiles(int64_t rows, int64_t &token_blocks) {
    const int64_t tiles = (rows + 7) / 8;
    token_blocks = (tiles + 4) / 5;
    const int64_t nt = (tiles + token_blocks - 1) / token_blocks;
    return nt < 2 ? 2 : (int)nt;
}

// The cluster size (1, 2, 4) whose launch takes the fewest chunk steps, counted as waves of
// `resident` blocks times each block's chunks plus kRowsStepOverhead (the pipeline's fill and the
// epilogue): `blocks` row x token blocks, `chunks` 256-value chunks of k. The 27B on the H200 (3
// blocks of 4 warps an SM at 23 rows): the down projection (80 blocks, 68 chunks) and the out
// projection (80, 24) take 4, the gate (272, 20) 4, the LM head (3,880, 20) 1.
constexpr int64_t kRowsStepOverhead = 2;
inline int rows_auto_cluster(int64_t blocks, int64_t resident, int64_t chunks) {
    int best = 1;
    int64_t best_cost = -1;
    for (int z = 1; z <= 4; z *= 2) {
        const int64_t waves = resident > 0 ? (blocks * z + resident - 1) / resident : 1;
        const int64_t cost = waves * ((chunks + z - 1) / z + kRowsStepOverhead);
        if (best_cost < 0 || cost < best_cost) best = z, best_cost = cost;
    }
    return best;
}

// Launches mmq_rows_kernel<Q, NT, MT, WM> in clusters of z blocks (1, 2 or 4; 0: rows_auto_cluster;
// 1 where the device launches no clusters of it): -1 where 2 stages do not fit the device's shared
// memory (the caller takes mmq_kernel: the same bits), else a cudaError_t.
template <class Q, int NT, int MT, int WM>
int launch_rows(const MmqArgs &a, int64_t token_blocks, int z, cudaStream_t stream) {
    auto kernel = mmq_rows_kernel<Q, NT, MT, WM>;
    static const int stages[3] = {rows_stages<Q, NT, MT, WM>(rows_smem_limit(), rows_max_stages(), 1),
                                  rows_stages<Q, NT, MT, WM>(rows_smem_limit(), rows_max_stages(), 2),
                                  rows_stages<Q, NT, MT, WM>(rows_smem_limit(), rows_max_stages(), 4)};
    auto smem_of = [](int z_, int s) { return s * rows_stage_bytes<Q, NT, MT, WM>() + rows_tot_bytes<NT, MT, WM>(z_); };
    static const cudaError_t attr = [&] {  // the largest of the three sizes
        int most = 0;
        for (int i = 0; i < 3; ++i) most = stages[i] && smem_of(1 << i, stages[i]) > most ? smem_of(1 << i, stages[i]) : most;
        return most ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most) : cudaSuccess;
    }();
    if (attr != cudaSuccess) return (int)attr;
    const int64_t row_blocks = (a.n + 16 * MT * WM - 1) / (16 * MT * WM);
    const dim3 block(WM * WARP_SIZE);
    if (z == 0) {
        static const int resident = stages[0] ? resident_blocks(kernel, (int)block.x, smem_of(1, stages[0])) : 0;
        z = rows_auto_cluster(row_blocks * token_blocks, resident, a.x.chunks);
    }
#if !defined(__HIPCC__)
    const int zi = z == 4 ? 2 : z == 2 ? 1 : 0;
    if (z > 1 && stages[zi] && cluster::launches() &&
        cluster::fits<mmq_rows_kernel<Q, NT, MT, WM>>((unsigned)z, block.x, smem_of(z, stages[zi])))
        return (int)cluster::launch(kernel, dim3((unsigned)(row_blocks * token_blocks), 1, (unsigned)z), block,
                                    smem_of(z, stages[zi]), stream, true, (unsigned)z, a, (int)token_blocks, stages[zi]);
#endif
    if (stages[0] == 0) return -1;
    return (int)launch_overlapped(kernel, dim3((unsigned)(row_blocks * token_blocks)), block, smem_of(1, stages[0]),
                                  stream, true, a, (int)token_blocks, stages[0]);
}

template <class Q, int MT, int WM>
int launch_rows(const MmqArgs &a, int z, cudaStream_t stream) {
    int64_t token_blocks = 0;
    switch (rows_tiles(a.rows, token_blocks)) {
        case 2: return launch_rows<Q, 2, MT, WM>(a, token_blocks, z, stream);
        case 3: return launch_rows<Q, 3, MT, WM>(a, token_blocks, z, stream);
        case 4: return launch_rows<Q, 4, MT, WM>(a, token_blocks, z, stream);
        default: return launch_rows<Q, 5, MT, WM>(a, token_blocks, z, stream);
    }
}

}  // namespace
