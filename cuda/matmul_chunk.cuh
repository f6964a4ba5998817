// One 256-value chunk of a warp's 16 weight rows times its tokens (cuda/matmul.cu), two ways:
// - integer-scale types (Q4_K, Q5_K, Q6_K, IQ4_XS): per (row, token) the chunk's exact integers
//     SH = sum_j scale_j * sum(q * xhi_j),  SL = sum_j scale_j * sum(q * xlo_j),
//     MS = sum_j min_j * sum(xq_j)   (x = 256 * xhi + xlo, 16-bit; MS by byte planes)
//   then in f32: c = d * fma(SH, 256, SL) (+ negmin * MS); acc = fma(xscale, c, acc).
// - per-group f16 scales (Q8_0, Q5_0): per group cacc += scale_j * float(group sum),
//   acc += offset_j * sum(x); then acc = fma(xscale, cacc, acc).
// Both orders depend on k only. Every sum stays below 2^31 (|q| <= 127 or 63, scales <= 128).
#pragma once

#include "matmul_x.cuh"

namespace mm {

// One call of the tile kernels (cuda/matmul.cu mmq_kernel, matmul_rows.cuh mmq_rows_kernel).
struct MmqArgs {
    const uint8_t *w, *w_end;
    const float *bias;
    float *y;
    XLayout x;
    int64_t rows, n, row_bytes;
};

// One 8-token tile of a warp: where its B fragments are and which of its tokens are real.
// The pointers are those of the chunk being multiplied (XTile::advance moves them on).
struct XTile {
    const uint4 *xb;   // xq of token tb + grp, quad's word, group 0 of the chunk
    const float *xd;   // scale of token tb + 2 * quad in the chunk
    const uint4 *xqp;  // byte planes of token tb + 2 * quad in the chunk
    const float4 *xs;  // float sums of tokens tb + 2 * quad, +1, group 0 of the chunk
    bool b_live;       // token tb + grp is real (reads its activations)
    bool s_live;       // token tb + 2 * quad is real (reads scales and sums of tb + 2quad, +1)

    __device__ __forceinline__ void advance(const XLayout &x, int chunks) {
        xb += chunks * (kGroups * 4);
        xd += chunks * x.tp;
        xqp += chunks * x.tp * 2;
        xs += chunks * kGroups * (x.tp / 2);
    }

    // B fragments of group j of the chunk.
    __device__ __forceinline__ uint4 b(int j) const { return b_live ? __ldg(xb + 4 * j) : make_uint4(0, 0, 0, 0); }
};

// The same with the B fragments in shared memory (the wide-token tile kernel, matmul_rows.cuh):
// sb = the chunk's staged xq of token tb + grp, quad's word of group 0 (padding tokens staged as
// zeros); scales and sums from the XTile's pointers.
struct StagedXTile : XTile {
    const uint4 *sb;

    __device__ __forceinline__ uint4 b(int j) const { return sb[4 * j]; }
};

// Sum over the chunk's groups j of m_j * s_j: m = the 8 unsigned byte mins, pa / pb = the
// token's byte planes of the s_j (matmul_x.cuh).
__device__ __forceinline__ int min_sum(const uint32_t m[2], const uint4 &pa, const uint2 &pb) {
    const int t2 = dot4_s(m[1], pb.y, dot4_s(m[0], pb.x, 0));
    const int t1 = dot4_u(m[1], pa.w, dot4_u(m[0], pa.z, 0));
    const int t0 = dot4_u(m[1], pa.y, dot4_u(m[0], pa.x, 0));
    return t2 * 65536 + t1 * 256 + t0;
}

__device__ __forceinline__ float2 load_xscale(const XTile &t) {
    return t.s_live ? __ldg(reinterpret_cast<const float2 *>(t.xd)) : make_float2(0.0f, 0.0f);
}

// kEven: only token 2 * quad of each lane pair is live (one-row launches): the odd token's
// elements are not computed. Live elements get the same bits either way.
// MT m-tiles (readers rd[0..MT-1], 16 rows each) share each B fragment (XT: XTile or
// StagedXTile) and each m-tile's decoded A fragment serves the NT token tiles; each element's
// integers and float steps are those of MT = 1.
template <class Q, int NT, bool kEven, int MT = 1, class XT = XTile>
__device__ __forceinline__ void mmq_chunk_int(const Q *rd, const XT (&xt)[NT], int quad, float (*acc)[NT][4]) {
    int sh[MT][NT][4] = {}, sl[MT][NT][4] = {};
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) rd[m].weights(j, quad, a[m]);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const uint4 b = xt[n].b(j);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                int hi[4], lo[4];
                if (!Q::kHalves) {
                    mma_k32<false>(a[m], b.x, b.y, 0, hi);
                    mma_k32<true>(a[m], b.z, b.w, 0, lo);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (kEven && (e & 1)) continue;
                        const int s = rd[m].scale(j, 0, e >> 1);
                        sh[m][n][e] += s * hi[e];
                        sl[m][n][e] += s * lo[e];
                    }
                } else {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        mma_k16<false>(a[m][2 * h], a[m][2 * h + 1], h ? b.y : b.x, 0, hi);
                        mma_k16<true>(a[m][2 * h], a[m][2 * h + 1], h ? b.w : b.z, 0, lo);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            if (kEven && (e & 1)) continue;
                            const int s = rd[m].scale(j, h, e >> 1);
                            sh[m][n][e] += s * hi[e];
                            sl[m][n][e] += s * lo[e];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const float2 xs = load_xscale(xt[n]);
        uint4 pa[2] = {};
        uint2 pb[2] = {};
        if (Q::kOffset && xt[n].s_live) {
            const uint4 *p = xt[n].xqp;
#pragma unroll
            for (int u = 0; u < (kEven ? 1 : 2); ++u) {
                pa[u] = __ldg(p + 2 * u);
                pb[u] = __ldg(reinterpret_cast<const uint2 *>(p + 2 * u + 1));
            }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (kEven && (e & 1)) continue;
                const int r = e >> 1;
                float c = __fmul_rn(rd[m].d[r], fmaf((float)sh[m][n][e], 256.0f, (float)sl[m][n][e]));
                if constexpr (Q::kOffset)
                    c = fmaf(rd[m].negmin[r], (float)min_sum(rd[m].mn[r], pa[e & 1], pb[e & 1]), c);
                acc[m][n][e] = fmaf((e & 1) ? xs.y : xs.x, c, acc[m][n][e]);
            }
    }
}

template <class Q>
__device__ __forceinline__ int chunk_groups(const XLayout &x, int64_t ch) {
    return Q::kGroupBytes ? (int)groups_in_chunk<int64_t>(x.groups, ch) : kGroups;
}

// Per-group f16 scales; padding tokens read no activations. MT m-tiles as mmq_chunk_int.
template <class Q, int NT, bool kMagic, int MT = 1, class XT = XTile>
__device__ __forceinline__ void mmq_chunk_float(const Q *rd, const XLayout &x, int64_t ch, const XT (&xt)[NT],
                                                int quad, float (*acc)[NT][4]) {
    const int ng = chunk_groups<Q>(x, ch);
    const int seed = kMagic ? kMagicSeed : 0;
    float cacc[MT][NT][4] = {};
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
        if (j >= ng) break;
        GroupOperands op[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) rd[m].group(j, quad, op[m]);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const uint4 b = xt[n].b(j);
            float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (Q::kOffset && xt[n].s_live) s = __ldg(xt[n].xs + j * (x.tp / 2));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                int hi[4], lo[4];
                mma_k32<false>(op[m].a, b.x, b.y, seed, hi);
                mma_k32<true>(op[m].a, b.z, b.w, seed, lo);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    cacc[m][n][e] = fmaf(op[m].scale[0][e >> 1], group_sum<kMagic>(hi[e], lo[e]), cacc[m][n][e]);
                if (Q::kOffset) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float s32 = (e & 1) ? s.y + s.w : s.x + s.z;
                        acc[m][n][e] = fmaf(op[m].offset[0][e >> 1], s32, acc[m][n][e]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const float2 xs = load_xscale(xt[n]);
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = fmaf((e & 1) ? xs.y : xs.x, cacc[m][n][e], acc[m][n][e]);
    }
}

}  // namespace mm
