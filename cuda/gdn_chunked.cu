// Gated DeltaNet chunked prefill (WY / UT-transform form). Reference: luce/ref/gdn_chunked.py.
// Params: luce_gdn_chunked_params in cuda/luce_ops.h: q, k [T, Hv, Dk], v [T, Hv, Dv],
// g, beta [T, Hv], out [T, Hv, Dv] f32; state [n_slots, Hv, Dk, Dv] f32 updated in place.
//
// The segment is cut into chunks at absolute multiples of LUCE_GDN_CHUNK (DESIGN 5 rule 3);
// a chunk of L > 1 tokens, with G the inclusive cumulative sum of g inside it:
//   A[t, s] = beta_t exp(G_t - G_s) k_t.k_s (s < t),   QK[t, s] = exp(G_t - G_s) q_t.k_s (s <= t)
//   U = (I + A)^-1 beta (V - exp(G) K S)
//   o_t = exp(G_t) q_t^T S + sum_{s <= t} QK[t, s] u_s
//   S = exp(G_L) S + sum_s exp(G_L - G_s) k_s u_s^T
// A one-token chunk runs gdn_step (cuda/gdn_common.cuh), the recurrent kernel's arithmetic.
// Every sum runs in a fixed order set by the segment's own sizes: batch-invariant.
//
// Variants: the tensor-core kernel (cuda/gdn_chunked_tc.cuh), 3xTF32 (f32-class products), on
// CUDA; on HIP the f32 kernel (cuda/gdn_chunked_f32.cuh; see chunked_mode). The environment
// variable LUCE_GDN_CHUNKED (read at each call, so a bench can time every variant in one
// process; a switch for measurement, not for serving) picks one: "tf32x3", "tf32" (one TF32
// pass: ~5e-4 relative error) or "f32"; any other value is refused. Each variant is bitwise
// invariant on its own; they differ from each other within tests/kernels/tolerances.py.
//
// Configurations: each variant has shared-memory layouts that give bitwise the same outputs
// and states; a launch takes the first that fits the device's opt-in shared memory per block
// (smem_limit: H200 227 KB, A100 163 KB, RTX 3090 / 4090 / 5090 99 KB, RDNA3/4 64 KB):
//   tensor cores, Dk 128 (the 27B): Smem<128, 64> 165,120 B (the H200's); SmemCompact<128, 64>
//     94,464 B (99 KB devices; Dv not a multiple of 64: SmemCompact<128, 32>, 69,888 B);
//     SmemCompact<128, 16> 57,600 B (64 KB).
//   tensor cores, Dk 64: Smem<64, 64> 113,920 B; Smem<64, 32> 97,536 B (99 KB devices);
//     SmemCompact<64, 32> 59,648 B (64 KB).
//   tensor cores, Dk 256: Smem<256, 32> 226,560 B; SmemCompact<256, 64> 131,328 B (A100);
//     SmemCompact<256, 32> 90,368 B (99 KB); none fits 64 KB (SmemCompact<256, 16>: 69,888 B).
//   f32: ChunkSmem / ChunkSmemCompact (sizes in cuda/gdn_chunked_f32.cuh; the compact one fits
//     64 KB at every Dk).
// Nothing fitting: cudaErrorNotSupported. LUCE_SMEM_LIMIT (bytes, read at each call; a switch
// for tests) lowers the limit, to run the smaller configurations on any device.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gdn_chunked_f32.cuh"
#include "gdn_chunked_tc.cuh"

namespace {

// The f32 kernel on layout S (gdnf32::ChunkSmem or ChunkSmemCompact), one (column tile, head,
// segment) a block.
template <class S>
__global__ void __launch_bounds__(GDN_THREADS, 1) gdn_chunked_kernel(luce_gdn_chunked_params p) {
    using namespace gdnf32;
    extern __shared__ float4 smem4[];
    S &sm = *reinterpret_cast<S *>(smem4);
    constexpr int DK = S::kDk, ROWS = DK / GDN_KGROUPS;
    const int seg = blockIdx.z, head = blockIdx.y;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t col = (int64_t)blockIdx.x * kTile + lane;
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg], r1 = p.qo_indptr[seg + 1];
    if (slot < 0 || r1 <= r0) return;  // padding segment: nothing written
    const int64_t H = p.n_heads, dv = p.dv;
    if (slot >= p.n_slots) {           // bad slot: poison the outputs, leave every state alone
        if (kgroup == 0)
            for (int64_t t = r0; t < r1; ++t) p.out[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
        return;
    }
    float *hp = p.state + (slot * H + head) * DK * dv + col;
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) sm.s[kgroup * ROWS + rr][lane] = hp[(int64_t)(kgroup * ROWS + rr) * dv];
    __syncthreads();

    const int64_t pos0 = p.start_pos[seg];
    int64_t begin = r0, end = r0 + (kChunk - pos0 % kChunk);  // first cut: next chunk multiple
    while (begin < r1) {
        if (end > r1) end = r1;
        if (end - begin == 1) one_token(sm, p, begin, head, col);
        else run_chunk(sm, p, begin, (int)(end - begin), head, col);
        begin = end;
        end = begin + kChunk;
    }

#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) hp[(int64_t)(kgroup * ROWS + rr) * dv] = sm.s[kgroup * ROWS + rr][lane];
}

template <class S, bool SP>
__global__ void __launch_bounds__(GDN_THREADS, 1) gdn_chunked_tc_kernel(luce_gdn_chunked_params p) {
    extern __shared__ float4 smem4[];
    gdntc::run_block<S, SP>(*reinterpret_cast<S *>(smem4), p);
}

template <class S>
int launch_f32(const luce_gdn_chunked_params &p, cudaStream_t stream) {
    const size_t smem = sizeof(S);
    static bool attribute_set = false;  // once, before any graph capture reaches here
    if (!attribute_set) {
        const cudaError_t err = cudaFuncSetAttribute(gdn_chunked_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        attribute_set = true;
    }
    const dim3 grid((unsigned)(p.dv / gdnf32::kTile), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_chunked_kernel<S><<<grid, GDN_THREADS, smem, stream>>>(p);
    return luce_status(cudaGetLastError());
}

template <class S, bool SP>
int launch_tc(const luce_gdn_chunked_params &p, cudaStream_t stream) {
    const size_t smem = sizeof(S);
    static bool attribute_set = false;  // once, before any graph capture reaches here
    if (!attribute_set) {
        const cudaError_t err = cudaFuncSetAttribute(gdn_chunked_tc_kernel<S, SP>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        attribute_set = true;
    }
    const dim3 grid((unsigned)(p.dv / S::kBv), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_chunked_tc_kernel<S, SP><<<grid, GDN_THREADS, smem, stream>>>(p);
    return luce_status(cudaGetLastError());
}

// Shared memory a block may take: the device's opt-in limit per block, queried once per process
// (HIP: 64 KB, RDNA's LDS per workgroup, unless the runtime reports more; unknown on CUDA: no
// limit, the launch says what fails), or LUCE_SMEM_LIMIT when that is lower. 0: LUCE_SMEM_LIMIT
// is not a positive number of bytes.
int64_t smem_limit() {
    static int optin = -1;
    if (optin < 0) {
        int device = 0, bytes = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
            bytes = 0;
            (void)cudaGetLastError();
        }
#ifdef __HIPCC__
        if (bytes < 65536) bytes = 65536;
#endif
        optin = bytes;
    }
    const int64_t device_limit = optin > 0 ? optin : INT64_MAX;
    const char *e = getenv("LUCE_SMEM_LIMIT");
    if (e == nullptr || e[0] == '\0') return device_limit;
    char *end = nullptr;
    const long long bytes = strtoll(e, &end, 10);
    if (*end != '\0' || bytes <= 0) return 0;
    return bytes < device_limit ? (int64_t)bytes : device_limit;
}

template <class S>
constexpr bool fits(int64_t limit) { return (int64_t)sizeof(S) <= limit; }

template <int DK>
int launch_f32_fitting(const luce_gdn_chunked_params &p, cudaStream_t s, int64_t limit) {
    using namespace gdnf32;
    if (fits<ChunkSmem<DK>>(limit)) return launch_f32<ChunkSmem<DK>>(p, s);
    if (fits<ChunkSmemCompact<DK>>(limit)) return launch_f32<ChunkSmemCompact<DK>>(p, s);
    return (int)cudaErrorNotSupported;
}

// The H200's configuration first (column blocks of 64 where Dv allows it, Dk 256: 32), then
// column blocks of 32, then the compact layout, widest column blocks first. Left out: compact
// layouts no device takes (one of the layouts above fits first on every device with at least
// 64 KB, or none fits: Dk 256 compact with 16 columns needs 69,888 B).
template <int DK, bool SP>
int launch_tc_fitting(const luce_gdn_chunked_params &p, cudaStream_t s, int64_t limit) {
    using namespace gdntc;
    const bool wide = p.dv % 64 == 0;
    if constexpr (DK <= 128)
        if (wide && fits<Smem<DK, 64>>(limit)) return launch_tc<Smem<DK, 64>, SP>(p, s);
    if (fits<Smem<DK, 32>>(limit)) return launch_tc<Smem<DK, 32>, SP>(p, s);
    if constexpr (DK >= 128)
        if (wide && fits<SmemCompact<DK, 64>>(limit)) return launch_tc<SmemCompact<DK, 64>, SP>(p, s);
    if (fits<SmemCompact<DK, 32>>(limit)) return launch_tc<SmemCompact<DK, 32>, SP>(p, s);
    if constexpr (DK == 128)
        if (fits<SmemCompact<DK, 16>>(limit)) return launch_tc<SmemCompact<DK, 16>, SP>(p, s);
    return (int)cudaErrorNotSupported;
}

template <int DK>
int launch_tc_variant(const luce_gdn_chunked_params &p, cudaStream_t s, int64_t limit, bool split) {
    return split ? launch_tc_fitting<DK, true>(p, s, limit) : launch_tc_fitting<DK, false>(p, s, limit);
}

// LUCE_GDN_CHUNKED: "tf32x3" the tensor-core kernel (the default on CUDA), "tf32" its one-pass
// form, "f32" the f32 kernel (the default on HIP: without mma.sync the tensor-core kernel runs
// its shuffle fallback, ~100 instructions a product, slower than plain f32 FMAs).
int chunked_mode() {
    const char *e = getenv("LUCE_GDN_CHUNKED");
#ifdef __HIPCC__
    if (e == nullptr || e[0] == '\0') return 0;
#endif
    if (e == nullptr || e[0] == '\0' || strcmp(e, "tf32x3") == 0) return 3;
    if (strcmp(e, "tf32") == 0) return 1;
    if (strcmp(e, "f32") == 0) return 0;
    return -1;
}

}  // namespace

extern "C" int luce_gdn_chunked(const luce_gdn_chunked_params *p, void *stream) {
    if (p->n_segments == 0) return 0;
    static_assert(gdnf32::kTile == WARP_SIZE, "gdn_bad_sizes checks dv against WARP_SIZE-column tiles");
    if (gdn_bad_sizes(p->n_segments, p->n_heads, p->dk, p->dv) || p->n_slots < 0 ||
        ((uintptr_t)p->q | (uintptr_t)p->k) % 16 != 0)  // rows of q, k move as float4
        return (int)cudaErrorInvalidValue;
    const cudaStream_t s = (cudaStream_t)stream;
    const int mode = chunked_mode();
    const int64_t limit = smem_limit();
    if (mode < 0 || limit <= 0) return (int)cudaErrorInvalidValue;
    if (mode > 0) switch (p->dk) {
        case 64: return launch_tc_variant<64>(*p, s, limit, mode == 3);
        case 128: return launch_tc_variant<128>(*p, s, limit, mode == 3);
        case 256: return launch_tc_variant<256>(*p, s, limit, mode == 3);
        default: return (int)cudaErrorInvalidValue;
    }
    switch (p->dk) {
        case 64: return launch_f32_fitting<64>(*p, s, limit);
        case 128: return launch_f32_fitting<128>(*p, s, limit);
        case 256: return launch_f32_fitting<256>(*p, s, limit);
        default: return (int)cudaErrorInvalidValue;
    }
}
