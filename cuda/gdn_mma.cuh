// TF32 tensor-core product for the GDN chunk kernel (cuda/gdn_chunked_tc.cuh): one warp computes
// D[16 x 8] += A[16 x 8] x B[8 x 8] with f32 accumulation (PTX mma.sync m16n8k8 .tf32).
//
// Lane = 4 * grp + quad (grp 0..7, quad 0..3). Fragments (the PTX layouts):
//   A (row-major 16 x 8):  a[0] (row grp, k quad), a[1] (row grp + 8, k quad),
//                          a[2] (row grp, k quad + 4), a[3] (row grp + 8, k quad + 4)
//   B (8 x 8):             b[0] (k quad, col grp), b[1] (k quad + 4, col grp)
//   D (16 x 8, f32):       d[0] (row grp, col 2 quad), d[1] (row grp, col 2 quad + 1),
//                          d[2] (row grp + 8, col 2 quad), d[3] (row grp + 8, col 2 quad + 1)
// Operands are rounded to tf32 (gdn_tf32: nearest, ties away, as cvt.rna), optionally split
// into two tf32 terms (3xTF32, see Frag). Products of two tf32 values are exact in f32; the
// device's accumulation order inside one mma is its own. Without the instruction (HIP, and the
// host emulator tests/kernels/emu, which does not define __CUDA_ARCH__) the same fragment
// semantics come from warp shuffles: each lane gathers its two A rows and two B columns and adds
// k = 0..7 in order with fmaf (32 shuffles per product; correct on any 32-lane warp).
#pragma once

#include "common.cuh"

static_assert(WARP_SIZE == 32, "the GDN tensor-core fragments are 32 lanes: a 64-lane wave needs its own "
                               "hip/gdn_chunked.hip (same ABI)");

#include "mma_tf32.cuh"

namespace gdnmma {

__device__ __forceinline__ float gdn_tf32(float x) { return tc::tf32_round(x); }

// A fragment (N = 4) or B fragment (N = 2) of one product. kSplit (3xTF32): x = hi + lo, both
// tf32, and d += A_lo B_hi + A_hi B_lo + A_hi B_hi: f32-class products (the dropped A_lo B_lo
// is 2^-22 relative). Otherwise hi = tf32(x) and d += A_hi B_hi. The shuffle fallback computes
// in f32: x itself when kSplit, tf32(x) otherwise.
template <int N, bool kSplit>
struct Frag {
    float hi[N], lo[N];
    __device__ __forceinline__ void set(int i, float x) {
#ifdef LUCE_MMA_TF32_NATIVE
        hi[i] = gdn_tf32(x);
        lo[i] = kSplit ? gdn_tf32(x - hi[i]) : 0.0f;
#else
        hi[i] = kSplit ? x : gdn_tf32(x);
        lo[i] = 0.0f;
#endif
    }
};

// d += A x B (every lane of the warp calls it together).
template <bool kSplit>
__device__ __forceinline__ void mma(float d[4], const Frag<4, kSplit> &a, const Frag<2, kSplit> &b) {
#ifdef LUCE_MMA_TF32_NATIVE
    if (kSplit) {
        tc::mma_tf32_16x8x8(d, a.lo, b.hi);
        tc::mma_tf32_16x8x8(d, a.hi, b.lo);
    }
#endif
    tc::mma_tf32_16x8x8(d, a.hi, b.hi);
}

// Fragment loads from f32 shared memory.
// A from row-major x[row][k] (stride floats per row): rows row0.., k k0..
template <bool kSplit>
__device__ __forceinline__ void load_a(Frag<4, kSplit> &a, const float *x, int stride, int row0, int k0) {
    const int lane = threadIdx.x % WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const float *p = x + (row0 + grp) * stride + k0 + quad;
    a.set(0, p[0]);
    a.set(1, p[8 * stride]);
    a.set(2, p[4]);
    a.set(3, p[8 * stride + 4]);
}

// B from x[k][n] (row-major in k): k k0.., columns n0..
template <bool kSplit>
__device__ __forceinline__ void load_b_kn(Frag<2, kSplit> &b, const float *x, int stride, int k0, int n0) {
    const int lane = threadIdx.x % WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const float *p = x + (k0 + quad) * stride + n0 + grp;
    b.set(0, p[0]);
    b.set(1, p[4 * stride]);
}

// B from x[n][k] (B = x^T): columns n0.., k k0..
template <bool kSplit>
__device__ __forceinline__ void load_b_nk(Frag<2, kSplit> &b, const float *x, int stride, int k0, int n0) {
    const int lane = threadIdx.x % WARP_SIZE, grp = lane >> 2, quad = lane & 3;
    const float *p = x + (n0 + grp) * stride + k0 + quad;
    b.set(0, p[0]);
    b.set(1, p[4]);
}

// Element e (0..3) of a D fragment: its row and column inside the 16 x 8 tile.
__device__ __forceinline__ int frag_row(int e) { return ((threadIdx.x % WARP_SIZE) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int frag_col(int e) { return 2 * ((threadIdx.x % WARP_SIZE) & 3) + (e & 1); }

}  // namespace gdnmma
