// Matmul fused with GGUF dequant: y [rows, n] f32 = x [rows, k] f32 @ W^T (+ bias [n]).
// W [n, k] in GGUF blocks, row-major (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q5_0, F16, BF16, F32;
// readers in matmul_kquants.cuh, matmul_blocks.cuh, matmul_float.cuh). Reference:
// luce/ref/matmul.py on luce.gguf.quants.dequantize(W). ABI: luce_matmul in luce_ops.h.
//
// Block types, two launches:
// 1. quantize_x: per row and 256-value chunk, x = scale * q with q 16-bit (|q| <= 32767,
//    scale = max|x| / 32767), stored as a signed high byte and an unsigned low byte in the
//    mma B layout (matmul_mma.cuh), plus the f32 sums of every 16 values of x.
// 2. mmq: per 32-value group, integer tensor-core products of the weights' small integers
//    with both bytes give the exact sum(q_w * q_x); then in f32, per output element,
//        chunk_acc += scale_w * sum          (per group, group order)
//        acc       += offset_w * sum(x)      (per group; mins, -32 of Q6_K, -16 of Q5_0)
//        acc       += scale_x * chunk_acc    (per chunk)
//    over the chunks kw, kw + 4, kw + 8, ... of warp kw, then y = ((acc0 + acc1) + acc2)
//    + acc3 (+ bias). The order depends on k only: a row's bits never depend on the other
//    rows, on the launch shape (tokens per block NT, row tiles per block WM) or on the path.
//    A block is 4 chunk sets x WM row tiles of 16 rows x TS token sets of 8 * NT tokens;
//    each warp streams its 16 rows' chunks through shared memory (cp.async, 2 to 4 stages
//    deep, matmul_stage.cuh) and padding tokens read no activations.
#include "matmul_kquants.cuh"
#include "matmul_blocks.cuh"
#include "matmul_float.cuh"
#include "matmul_stage.cuh"

namespace {

using namespace mm;

constexpr int kKSplit = 4;      // warps splitting a row tile's chunks (fixes the reduction order)
constexpr int kGroups = 8;      // 32-value groups per 256-value chunk
constexpr float kQMax = 32767.0f;

__host__ __device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

// Quantized x in the workspace, rows padded to tp (a multiple of 8; pad rows are zero).
struct XLayout {
    uint4 *xq;     // [tp][groups][4 quads]: {high bytes of values 4q.., of 16+4q.., low bytes ..}
    float *xd;     // [chunks][tp]: scale of the chunk's integers
    float4 *xs;    // [groups][tp / 2]: {S0[t], S0[t+1], S1[t], S1[t+1]}, sums of values 0..15, 16..31
    int64_t tp, groups, chunks;
};

int64_t padded_rows(int64_t rows) { return (rows + 7) / 8 * 8; }

int64_t x_bytes(int64_t rows, int64_t k) {
    const int64_t tp = padded_rows(rows), groups = (k + 31) / 32, chunks = (k + 255) / 256;
    return tp * (64 * groups + 4 * chunks + 8 * groups);
}

XLayout x_layout(void *ws, int64_t rows, int64_t k) {
    XLayout l;
    l.tp = padded_rows(rows);
    l.groups = k / 32;
    l.chunks = (k + 255) / 256;
    uint8_t *p = static_cast<uint8_t *>(ws);
    l.xq = reinterpret_cast<uint4 *>(p);
    l.xd = reinterpret_cast<float *>(p + l.tp * l.groups * 64);
    l.xs = reinterpret_cast<float4 *>(p + l.tp * l.groups * 64 + l.chunks * l.tp * 4);
    return l;
}

// One warp per (row, chunk): lane = 4 * group + quad holds values 4q..4q+3 and 16+4q..16+4q+3.
__global__ void __launch_bounds__(256) quantize_x_kernel(const float *x, int64_t rows, int64_t k,
                                                         XLayout l) {
    const int lane = threadIdx.x % WARP_SIZE, quad = lane & 3, j = lane >> 2;
    const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    if (item >= l.tp * l.chunks) return;  // whole warps
    const int64_t t = item / l.chunks, ch = item % l.chunks, g = ch * kGroups + j;
    float v[8] = {};
    if (t < rows && g < l.groups) {
        const float *src = x + t * k + 32 * g;
        const float4 a = __ldg(reinterpret_cast<const float4 *>(src + 4 * quad));
        const float4 b = __ldg(reinterpret_cast<const float4 *>(src + 16 + 4 * quad));
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
    float amax = 0.0f, bad = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float m = fabsf(v[i]);
        amax = fmaxf(amax, m);
        if (!(m <= 3.0e38f)) bad = 1.0f;  // inf or NaN: the chunk's outputs become NaN
    }
    amax = warp_max(amax);
    bad = warp_max(bad);
    const float inv = (bad == 0.0f && amax > 0.0f) ? kQMax / amax : 0.0f;
    uint32_t hi[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int q = (int)rintf(__fmul_rn(v[i], inv));
        q = q > 32767 ? 32767 : (q < -32767 ? -32767 : q);
        hi[i >> 2] |= (uint32_t)((q >> 8) & 0xFF) << (8 * (i & 3));
        lo[i >> 2] |= (uint32_t)(q & 0xFF) << (8 * (i & 3));
    }
    float s0 = (v[0] + v[1]) + (v[2] + v[3]), s1 = (v[4] + v[5]) + (v[6] + v[7]);
    s0 = s0 + warp_shfl_xor(s0, 1);
    s0 = s0 + warp_shfl_xor(s0, 2);
    s1 = s1 + warp_shfl_xor(s1, 1);
    s1 = s1 + warp_shfl_xor(s1, 2);
    if (g < l.groups) {
        l.xq[(t * l.groups + g) * 4 + quad] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
        if (quad == 0) {
            float *s = reinterpret_cast<float *>(l.xs + g * (l.tp / 2) + t / 2);
            s[t & 1] = s0;
            s[2 + (t & 1)] = s1;
        }
    }
    if (lane == 0) l.xd[ch * l.tp + t] = bad != 0.0f ? __int_as_float(0x7FC00000) : amax / kQMax;
}

struct MmqArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XLayout x;
    int64_t rows, n, row_bytes;
};

template <class Q>
__device__ __forceinline__ int chunk_groups(const XLayout &x, int64_t ch) {
    return Q::kGroupBytes ? (int)imin64(kGroups, x.groups - ch * kGroups) : kGroups;
}

// Adds one chunk of the thread's two rows (reader `rd`) to acc[token tile][element].
// Tokens at or past `live` (padding) read no activations: their products are never stored.
template <class Q, int NT, bool kMagic>
__device__ __forceinline__ void mmq_chunk(const Q &rd, const XLayout &x, int64_t ch, const int64_t tb[NT],
                                          const int64_t live[NT], int grp, int quad, float acc[NT][4]) {
    const int ng = chunk_groups<Q>(x, ch);
    const int seed = kMagic ? kMagicSeed : 0;
    float2 xscale[NT];
    float cacc[NT][4] = {};
#pragma unroll
    for (int n = 0; n < NT; ++n)
        xscale[n] = 2 * quad < live[n] ? __ldg(reinterpret_cast<const float2 *>(x.xd + ch * x.tp + tb[n]) + quad)
                                       : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
        if (j >= ng) break;
        GroupOperands op;
        rd.group(j, quad, op);
        const int64_t g = ch * kGroups + j;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const uint4 b = grp < live[n] ? __ldg(x.xq + ((tb[n] + grp) * x.groups + g) * 4 + quad)
                                          : make_uint4(0, 0, 0, 0);
            int hi[4], lo[4];
            if (!Q::kHalves) {
                mma_k32<false>(op.a, b.x, b.y, seed, hi);
                mma_k32<true>(op.a, b.z, b.w, seed, lo);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    cacc[n][e] = fmaf(op.scale[0][e >> 1], group_sum<kMagic>(hi[e], lo[e]), cacc[n][e]);
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    mma_k16<false>(op.a[2 * h], op.a[2 * h + 1], h ? b.y : b.x, seed, hi);
                    mma_k16<true>(op.a[2 * h], op.a[2 * h + 1], h ? b.w : b.z, seed, lo);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        cacc[n][e] = fmaf(op.scale[h][e >> 1], group_sum<kMagic>(hi[e], lo[e]), cacc[n][e]);
                }
            }
            if (Q::kOffset) {
                const float4 s = 2 * quad < live[n] ? __ldg(x.xs + g * (x.tp / 2) + tb[n] / 2 + quad)
                                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e >> 1;
                    if (!Q::kHalves) {
                        const float s32 = (e & 1) ? s.y + s.w : s.x + s.z;
                        acc[n][e] = fmaf(op.offset[0][r], s32, acc[n][e]);
                    } else {
                        acc[n][e] = fmaf(op.offset[0][r], (e & 1) ? s.y : s.x, acc[n][e]);
                        acc[n][e] = fmaf(op.offset[1][r], (e & 1) ? s.w : s.z, acc[n][e]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = fmaf((e & 1) ? xscale[n].y : xscale[n].x, cacc[n][e], acc[n][e]);
}

// Block: 4 * WM * TS warps = 4 chunk sets x WM row tiles of 16 rows x TS token sets of 8 * NT
// tokens; each warp multiplies its row tile's chunks kw, kw + 4, ... for its tokens, with the
// weight chunks staged kStages deep in its own shared memory (matmul_stage.cuh).
template <class Q, int NT>
__host__ __device__ constexpr int stages() { return NT > 1 ? 2 : Stage<Q>::kBytes > 3000 ? 3 : 4; }

template <class Q, int NT, int WM, int TS>
__host__ __device__ constexpr int stage_smem_bytes() { return kKSplit * WM * TS * stages<Q, NT>() * Stage<Q>::kBytes; }

template <class Q, int NT, int WM, int TS>
__global__ void __launch_bounds__(kKSplit * WM * TS * WARP_SIZE, 512 / (kKSplit * WM * TS * WARP_SIZE))
mmq_kernel(MmqArgs a) {
    constexpr int kStages = stages<Q, NT>();
    extern __shared__ uint4 stage_words[];  // 16-byte aligned
    uint8_t *stage_mem = reinterpret_cast<uint8_t *>(stage_words);
    __shared__ float partial[kKSplit - 1][WM * TS][NT * 4][WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int kw = warp % kKSplit, mw = (warp / kKSplit) % WM, ts = warp / (kKSplit * WM);
    const int slot = warp / kKSplit, grp = lane >> 2, quad = lane & 3;
    const int64_t tile = ((int64_t)blockIdx.x * WM + mw) * 16;
    const uint8_t *w0 = a.w + imin64(tile + grp, a.n - 1) * a.row_bytes;
    const uint8_t *w1 = a.w + imin64(tile + grp + 8, a.n - 1) * a.row_bytes;
    const int64_t t_first = ((int64_t)blockIdx.y * TS + ts) * 8 * NT;
    int64_t tb[NT], live[NT];  // first token of each 8-token tile (clamped), real tokens in it
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        tb[n] = imin64(t_first + 8 * n, a.x.tp - 8);
        live[n] = a.rows - (t_first + 8 * n);
    }
    float acc[NT][4] = {};
    uint8_t *stages_of_warp = stage_mem + warp * kStages * Stage<Q>::kBytes;
    const int64_t count = a.x.chunks > kw ? (a.x.chunks - kw + kKSplit - 1) / kKSplit : 0;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < count)
            stage_copy<Q>(stages_of_warp + s * Stage<Q>::kBytes, a.w, a.w_end, a.row_bytes, a.n, tile,
                          kw + (int64_t)kKSplit * s, lane);
        cp_async_commit();
    }
    for (int64_t i = 0; i < count; ++i) {
        const int64_t ahead = i + kStages - 1;
        if (ahead < count)
            stage_copy<Q>(stages_of_warp + (ahead % kStages) * Stage<Q>::kBytes, a.w, a.w_end, a.row_bytes,
                          a.n, tile, kw + kKSplit * ahead, lane);
        cp_async_commit();
        cp_async_wait<kStages - 1>();  // this thread's copies of chunk i have landed
        __syncwarp();                   // and every other lane's
        const int64_t ch = kw + kKSplit * i;
        const uint8_t *st = stages_of_warp + (i % kStages) * Stage<Q>::kBytes;
        Q rd;
        rd.load(staged_row<Q>(st, grp, w0 + ch * Q::kChunkBytes), staged_row<Q>(st, grp + 8, w1 + ch * Q::kChunkBytes),
                quad, chunk_groups<Q>(a.x, ch));
        mmq_chunk<Q, NT, (NT > 1)>(rd, a.x, ch, tb, live, grp, quad, acc);
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
            float v = acc[n][e];
#pragma unroll
            for (int s = 0; s < kKSplit - 1; ++s) v = v + partial[s][slot][n * 4 + e][lane];
            const int64_t row = tile + grp + 8 * (e >> 1), t = t_first + 8 * n + 2 * quad + (e & 1);
            if (row < a.n && t < a.rows) {
                if (a.bias) v = v + a.bias[row];
                a.y[t * a.n + row] = v;
            }
        }
}

template <class Q, int NT, int WM, int TS>
int launch_mmq(const MmqArgs &a, cudaStream_t stream) {
    constexpr int kTokens = 8 * NT * TS, kSmem = stage_smem_bytes<Q, NT, WM, TS>();
    static bool smem_set = false;  // raise the dynamic shared-memory limit once per kernel
    if (!smem_set) {
        const cudaError_t err = cudaFuncSetAttribute(mmq_kernel<Q, NT, WM, TS>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return luce_status(err);
        smem_set = true;
    }
    const dim3 grid((unsigned)((a.n + 16 * WM - 1) / (16 * WM)), (unsigned)((a.rows + kTokens - 1) / kTokens));
    mmq_kernel<Q, NT, WM, TS><<<grid, kKSplit * WM * TS * WARP_SIZE, kSmem, stream>>>(a);
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
