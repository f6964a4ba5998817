// Matmul fused with GGUF dequant: y [rows, n] f32 = x [rows, k] f32 @ W^T (+ bias [n]).
// W [n, k] in GGUF blocks, row-major (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q5_0, F16, BF16, F32;
// readers in matmul_kquants.cuh, matmul_blocks.cuh, matmul_float.cuh). Reference:
// luce/ref/matmul.py on luce.gguf.quants.dequantize(W). ABI: luce_matmul in luce_ops.h.
//
// Block types, two launches:
// 1. quantize_x: per row and 256-value chunk, x = scale * q with q 16-bit (|q| <= 32767,
//    scale = max|x| / 32767), stored as a signed high byte and an unsigned low byte in the
//    mma B layout (matmul_mma.cuh), plus the f32 sums of every 16 values of x and the
//    exact integer sums of every 32 as byte planes (matmul_x.cuh).
// 2. mmq: per 32-value group, integer tensor-core products of the weights' small integers
//    with both bytes give the exact sum(q_w * q_x). Types with small integer scales (Q4_K,
//    Q5_K, Q6_K, IQ4_XS) sum scale * product in integers over a chunk and go to f32 once per
//    chunk; Q8_0 and Q5_0 (f16 scale per group) add scale * float(product) per group
//    (matmul_chunk.cuh). Per output element, the chunks kp, kp + 4, kp + 8, ... go to
//    accumulator kp, then y = ((acc0 + acc1) + acc2) + acc3 (+ bias). The order depends on
//    k only: a row's bits never depend on the other rows, on the launch shape (tokens per
//    block NT, row tiles per block WM) or on the path.
//    A block is 4 warps (one per k part) x WM row tiles of 16 rows x TS token sets of 8 * NT
//    tokens; each warp streams its 16 rows' chunks through shared memory (cp.async, 2 to 4
//    stages deep, matmul_stage.cuh) and padding tokens read no activations.
#include "matmul_kquants.cuh"
#include "matmul_blocks.cuh"
#include "matmul_float.cuh"
#include "matmul_stage.cuh"
#include "matmul_chunk.cuh"

namespace {

using namespace mm;

constexpr int kKSplit = 4;  // k parts: warps sharing a row tile (fixes the reduction order)

__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

struct MmqArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XLayout x;
    int64_t rows, n, row_bytes;
};

// Block: 4 * WM * TS warps = 4 k parts x WM row tiles of 16 rows x TS token sets of 8 * NT
// tokens; each warp multiplies its row tile's chunks kw, kw + 4, ... for its tokens, with the
// weight chunks staged kStages deep in its own shared memory (matmul_stage.cuh). kEven: one
// row (only even token columns are live).
template <class Q, int NT>
__host__ __device__ constexpr int stages() { return NT > 1 ? 2 : Stage<Q>::kBytes > 3000 ? 3 : 4; }

template <class Q, int NT, int WM, int TS>
__host__ __device__ constexpr int stage_smem_bytes() { return kKSplit * WM * TS * stages<Q, NT>() * Stage<Q>::kBytes; }

template <class Q, int NT, int WM, int TS, bool kEven>
__global__ void __launch_bounds__(kKSplit * WM * TS * WARP_SIZE, 512 / (kKSplit * WM * TS * WARP_SIZE))
mmq_kernel(MmqArgs a) {
    constexpr int KS = kKSplit;
    constexpr int kStages = stages<Q, NT>();
    extern __shared__ uint4 stage_words[];  // 16-byte aligned
    uint8_t *stage_mem = reinterpret_cast<uint8_t *>(stage_words);
    __shared__ float partial[KS - 1][WM * TS][NT * 4][WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int kw = warp % KS, mw = (warp / KS) % WM, ts = warp / (KS * WM);
    const int slot = warp / KS, grp = lane >> 2, quad = lane & 3;
    const int64_t tile = ((int64_t)blockIdx.x * WM + mw) * 16;
    const uint8_t *w0 = a.w + imin64(tile + grp, a.n - 1) * a.row_bytes;
    const uint8_t *w1 = a.w + imin64(tile + grp + 8, a.n - 1) * a.row_bytes;
    const int64_t t_first = ((int64_t)blockIdx.y * TS + ts) * 8 * NT;
    XTile xt[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int64_t live = a.rows - (t_first + 8 * n);  // real tokens in the tile
        const int64_t tb = imin64(t_first + 8 * n, a.x.tp - 8);  // clamped into the padded rows
        xt[n].xb = a.x.xq + (tb + grp) * a.x.groups * 4 + quad;
        xt[n].xd = a.x.xd + tb + 2 * quad;
        xt[n].xqp = a.x.xqp + (tb + 2 * quad) * 2;
        xt[n].xs = a.x.xs + tb / 2 + quad;
        xt[n].b_live = grp < live;
        xt[n].s_live = 2 * quad < live;
    }
    float acc[NT][4] = {};
    uint8_t *stages_of_warp = stage_mem + warp * kStages * Stage<Q>::kBytes;
    LaneCopier<Q, kStages> copier(stages_of_warp, a.w, a.w_end, a.row_bytes, a.n, tile, lane);
    const int count = a.x.chunks > kw ? (int)((a.x.chunks - kw + KS - 1) / KS) : 0;
#pragma unroll
    for (int n = 0; n < NT; ++n) xt[n].advance(a.x, kw);  // to chunk kw
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < count) copier.copy(s, kw + (int64_t)KS * s, lane);
        copier.commit();
    }
    int fill = kStages - 1, use = 0;  // stages of chunk i + kStages - 1 and of chunk i
    for (int i = 0; i < count; ++i) {
        if (i + kStages - 1 < count) copier.copy(fill, kw + (int64_t)KS * (i + kStages - 1), lane);
        copier.commit();
        copier.wait(use);  // chunk i has landed, for every lane
        const int64_t ch = kw + (int64_t)KS * i;
        const uint8_t *st = stages_of_warp + use * Stage<Q>::kBytes;
        fill = fill + 1 == kStages ? 0 : fill + 1;
        use = use + 1 == kStages ? 0 : use + 1;
        Q rd;
        rd.load(staged_row<Q>(st, grp, w0 + ch * Q::kChunkBytes), staged_row<Q>(st, grp + 8, w1 + ch * Q::kChunkBytes),
                quad, chunk_groups<Q>(a.x, ch));
        if constexpr (Q::kIntScale)
            mmq_chunk_int<Q, NT, kEven>(rd, xt, quad, acc);
        else
            mmq_chunk_float<Q, NT, (NT > 1)>(rd, a.x, ch, xt, quad, acc);
#pragma unroll
        for (int n = 0; n < NT; ++n) xt[n].advance(a.x, KS);
        __syncwarp();  // every lane is done with the stage before a later iteration refills it
    }
    if (kw != 0) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) partial[kw - 1][slot][n * 4 + e][lane] = acc[n][e];
    }
    __syncthreads();
    if (kw != 0) return;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (kEven && (e & 1)) continue;
            float v = acc[n][e];
#pragma unroll
            for (int s = 0; s < KS - 1; ++s) v = v + partial[s][slot][n * 4 + e][lane];
            const int64_t row = tile + grp + 8 * (e >> 1), t = t_first + 8 * n + 2 * quad + (e & 1);
            if (row < a.n && t < a.rows) {
                if (a.bias) v = v + a.bias[row];
                a.y[t * a.n + row] = v;
            }
        }
}

template <class Q, int NT, int WM, int TS, bool kEven = false>
int launch_mmq(const MmqArgs &a, cudaStream_t stream) {
    constexpr int kTokens = 8 * NT * TS, kSmem = stage_smem_bytes<Q, NT, WM, TS>();
    static bool smem_set = false;  // raise the dynamic shared-memory limit once per kernel
    if (!smem_set) {
        const cudaError_t err = cudaFuncSetAttribute(mmq_kernel<Q, NT, WM, TS, kEven>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return luce_status(err);
        smem_set = true;
    }
    const dim3 grid((unsigned)((a.n + 16 * WM - 1) / (16 * WM)), (unsigned)((a.rows + kTokens - 1) / kTokens));
    mmq_kernel<Q, NT, WM, TS, kEven><<<grid, kKSplit * WM * TS * WARP_SIZE, kSmem, stream>>>(a);
    return luce_status(cudaGetLastError());
}

// Launch shape from the row count (decode) or fixed (prefill); `tune` 2 doubles the row tiles
// per block. Every shape computes the same bits (see the header).
template <class Q>
int launch_quant(const MmqArgs &a, int path, int tune, cudaStream_t stream) {
    const int64_t t = path == LUCE_MATMUL_PREFILL ? (int64_t)1 << 40 : a.rows;
    if (tune == 2) {
        if (t <= 8) return launch_mmq<Q, 1, 2, 1>(a, stream);
        if (t <= 16) return launch_mmq<Q, 2, 2, 1>(a, stream);
        return launch_mmq<Q, 2, 2, 2>(a, stream);
    }
    if (t == 1) return launch_mmq<Q, 1, 1, 1, true>(a, stream);
    if (t <= 8) return launch_mmq<Q, 1, 1, 1>(a, stream);
    if (t <= 16) return launch_mmq<Q, 2, 1, 1>(a, stream);
    if (t <= 32) return launch_mmq<Q, 2, 1, 2>(a, stream);
    return launch_mmq<Q, 2, 1, 4>(a, stream);
}

bool is_block_type(int qtype) { return qtype != LUCE_QT_F32 && qtype != LUCE_QT_F16 && qtype != LUCE_QT_BF16; }

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

extern "C" int64_t luce_matmul_row_bytes(int32_t qtype, int64_t k) {
    int64_t block = 0, bytes = 0;
    switch (qtype) {
        case LUCE_QT_F32: block = 1; bytes = 4; break;
        case LUCE_QT_F16: case LUCE_QT_BF16: block = 1; bytes = 2; break;
        case LUCE_QT_Q8_0: block = 32; bytes = 34; break;
        case LUCE_QT_Q5_0: block = 32; bytes = 22; break;
        case LUCE_QT_Q4_K: block = 256; bytes = 144; break;
        case LUCE_QT_Q5_K: block = 256; bytes = 176; break;
        case LUCE_QT_Q6_K: block = 256; bytes = 210; break;
        case LUCE_QT_IQ4_XS: block = 256; bytes = 136; break;
        default: return -1;
    }
    if (k <= 0 || k % block != 0) return -1;
    return k / block * bytes;
}

extern "C" int64_t luce_matmul_workspace_bytes(int64_t rows, int64_t k) {
    return rows <= 0 || k <= 0 ? 0 : x_bytes(rows, k);
}

extern "C" int luce_matmul(const luce_matmul_params *p, void *stream_ptr) {
    if (p->rows == 0) return 0;
    const int64_t row_bytes = luce_matmul_row_bytes(p->qtype, p->k);
    if (p->rows < 0 || p->n <= 0 || row_bytes < 0 || !p->x || !p->w || !p->y || p->tune < 0 ||
        p->tune > 2 || (p->path != LUCE_MATMUL_DECODE && p->path != LUCE_MATMUL_PREFILL))
        return (int)cudaErrorInvalidValue;
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    if (!is_block_type(p->qtype)) {
        FloatArgs a{p->x, static_cast<const uint8_t *>(p->w), p->bias, p->y, p->rows, p->n, p->k, row_bytes};
        if (p->qtype == LUCE_QT_F32) return launch_float_matmul<LUCE_QT_F32>(a, stream);
        if (p->qtype == LUCE_QT_F16) return launch_float_matmul<LUCE_QT_F16>(a, stream);
        return launch_float_matmul<LUCE_QT_BF16>(a, stream);
    }
    if (!p->workspace || p->workspace_bytes < x_bytes(p->rows, p->k) || !aligned16(p->x) ||
        !aligned16(p->workspace) || p->rows > 65535LL * 64)
        return (int)cudaErrorInvalidValue;
    const XLayout xl = x_layout(p->workspace, p->rows, p->k);
    if (!(p->flags & LUCE_MATMUL_REUSE_X)) {
        const int64_t warps = xl.tp * xl.chunks;
        const int per_block = 256 / WARP_SIZE;
        quantize_x_kernel<<<(unsigned)((warps + per_block - 1) / per_block), 256, 0, stream>>>(p->x, p->rows, p->k, xl);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return luce_status(err);
    }
    const uint8_t *w = static_cast<const uint8_t *>(p->w);
    const MmqArgs a{w, w + p->n * row_bytes, p->bias, p->y, xl, p->rows, p->n, row_bytes};
    switch (p->qtype) {
        case LUCE_QT_Q4_K: return launch_quant<ReaderQ4K>(a, p->path, p->tune, stream);
        case LUCE_QT_Q5_K: return launch_quant<ReaderQ5K>(a, p->path, p->tune, stream);
        case LUCE_QT_Q6_K: return launch_quant<ReaderQ6K>(a, p->path, p->tune, stream);
        case LUCE_QT_IQ4_XS: return launch_quant<ReaderIQ4XS>(a, p->path, p->tune, stream);
        case LUCE_QT_Q8_0: return launch_quant<ReaderQ80>(a, p->path, p->tune, stream);
        case LUCE_QT_Q5_0: return launch_quant<ReaderQ50>(a, p->path, p->tune, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
