// TF32 tensor-core product shared by the prompt-row attention (cuda/attention_prefill.cu) and the
// GDN chunk kernel (cuda/gdn_chunked_tc.cuh): one warp computes C[16 x 8] += A[16 x 8] B[8 x 8]
// in f32 from operands that are already TF32 values (f32 words whose low 13 mantissa bits are
// zero: tf32_round). Reference of the rounding: luce/ref/attention_prefill.py (tf32).
//
// Lane = 4 * g + t (g 0..7, t 0..3); the PTX m16n8k8 .row.col fragment layouts:
//   A: a[0] = A[g][t], a[1] = A[g + 8][t], a[2] = A[g][t + 4], a[3] = A[g + 8][t + 4]
//   B: b[0] = B[t][g], b[1] = B[t + 4][g]
//   C: c[0] = C[g][2t], c[1] = C[g][2t + 1], c[2] = C[g + 8][2t], c[3] = C[g + 8][2t + 1]
// NVIDIA sm_80+ runs mma.sync (the tensor core's own f32 accumulation); elsewhere (HIP, the
// host emulator tests/kernels/emu) a shuffle form computes the same fragment semantics with
// an fmaf chain over k = 0..7, C first. Both are fixed functions of the operands, so a
// kernel's bits never depend on what else shares the warp's other rows.
#pragma once

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIPCC__)
#define LUCE_MMA_TF32_NATIVE 1
#endif

namespace tc {

// f32 -> TF32 (10 mantissa bits), round to nearest, ties away from zero (PTX cvt.rna.tf32.f32);
// inf and NaN pass unchanged. One definition on every target.
__device__ __forceinline__ float tf32_round(float x) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    return __uint_as_float((u + 0x1000u) & 0xffffe000u);
}

__device__ __forceinline__ void mma_tf32_16x8x8(float *c, const float *a, const float *b) {
#ifdef LUCE_MMA_TF32_NATIVE
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
#else
    static_assert(WARP_SIZE == 32, "the m16n8k8 fragments are 32 lanes");
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
    float ar[2][8], bc[2][8];  // A rows g, g + 8 and B columns 2t, 2t + 1 over k = 0..7
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int la = 4 * g + k, lb0 = 4 * (2 * t) + k, lb1 = lb0 + 4;
        ar[0][k] = warp_shfl(a[0], la);
        ar[1][k] = warp_shfl(a[1], la);
        ar[0][k + 4] = warp_shfl(a[2], la);
        ar[1][k + 4] = warp_shfl(a[3], la);
        bc[0][k] = warp_shfl(b[0], lb0);
        bc[0][k + 4] = warp_shfl(b[1], lb0);
        bc[1][k] = warp_shfl(b[0], lb1);
        bc[1][k + 4] = warp_shfl(b[1], lb1);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float d = c[i];
#pragma unroll
        for (int k = 0; k < 8; ++k) d = fmaf(ar[i >> 1][k], bc[i & 1][k], d);
        c[i] = d;
    }
#endif
}

}  // namespace tc
