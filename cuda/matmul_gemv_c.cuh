// How the one-row matmul (cuda/matmul_gemv.cuh) turns a lane's 32-value group of a weight row
// times x into its share of the row's chunk values, in two forms chosen by the reader's
// kGroupScale (matmul_gemv_types.cuh); both replay the tile kernel's float steps
// (matmul_chunk.cuh) in its order, so a row's bits are the tile kernel's (DESIGN 5 rule 6).
// - ChunkIntC (Q4_K, Q5_K, Q6_K, IQ4_XS): the exact chunk integers SH, SL, MS are summed over
//   the chunk's 8 lanes (rows8_sum), one lane of a row forms c = d * fma(SH, 256, SL)
//   (+ negmin * MS), one float per (row, chunk); the chain then takes
//   acc = fma(xscale, c, acc) per chunk.
// - GroupFloatC (Q8_0, Q5_0): each lane stores its group's exact integer sum as an f32 (RN, as
//   group_sum) and the group's f32 scale: (sum, scale) per (row, group); the chain then takes per
//   chunk cacc = fma(scale_j, sum_j, cacc) over its groups j in order (those of a last partial
//   chunk only), acc = fma(offset_j, S_j, acc) for each j in the same order where the type has an
//   offset (S_j: f32 sum of x's group j as the tile kernel adds it), then acc = fma(xscale, cacc, acc).
// Chains: acc of k part kp runs over chunks kp, kp + 4, ... in increasing order.
#pragma once

#include <type_traits>

#include "matmul_gemv_iq4.cuh"
#include "matmul_gemv_types.cuh"
#include "matmul_x.cuh"

namespace mm {

template <bool kPlanes>
__device__ __forceinline__ void load_group_x(const XLayout &x, int64_t ch, int j, GroupX &gx) {
    const int64_t g = ch * kGroups + j;
#pragma unroll
    for (int q = 0; q < 4; ++q) gx.v[q] = __ldg(x.xq + g * 4 + q);
    gx.s = 0;
    if (kPlanes) {  // byte planes of the chunk's 8 group sums (matmul_x.cuh)
        const uint32_t *pl = reinterpret_cast<const uint32_t *>(x.xqp + ch * x.tp * 2) + (j >> 2);
        const uint32_t p0 = byte_of(__ldg(pl), j & 3), p1 = byte_of(__ldg(pl + 2), j & 3);
        const int p2 = (int)(int8_t)byte_of(__ldg(pl + 4), j & 3);
        gx.s = p2 * 65536 + (int)(p1 * 256 + p0);
    }
}

// x of the lane's group j of chunk ch: the reader's own layout where it has one.
template <class G>
__device__ __forceinline__ void gemv_load_x(const XLayout &x, int64_t ch, int j, GroupX &gx) {
    if constexpr (G::kOwnLayout)
        G::load_x(x, ch, j, gx);
    else
        load_group_x<G::kOffset && !G::kGroupScale>(x, ch, j, gx);
}

// The three exact sums of one row's group j against x (the reader's own where kOwnLayout).
template <class G>
__device__ __forceinline__ void group_sums(const typename G::Raw &raw, int j, const GroupX &gx, int &sh, int &sl,
                                           int &ms) {
    if constexpr (G::kOwnLayout) {
        G::sums(raw, j, gx, sh, sl, ms);
    } else {
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
}

// Sums of R rows over the 8 lanes of an aligned group, transposed: v[0] of lane j ends as the
// total of row j * R / 8 (lanes j, j + 1, ... j + 8 / R - 1 hold the same row). Integer adds:
// exact in any order.
template <int R>
__device__ __forceinline__ int rows8_sum(int (&v)[R]) {
#pragma unroll
    for (int t = 0; t < 3; ++t) {
        const int m = 4 >> t, held = R >> t;  // rows held before this step (0: one row, summed)
        const bool upper = (threadIdx.x & m) != 0;
        if (held > 1) {
#pragma unroll
            for (int i = 0; i < R / 2; ++i) {
                if (i < held / 2) {
                    const int send = upper ? v[i] : v[i + held / 2];
                    const int keep = upper ? v[i + held / 2] : v[i];
                    v[i] = keep + warp_shfl_xor(send, m);
                }
            }
        } else {
            v[0] += warp_shfl_xor(v[0], m);
        }
    }
    return v[0];
}

// A row's c of one chunk from its exact integer sums (ChunkIntC and the staged form,
// matmul_gemv_staged.cuh): d * fma(SH, 256, SL), plus negmin * MS for the types with mins.
template <bool kOffset>
__device__ __forceinline__ float chunk_c(float d, float negmin, int SH, int SL, int MS) {
    const float v = __fmul_rn(d, fmaf((float)SH, 256.0f, (float)SL));
    return kOffset ? fmaf(negmin, (float)MS, v) : v;
}

// The c of a batch of R rows, integer-scale form: slot [R][chunks] floats.
template <class G, int CPL, int R>
struct ChunkIntC {
    static constexpr int kFloatsPerChunk = 1;
    static constexpr int kRing = 16;  // batches of c in flight per block (R * chunks floats each)
    int sh[CPL][R], sl[CPL][R], ms[CPL][R];
    float d[CPL], negmin[CPL];  // of the row this lane writes (lane j: row j * R / 8)

    // From the batch's weights (before the next batch's loads reuse the registers); jg: the
    // lane's group, j: lane % 8.
    __device__ __forceinline__ void take(const typename G::Raw (&raw)[CPL][R], const int (&jg)[CPL],
                                         const GroupX (&gx)[CPL], int j) {
#pragma unroll
        for (int s = 0; s < CPL; ++s) {
            d[s] = negmin[s] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                group_sums<G>(raw[s][r], jg[s], gx[s], sh[s][r], sl[s][r], ms[s][r]);
                if (r == j * R / 8) {
                    d[s] = G::d(raw[s][r]);
                    negmin[s] = G::negmin(raw[s][r]);
                }
            }
        }
    }

    // c of chunk ch[s] of row j * R / 8 by lane j (and the lanes holding the same row stay idle).
    __device__ __forceinline__ void put(float *c, const int (&ch)[CPL], const bool (&live)[CPL], int j, int chunks) {
        const int myrow = j * R / 8;
        const bool writer = (j % (8 / R)) == 0;
#pragma unroll
        for (int s = 0; s < CPL; ++s) {
            const int SH = rows8_sum<R>(sh[s]), SL = rows8_sum<R>(sl[s]);
            const int MS = G::kOffset ? rows8_sum<R>(ms[s]) : 0;
            if (writer && live[s]) c[myrow * chunks + ch[s]] = chunk_c<G::kOffset>(d[s], negmin[s], SH, SL, MS);
        }
    }

    // Chain kp of a row: c_row [chunks], xd [chunks] the x scales.
    static __device__ __forceinline__ float chain(const float *c_row, const float *xd, const float *, int kp,
                                                  int chunks, int) {
        float acc = 0.0f;
        for (int c = kp; c < chunks; c += 4) acc = fmaf(xd[c], c_row[c], acc);
        return acc;
    }
};

// The (sum, scale) pairs of a batch of R rows, per-group f32 scale form: slot [R][chunks][8]
// float2.
template <class G, int CPL, int R>
struct GroupFloatC {
    static constexpr int kFloatsPerChunk = 2 * kGroups;
    static constexpr int kRing = 4;  // 256 B a chunk and row: shared memory bounds the ring
    float sum[CPL][R], scale[CPL][R];

    __device__ __forceinline__ void take(const typename G::Raw (&raw)[CPL][R], const int (&jg)[CPL],
                                         const GroupX (&gx)[CPL], int) {
#pragma unroll
        for (int s = 0; s < CPL; ++s)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                int sh, sl, ms;  // scales 1: the group's plain sums of the high and low x bytes
                group_sums<G>(raw[s][r], jg[s], gx[s], sh, sl, ms);
                sum[s][r] = (float)(sh * 256 + sl);
                scale[s][r] = G::scale(raw[s][r]);
            }
    }

    __device__ __forceinline__ void put(float *c, const int (&ch)[CPL], const bool (&live)[CPL], int j, int chunks) {
        float2 *c2 = reinterpret_cast<float2 *>(c);
#pragma unroll
        for (int s = 0; s < CPL; ++s)
            if (live[s])
#pragma unroll
                for (int r = 0; r < R; ++r)
                    c2[((int64_t)r * chunks + ch[s]) * kGroups + j] = make_float2(sum[s][r], scale[s][r]);
    }

    // Chain kp of a row: c_row [chunks][8] float2, xd [chunks], xs [groups] (offset types). With two
    // chunk slots a lane (k > 16,384: the 27B down projections) four chunks' combines (cacc, which do not
    // depend on acc) run side by side before each meets acc in chunk order: the same operations in the
    // same order, a chain of ~17 + 5 x 8 dependent fmas at k = 17,408 instead of 17 x 9. H100, docs/PERF.md
    // session 46: Q8_0 86.3 -> 40.0 us, Q5_0 65.6 -> 44.1. With one slot only where G::kWideChain (Q8_0:
    // 0.87-0.91x at the 27B's gate, q|k|v and out, the 27B Q8_0 step 79.1 -> 84.4 tok/s, the Coder-0.5B's
    // unchanged; session 47). Q5_0 keeps the plain chain with one slot: its out shape lost 8-13% and the
    // Coder-0.5B's step 2.6% with the wide form (registers 64 -> 98).
    static __device__ __forceinline__ float chain(const float *c_row, const float *xd, const float *xs, int kp,
                                                  int chunks, int groups) {
        const float2 *c2 = reinterpret_cast<const float2 *>(c_row);
        float acc = 0.0f;
        if constexpr (CPL >= 2 || G::kWideChain) {
            int c = kp;
            for (; c + 12 < chunks - 1; c += 16) {  // four whole chunks (only the last chunk can be partial)
                float cacc[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) cacc[u] = combine<false>(c2, xs, c + 4 * u, kGroups, acc);
#pragma unroll
                for (int u = 0; u < 4; ++u) acc = meet(c2, xd, xs, c + 4 * u, kGroups, cacc[u], acc);
            }
            for (; c < chunks; c += 4) {
                const int ng = groups_in_chunk(groups, c);
                const float cacc = combine<false>(c2, xs, c, ng, acc);
                acc = meet(c2, xd, xs, c, ng, cacc, acc);
            }
        } else {  // each group's offset term meets acc beside its combine, as the chain ran before
            for (int c = kp; c < chunks; c += 4) {
                const float cacc = combine<true>(c2, xs, c, groups_in_chunk(groups, c), acc);  // advances acc first
                acc = fmaf(xd[c], cacc, acc);
            }
        }
        return acc;
    }

    // Chunk c's combine over its ng groups in order: cacc = fma(scale_j, sum_j, cacc); kOffsets (offset
    // types) also adds each group's offset term to acc as it goes (the one-slot chain: one loop).
    template <bool kOffsets>
    static __device__ __forceinline__ float combine(const float2 *c2, const float *xs, int c, int ng, float &acc) {
        float cacc = 0.0f;
#pragma unroll
        for (int jj = 0; jj < kGroups; ++jj) {
            if (jj >= ng) break;
            const float2 p = c2[c * kGroups + jj];
            cacc = fmaf(p.y, p.x, cacc);
            if (kOffsets && G::kOffset) acc = fmaf(G::offset(p.y), xs[c * kGroups + jj], acc);
        }
        return cacc;
    }

    // acc after chunk c: its groups' offset terms in order (offset types), then xd_c * cacc.
    static __device__ __forceinline__ float meet(const float2 *c2, const float *xd, const float *xs, int c, int ng,
                                                 float cacc, float acc) {
        if (G::kOffset)
#pragma unroll
            for (int jj = 0; jj < kGroups; ++jj) {
                if (jj >= ng) break;
                acc = fmaf(G::offset(c2[c * kGroups + jj].y), xs[c * kGroups + jj], acc);
            }
        return fmaf(xd[c], cacc, acc);
    }
};

template <class G, int CPL, int R>
using GemvC = typename std::conditional<G::kGroupScale, GroupFloatC<G, CPL, R>, ChunkIntC<G, CPL, R>>::type;

}  // namespace mm
