// One-row matmul for the integer-scale block types (Q4_K, Q5_K, Q6_K, IQ4_XS), bitwise the
// tensor-core kernel's row (cuda/matmul.cu), for decode steps of one row: y [n] = x @ W^T.
//
// Why a second kernel: one row fills one of the eight token columns of an mma tile, and the
// tile kernel's 16-row warps with 128 registers leave few warps per SM to cover memory
// latency (docs/PERF.md: 28-64% of copy bandwidth at one row). Here a lane takes one 32-value
// group of a 256-value chunk of two rows and multiplies it with 4-way byte dot products
// (dp4a) of the same exact integers; nothing is staged, few registers are live.
//
// Same bits (DESIGN 5 rule 6): per (row, chunk) the integers
//   SH = sum_j scale_j * sum(q * xhi_j), SL = sum_j scale_j * sum(q * xlo_j), MS = sum_j min_j * s_j
// are exact whatever lanes add them, and the float steps are the tile kernel's:
//   c_ch = d * fma(SH, 256, SL) (+ negmin * MS); acc[ch % 4] = fma(xscale_ch, c_ch, acc[ch % 4])
//   in increasing ch; y = ((acc0 + acc1) + acc2) + acc3 (+ bias).
// Lanes compute c_ch in any order into shared memory; one thread per row then runs the
// ordered chain. Layout: a block of kThreads lanes = 16 groups of 8 lanes takes RB rows
// (RB / KR sets of KR rows x chunks items, item = (set, chunk), consecutive chunks on
// neighbouring groups); a group's lanes j = 0..7 take the chunk's groups, reduce the three sums
// over the 8 lanes, and lane 0 writes c for each row of the set. Each group loads its next
// item's weights before it multiplies the current one.
#pragma once

#include "matmul_gemv_types.cuh"
#include "matmul_x.cuh"
#include "pdl.cuh"

namespace mm {

constexpr int kGemvThreads = 128;
constexpr int kGemvGroups = kGemvThreads / 8;  // 8-lane groups per block

// c + sum of the 4 products of signed bytes of a with signed (kUnsignedB false) or unsigned
// bytes of b.
template <bool kUnsignedB>
__device__ __forceinline__ int dp4(uint32_t a, uint32_t b, int c) {
#ifdef __HIPCC__
    for (int i = 0; i < 4; ++i) {
        const int bv = kUnsignedB ? (int)((b >> (8 * i)) & 0xFF) : (int)(int8_t)(b >> (8 * i));
        c += (int)(int8_t)(a >> (8 * i)) * bv;
    }
    return c;
#else
    int d;
    if (kUnsignedB)
        asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else
        asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

struct GemvArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XLayout x;  // token 0 of it
    int64_t n, row_bytes;
};

// x operands of group g of token 0: the 4 quads' words and (kOffset) the group's integer sum.
struct GroupX {
    uint4 v[4];
    int s;
};

template <bool kOffset>
__device__ __forceinline__ void load_group_x(const XLayout &x, int64_t ch, int j, GroupX &gx) {
    const int64_t g = ch * kGroups + j;
#pragma unroll
    for (int q = 0; q < 4; ++q) gx.v[q] = __ldg(x.xq + g * 4 + q);
    gx.s = 0;
    if (kOffset) {  // byte planes of the chunk's 8 group sums (matmul_x.cuh)
        const uint32_t *pl = reinterpret_cast<const uint32_t *>(x.xqp + ch * x.tp * 2) + (j >> 2);
        const uint32_t p0 = byte_of(__ldg(pl), j & 3), p1 = byte_of(__ldg(pl + 2), j & 3);
        const int p2 = (int)(int8_t)byte_of(__ldg(pl + 4), j & 3);
        gx.s = p2 * 65536 + (int)(p1 * 256 + p0);
    }
}

// The three exact sums of one row's group j against x.
template <class G>
__device__ __forceinline__ void group_sums(const typename G::Raw &raw, int j, const GroupX &gx, int &sh, int &sl,
                                           int &ms) {
    GroupWords w;
    G::words(raw, j, w);
    int ph0 = 0, ph1 = 0, pl0 = 0, pl1 = 0;  // values 0..15 / 16..31, high / low x bytes
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        ph0 = dp4<false>(w.lo[q], gx.v[q].x, ph0);
        ph1 = dp4<false>(w.hi[q], gx.v[q].y, ph1);
        pl0 = dp4<true>(w.lo[q], gx.v[q].z, pl0);
        pl1 = dp4<true>(w.hi[q], gx.v[q].w, pl1);
    }
    int s[2], m;
    G::scales(raw, j, s, m);
    sh = s[0] * ph0 + s[1] * ph1;
    sl = s[0] * pl0 + s[1] * pl1;
    ms = m * gx.s;
}

__device__ __forceinline__ int group8_sum(int v) {  // over the 8 lanes of an aligned group
    v += warp_shfl_xor(v, 1);
    v += warp_shfl_xor(v, 2);
    v += warp_shfl_xor(v, 4);
    return v;
}

// RB rows per block in sets of KR rows (RB / KR sets); dynamic shared memory: c [RB][chunks]
// floats. KR rows share each x load: more rows per set, less x traffic per weight byte.
template <class G, int RB, int KR>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvArgs a) {
    extern __shared__ float c_s[];
    const int lane = threadIdx.x % 8, grp = threadIdx.x / 8;
    const int chunks = (int)a.x.chunks, items = (RB / KR) * chunks;
    const int64_t row0 = (int64_t)blockIdx.x * RB;
    auto row_ptr = [&](int64_t r) { return a.w + (r < a.n ? r : a.n - 1) * a.row_bytes; };
    typename G::Raw cur[KR], nxt[KR];
    auto load = [&](int it, typename G::Raw (&raw)[KR]) {
        it = it < items ? it : items - 1;  // a group past the last item loads the last one again
        const int set = it / chunks, ch = it % chunks;
#pragma unroll
        for (int r = 0; r < KR; ++r) G::load(raw[r], row_ptr(row0 + KR * set + r) + (int64_t)ch * G::Tensor::kChunkBytes, a.w_end, lane);
    };
    auto item_chunk = [&](int it) { return (it < items ? it : items - 1) % chunks; };
    load(grp, cur);
    wait_for_prior_kernels();  // x is written by the kernel ahead
    GroupX gx, gx_next;
    load_group_x<G::kOffset>(a.x, item_chunk(grp), lane, gx);
    // Rounds are block-uniform (the shuffles need whole warps); a group past the items idles.
    // The next round's weights and x are loaded before this round multiplies.
    for (int base = 0; base < items; base += kGemvGroups) {
        const int it = base + grp;
        if (base + kGemvGroups < items) {
            load(it + kGemvGroups, nxt);
            load_group_x<G::kOffset>(a.x, item_chunk(it + kGemvGroups), lane, gx_next);
        }
        const int at = it < items ? it : items - 1, set = at / chunks, ch = at % chunks;
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            int sh, sl, ms;
            group_sums<G>(cur[r], lane, gx, sh, sl, ms);
            sh = group8_sum(sh);
            sl = group8_sum(sl);
            if (G::kOffset) ms = group8_sum(ms);
            if (lane == 0 && it < items) {
                float c = __fmul_rn(G::d(cur[r]), fmaf((float)sh, 256.0f, (float)sl));
                if (G::kOffset) c = fmaf(G::negmin(cur[r]), (float)ms, c);
                c_s[(KR * set + r) * chunks + ch] = c;
            }
        }
#pragma unroll
        for (int r = 0; r < KR; ++r) cur[r] = nxt[r];
        gx = gx_next;
    }
    __syncthreads();
    // The ordered chain: thread 4 r + kp runs acc[kp] of row r over chunks kp, kp + 4, ...;
    // thread r then adds row r's four in order.
    __shared__ float acc_s[4 * RB];
    const int r = threadIdx.x / 4, kp = threadIdx.x % 4;
    if (r < RB) {
        const float *c_row = c_s + r * chunks;
        float acc = 0.0f;
#pragma unroll 4
        for (int ch = kp; ch < chunks; ch += 4) acc = fmaf(__ldg(a.x.xd + (int64_t)ch * a.x.tp), c_row[ch], acc);
        acc_s[threadIdx.x] = acc;
    }
    __syncthreads();
    const int64_t row = row0 + threadIdx.x;
    if (threadIdx.x >= RB || row >= a.n) return;
    float v = acc_s[4 * threadIdx.x];
#pragma unroll
    for (int s = 1; s < 4; ++s) v = v + acc_s[4 * threadIdx.x + s];
    if (a.bias) v = v + a.bias[row];
    a.y[row] = v;
}

template <class G, int RB, int KR>
int launch_gemv_rb(const GemvArgs &a, cudaStream_t stream) {
    const size_t smem = (size_t)RB * a.x.chunks * sizeof(float);
    const unsigned blocks = (unsigned)((a.n + RB - 1) / RB);
    return luce_status(launch_overlapped(gemv_kernel<G, RB, KR>, dim3(blocks), dim3(kGemvThreads), smem, stream, true, a));
}

// Rows per block: enough items to keep the 16 groups busy for about four rounds, as long as
// the grid keeps about 4 blocks per SM (`sms` 0: unknown). At least one set of `kr` rows.
inline int gemv_rows_per_block(int64_t n, int64_t chunks, int sms, int kr) {
    int rb = kr;
    while (rb < 16 && (rb / kr) * chunks < 4 * kGemvGroups) rb *= 2;
    while (rb > kr && sms > 0 && (n + rb - 1) / rb < 4 * sms) rb /= 2;
    return rb;
}

// kr: rows per set (2, or 4 where tune 6 asks: an experiment in x reuse, the same bits).
template <class G>
int launch_gemv(const GemvArgs &a, int sms, int kr, cudaStream_t stream) {
    if (kr == 4) {
        switch (gemv_rows_per_block(a.n, a.x.chunks, sms, 4)) {
            case 4: return launch_gemv_rb<G, 4, 4>(a, stream);
            case 8: return launch_gemv_rb<G, 8, 4>(a, stream);
            default: return launch_gemv_rb<G, 16, 4>(a, stream);
        }
    }
    switch (gemv_rows_per_block(a.n, a.x.chunks, sms, 2)) {
        case 2: return launch_gemv_rb<G, 2, 2>(a, stream);
        case 4: return launch_gemv_rb<G, 4, 2>(a, stream);
        case 8: return launch_gemv_rb<G, 8, 2>(a, stream);
        default: return launch_gemv_rb<G, 16, 2>(a, stream);
    }
}

}  // namespace mm
