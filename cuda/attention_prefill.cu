// Tiled paged attention for prompt rows: rows 0..prompt_rows-1 of a luce_attention launch
// (cuda/luce_ops.h; reference luce/ref/attention.py, the shared f32 operation order
// luce/ref/attention_prefill.py). It writes the partition kernel's
// workspace entries (cuda/attention.cu: unnormalized partial_o, max score m, sum of
// exponentials l per row, query head and partition of LUCE_ATTN_PARTITION absolute keys)
// bitwise, and the one combine kernel merges them: a row's output is the same whichever
// kernel computed it, whatever rows share its tile and whatever else is in the launch.
//
// Grid (tiles, Hkv, n_parts): block (tile, hk, part) takes the tile's rows (kTileQV / G
// consecutive rows; G = Hq / Hkv query heads each, kTileQV query vectors in all), splits them
// at segment boundaries, and for each piece streams the partition's K rows, then its V rows,
// through shared memory in sub-tiles of kSubKeys keys: each K/V row is read once per tile,
// not once per row. Per query vector it repeats the partition kernel's arithmetic exactly:
//   score(j) = (((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))) * scale, p_i the fmaf
//              chain over float4 slices c * 8 + i of q . k (the kernel's 8 lanes per key and
//              its xor-shuffle tree), x, y, z, w in order;
//   m, l        partition_softmax (attention_common.cuh), the function both kernels call;
//   o           KL = kThreads / (D / 4) chains per column, chain u summing keys j = u mod KL
//               in increasing j with fmaf, then chain 0 + chain 1 + ... in order.
// A thread owns kScoreQV x kScoreKeys (query vector, key) pairs in the score pass and
// kValueQV query vectors x one float4 column (all KL chains) in the value pass. Rows past a
// row's own keys are skipped (never weighted by 0), so the bits do not depend on its tile.
//
// Roof. Per row, query head and attended key: 2D FMA (q.k and the weighted v) = 4D FLOP and
// one expf. A tile reads its keys' K and V once: per partition 2 * P * D * 4 bytes against
// kTileQV * P * 4D FLOP, kTileQV / 2 = 16 FLOP per byte (G = 6: 30 of the 32 query slots
// live, 15) against the H200's f32 ridge of 67 TFLOP/s / 4.8 TB/s = 14; the tiles of one
// (KV head, partition) run side by side, so most K/V reads hit L2. So the roof is the f32 FMA
// rate, 67 TFLOP/s (CUDA cores: bitwise equality with the per-row kernel rules out tensor
// cores). A 512-row prompt chunk ending at 4,096 / 12,288 keys is 48 / 151 GFLOP at the 27B
// shape (Hq 24, D 256): 0.72 / 2.3 ms at the roof; 12 / 38 GFLOP at the Coder-1.5B shape
// (Hq 12, D 128): 0.18 / 0.56 ms. A whole prompt: the 27B at 12,000 tokens (16 attention
// layers) is 28 TFLOP, 0.42 s at the roof; the 1.5B at 4,096 tokens (28 layers) 1.4 TFLOP, 21 ms.
#include "attention_common.cuh"

namespace luce_attn {
namespace {

constexpr int kTileThreads = 256;
constexpr int kTileQV = 32;     // query vectors (row, head) per tile; rows per tile = kTileQV / G
constexpr int kScoreQV = 4;     // query vectors per thread in the score pass
constexpr int kScoreBlock = 32; // threads of one 8 key x 4 query group block (any wave width)
constexpr int kSStride = kPartition + 8;  // score row stride: 8 banks apart, float4-aligned

template <int D>
struct TileShape {
    static constexpr int kRowStride = D + 4;                 // Q and K/V rows: conflict-free float4 columns
    static constexpr int kSubKeys = D >= 256 ? 32 : 64;      // keys per K/V sub-tile
    static constexpr int kScoreKeys = kSubKeys / 32;         // keys per thread in the score pass
    static constexpr int kCols = D / 4;                      // float4 columns of a row
    static constexpr int kKeyLanes = kThreads / kCols;       // the partition kernel's value chains (KL)
    static constexpr int kValueGroups = kTileThreads / kCols;
    static constexpr int kValueQV = kTileQV / kValueGroups;  // query vectors per thread, value pass
    static constexpr int kKeyStep = kKeyLanes > 4 ? kKeyLanes : 4;  // keys per value-pass step
    static constexpr size_t kSmemFloats =
        (size_t)kTileQV * kRowStride + (size_t)kTileQV * kSStride + (size_t)kSubKeys * kRowStride;
    static constexpr size_t kSmemBytes = kSmemFloats * sizeof(float);
    static_assert(kTileThreads == 256 && kTileQV == 8 * kScoreQV, "score layout: 32 key x 8 query groups");
    static_assert(kSubKeys % kKeyStep == 0 && kPartition % kSubKeys == 0, "sub-tiles cut at key steps");
    static_assert(kValueQV * kValueGroups == kTileQV, "value layout");
};

// Keys sub0..sub0+n_sub-1 of the partition (K or V rows of KV head hk: page_off) into
// kv_s [kSubKeys][kRowStride]; rows past n_sub are zero.
template <int D>
__device__ __forceinline__ void load_sub_tile(const float *pages, const int64_t *page_off, int sub0, int n_sub,
                                              int32_t page_shift, int64_t key_stride, float *kv_s) {
    using S = TileShape<D>;
    const int32_t page_mask = (1 << page_shift) - 1;
    for (int i = threadIdx.x; i < S::kSubKeys * S::kCols; i += kTileThreads) {
        const int j = i / S::kCols, c = i % S::kCols, jj = sub0 + j;
        const float4 x = j < n_sub ? reinterpret_cast<const float4 *>(
            pages + page_off[jj >> page_shift] + (int64_t)(jj & page_mask) * key_stride)[c] : zero4();
        reinterpret_cast<float4 *>(kv_s + j * S::kRowStride)[c] = x;
    }
}

// The value pass over keys sub0..sub0+n_sub-1 (V rows in kv_s, weights exp(s - m) in s_s):
// key sub0 + j goes to chain j % KL of each of the thread's query vectors, in increasing j.
// MASKED: a vector takes only its own keys (< n_v); unmasked where all of them are its own.
template <int D, bool MASKED>
__device__ __forceinline__ void value_keys(const float *kv_s, const float *s_s, int vg, int col, int sub0,
                                           int n_sub, const int32_t (&n_v)[TileShape<D>::kValueQV],
                                           float4 (&acc)[TileShape<D>::kValueQV][TileShape<D>::kKeyLanes]) {
    using S = TileShape<D>;
    constexpr int KL = S::kKeyLanes;
    for (int j0 = 0; j0 < n_sub; j0 += S::kKeyStep) {
        float4 vr[S::kKeyStep];
#pragma unroll
        for (int u = 0; u < S::kKeyStep; ++u)
            vr[u] = reinterpret_cast<const float4 *>(kv_s + (j0 + u) * S::kRowStride)[col];
#pragma unroll
        for (int i = 0; i < S::kValueQV; ++i) {
            const float *e = s_s + (vg + S::kValueGroups * i) * kSStride + sub0 + j0;
#pragma unroll
            for (int u4 = 0; u4 < S::kKeyStep; u4 += 4) {
                const float4 e4 = *reinterpret_cast<const float4 *>(e + u4);
                const float w[4] = {e4.x, e4.y, e4.z, e4.w};
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int u = u4 + k;  // chain u % KL: sub0 and j0 are multiples of KL
                    if (!MASKED || sub0 + j0 + u < n_v[i]) fma4(w[k], vr[u], acc[i][u % KL]);
                }
            }
        }
    }
}

// One block-uniform piece: rows r0..r1-1 of one segment, all in the tile.
template <int D>
__device__ void tile_piece(const luce_attention_params &p, int32_t r0, int32_t r1, int32_t hk,
                           int32_t part, int32_t n_parts, int32_t page_shift, float *smem,
                           int64_t *page_off, int32_t *row_n, int32_t *row_state) {
    using S = TileShape<D>;
    constexpr int C4 = D / (4 * kLanesPerKey);
    const int G = p.n_heads_q / p.n_heads_kv;
    const int nq = (r1 - r0) * G;  // live query vectors
    const int32_t key0 = part * kPartition;
    const int64_t key_stride = (int64_t)p.n_heads_kv * D;
    const int32_t page_mask = (1 << page_shift) - 1;
    float *q_s = smem;                                  // [kTileQV][kRowStride]
    float *s_s = q_s + kTileQV * S::kRowStride;         // [kTileQV][kSStride] scores, then exp(s - m)
    float *kv_s = s_s + kTileQV * kSStride;             // [kSubKeys][kRowStride]

    // Each row's keys in this partition (row_n; <= 0: none) and its kind (row_state:
    // 0 ordinary, 1 tree row, which this kernel does not address: NaN statistics).
    if (threadIdx.x < kTileQV) {
        int32_t n = 0, state = 0;
        const int32_t row = r0 + (int32_t)threadIdx.x;
        if (row < r1) {
            const RowKeys rk = attention_row_keys(p, row);
            n = min(kPartition, rk.keys - key0);
            state = p.tree_parents != nullptr && p.tree_parents[row] >= 0;
        }
        row_n[threadIdx.x] = n;
        row_state[threadIdx.x] = state;
    }
    __syncthreads();
    int32_t n_tile = 0, n_min = kPartition;  // most and fewest keys a live row attends here
    for (int r = 0; r < r1 - r0; ++r) {
        if (row_state[r] || row_n[r] <= 0) continue;
        n_tile = max(n_tile, row_n[r]);
        n_min = min(n_min, row_n[r]);
    }
    const int32_t page_base = p.kv_indptr[attention_segment_of(p, r0)];
    const int32_t pages = (n_tile + page_mask) >> page_shift;
    for (int i = threadIdx.x; i < pages; i += kTileThreads) {
        const int64_t page = p.kv_indices[page_base + (key0 >> page_shift) + i];
        page_off[i] = (page << page_shift) * key_stride + (int64_t)hk * D;
    }
    if (n_tile > 0) {
        // Query vector v = (row r0 + v / G, head hk * G + v % G): G * D contiguous floats per row.
        const float *q0 = p.q + ((int64_t)r0 * p.n_heads_q + (int64_t)hk * G) * D;
        for (int i = threadIdx.x; i < kTileQV * S::kCols; i += kTileThreads) {
            const int v = i / S::kCols, c = i % S::kCols;
            const int64_t src = (int64_t)(v / G) * p.n_heads_q * D + (int64_t)(v % G) * D;
            reinterpret_cast<float4 *>(q_s + v * S::kRowStride)[c] =
                v < nq ? reinterpret_cast<const float4 *>(q0 + src)[c] : zero4();
        }
    }

    // Scores. Thread t = 32 b + 8 y + x (b < 8, y < 4, x < 8): key group kg = 8 (b % 4) + x owns
    // keys kg + 32 s, query group qg = 4 (b / 4) + y owns query vectors qg + 8 i. Eight threads
    // in a row read eight consecutive K rows and four query rows (no bank conflicts).
    const int tid = threadIdx.x, tb = tid / kScoreBlock, ty = (tid / 8) % 4, tx = tid % 8;
    const int kg = 8 * (tb & 3) + tx, qg = 4 * (tb >> 2) + ty;
    for (int sub0 = 0; sub0 < n_tile; sub0 += S::kSubKeys) {
        const int n_sub = min(S::kSubKeys, n_tile - sub0);
        __syncthreads();  // page_off / q_s written; the previous sub-tile's readers are done
        load_sub_tile<D>(p.k_pages, page_off, sub0, n_sub, page_shift, key_stride, kv_s);
        __syncthreads();
        float part_dot[kLanesPerKey][kScoreQV][S::kScoreKeys];
#pragma unroll
        for (int li = 0; li < kLanesPerKey; ++li)
#pragma unroll
            for (int i = 0; i < kScoreQV; ++i)
#pragma unroll
                for (int t = 0; t < S::kScoreKeys; ++t) part_dot[li][i][t] = 0.0f;
#pragma unroll
        for (int c = 0; c < C4; ++c) {
#pragma unroll
            for (int li = 0; li < kLanesPerKey; ++li) {
                const int col = c * kLanesPerKey + li;
                float4 a[kScoreQV], b[S::kScoreKeys];
#pragma unroll
                for (int i = 0; i < kScoreQV; ++i)
                    a[i] = reinterpret_cast<const float4 *>(q_s + (qg + 8 * i) * S::kRowStride)[col];
#pragma unroll
                for (int t = 0; t < S::kScoreKeys; ++t)
                    b[t] = reinterpret_cast<const float4 *>(kv_s + (kg + 32 * t) * S::kRowStride)[col];
#pragma unroll
                for (int i = 0; i < kScoreQV; ++i)
#pragma unroll
                    for (int t = 0; t < S::kScoreKeys; ++t) {
                        float d = part_dot[li][i][t];
                        d = fmaf(a[i].x, b[t].x, d);
                        d = fmaf(a[i].y, b[t].y, d);
                        d = fmaf(a[i].z, b[t].z, d);
                        d = fmaf(a[i].w, b[t].w, d);
                        part_dot[li][i][t] = d;
                    }
            }
        }
#pragma unroll
        for (int i = 0; i < kScoreQV; ++i)
#pragma unroll
            for (int t = 0; t < S::kScoreKeys; ++t) {
                const int j = kg + 32 * t;
                const float (*pd)[kScoreQV][S::kScoreKeys] = part_dot;
                // The partition kernel's xor tree over its 8 lanes (masks 4, 2, 1), as lane 0 sees it.
                const float lo = (pd[0][i][t] + pd[4][i][t]) + (pd[2][i][t] + pd[6][i][t]);
                const float hi = (pd[1][i][t] + pd[5][i][t]) + (pd[3][i][t] + pd[7][i][t]);
                if (j < n_sub) s_s[(qg + 8 * i) * kSStride + sub0 + j] = __fmul_rn(lo + hi, p.scale);
            }
    }
    __syncthreads();

    // Softmax statistics, one warp per query vector (the partition kernel's loop).
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t head_row = (int64_t)r0 * p.n_heads_q + (int64_t)hk * G;  // + (v / G) * Hq + v % G
    float *part_o = p.workspace;
    float *part_ml = p.workspace + (int64_t)p.n_rows * p.n_heads_q * n_parts * D;
    for (int v = threadIdx.x / WARP_SIZE; v < nq; v += kTileThreads / WARP_SIZE) {
        const int32_t n_local = row_n[v / G];
        if (n_local <= 0) continue;
        const int64_t head = head_row + (int64_t)(v / G) * p.n_heads_q + v % G;
        float *ml = part_ml + (head * n_parts + part) * 2;
        if (row_state[v / G]) {
            if (lane == 0) ml[0] = ml[1] = __int_as_float(0x7fc00000);
            continue;
        }
        const float2 st = partition_softmax(s_s + v * kSStride, n_local, lane);
        if (lane == 0) { ml[0] = st.x; ml[1] = st.y; }
    }

    // Values: thread (group vg, float4 column col) owns query vectors vg + kValueGroups * i
    // and, per vector, the KL chains of its column.
    constexpr int KL = S::kKeyLanes, QV = S::kValueQV;
    const int col = threadIdx.x % S::kCols, vg = threadIdx.x / S::kCols;
    int32_t n_v[QV];
#pragma unroll
    for (int i = 0; i < QV; ++i) {
        const int v = vg + S::kValueGroups * i;
        n_v[i] = v < nq && !row_state[v / G] ? row_n[v / G] : 0;
    }
    float4 acc[QV][KL];
#pragma unroll
    for (int i = 0; i < QV; ++i)
#pragma unroll
        for (int u = 0; u < KL; ++u) acc[i][u] = zero4();
    for (int sub0 = 0; sub0 < n_tile; sub0 += S::kSubKeys) {
        const int n_sub = min(S::kSubKeys, n_tile - sub0);
        __syncthreads();  // exp(s - m) written; the previous sub-tile's readers are done
        load_sub_tile<D>(p.v_pages, page_off, sub0, n_sub, page_shift, key_stride, kv_s);
        __syncthreads();
        if (n_sub == S::kSubKeys && sub0 + n_sub <= n_min)  // every live row attends all these keys
            value_keys<D, false>(kv_s, s_s, vg, col, sub0, n_sub, n_v, acc);
        else
            value_keys<D, true>(kv_s, s_s, vg, col, sub0, n_sub, n_v, acc);
    }
#pragma unroll
    for (int i = 0; i < QV; ++i) {
        const int v = vg + S::kValueGroups * i;
        if (n_v[i] <= 0) continue;
        float4 o = acc[i][0];
#pragma unroll
        for (int u = 1; u < KL; ++u) {
            o.x += acc[i][u].x;
            o.y += acc[i][u].y;
            o.z += acc[i][u].z;
            o.w += acc[i][u].w;
        }
        const int64_t head = head_row + (int64_t)(v / G) * p.n_heads_q + v % G;
        reinterpret_cast<float4 *>(part_o + (head * n_parts + part) * D)[col] = o;
    }
    __syncthreads();  // the next piece reuses row_n, page_off and the tiles
}

template <int D>
__global__ void __launch_bounds__(kTileThreads, 2)  // two resident blocks: one loads while one computes
attention_tiled_kernel(luce_attention_params p, int32_t n_parts, int32_t page_shift) {
    extern __shared__ float4 smem4[];
    __shared__ int64_t page_off[kPartition];
    __shared__ int32_t row_n[kTileQV], row_state[kTileQV];
    const int G = p.n_heads_q / p.n_heads_kv;
    const int32_t rows_per_tile = kTileQV / G;
    const int32_t t0 = blockIdx.x * rows_per_tile;
    const int32_t t1 = min(t0 + rows_per_tile, p.prompt_rows);
    for (int32_t r0 = t0; r0 < t1;) {  // one piece per segment the tile touches
        const int32_t seg = attention_segment_of(p, r0);
        const int32_t r1 = min(t1, p.qo_indptr[seg + 1]);
        tile_piece<D>(p, r0, r1, blockIdx.y, blockIdx.z, n_parts, page_shift,
                      reinterpret_cast<float *>(smem4), page_off, row_n, row_state);
        r0 = r1;
    }
}

template <int D>
int launch_tiled(const luce_attention_params &p, int32_t n_parts, int32_t page_shift, cudaStream_t stream) {
    constexpr size_t smem = TileShape<D>::kSmemBytes;
    static int ready = 0;  // 1: the shared-memory limit is raised; -1: the device cannot hold a tile
    if (ready == 0) {  // once, before any graph capture reaches here
        int device = 0, optin = 0;
        cudaError_t err = cudaGetDevice(&device);
        if (err == cudaSuccess)
            err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        const size_t static_bytes = sizeof(int64_t) * kPartition + 2 * sizeof(int32_t) * kTileQV;
        if (err == cudaSuccess && (size_t)optin < smem + static_bytes)
            err = cudaErrorNotSupported;  // e.g. a 64 KiB LDS: every row takes the partition kernel
        if (err == cudaSuccess)
            err = cudaFuncSetAttribute(attention_tiled_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem);
        ready = err == cudaSuccess ? 1 : -1;
        if (err != cudaSuccess) (void)cudaGetLastError();
    }
    if (ready < 0) return (int)cudaErrorNotSupported;
    const int G = p.n_heads_q / p.n_heads_kv;
    const int32_t rows_per_tile = kTileQV / G;
    const unsigned tiles = (unsigned)((p.prompt_rows + rows_per_tile - 1) / rows_per_tile);
    attention_tiled_kernel<D><<<dim3(tiles, (unsigned)p.n_heads_kv, (unsigned)n_parts), kTileThreads, smem,
                                stream>>>(p, n_parts, page_shift);
    return luce_status(cudaGetLastError());
}

}  // namespace

int launch_tiled_attention(const luce_attention_params &p, int32_t n_parts, int32_t page_shift,
                           cudaStream_t stream) {
    switch (p.head_dim) {
        case 64: return launch_tiled<64>(p, n_parts, page_shift, stream);
        case 128: return launch_tiled<128>(p, n_parts, page_shift, stream);
        case 256: return launch_tiled<256>(p, n_parts, page_shift, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}

}  // namespace luce_attn
