// Row gather/scatter copy: KV rows, recurrent state and captured features into or out of
// their slots at commit, and slot snapshots (reference: luce/ref/gather.py gather_rows).
// Copy i moves row_bytes bytes from src + src_rows[i] * src_stride to
// dst + dst_rows[i] * dst_stride (NULL index array: row i; a negative index skips copy i).
// Grid: x = copies, y = slices of a row; 16-byte words when every address and size allows,
// else 4-byte words, else bytes. Each block moves kUnroll words per thread per step, loads
// first, so a thread keeps several requests in flight.
#include "common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int64_t kMaxGridY = 65535;

template <typename Word>
__global__ void __launch_bounds__(kThreads) gather_kernel(luce_gather_params p) {
    const int64_t i = blockIdx.x;
    const int64_t s = p.src_rows ? p.src_rows[i] : i;
    const int64_t d = p.dst_rows ? p.dst_rows[i] : i;
    if (s < 0 || d < 0) return;
    const Word *src = reinterpret_cast<const Word *>(static_cast<const char *>(p.src) + s * p.src_stride);
    Word *dst = reinterpret_cast<Word *>(static_cast<char *>(p.dst) + d * p.dst_stride);
    const int64_t words = p.row_bytes / (int64_t)sizeof(Word);
    const int64_t step = (int64_t)gridDim.y * kThreads * kUnroll;
    for (int64_t base = (int64_t)blockIdx.y * kThreads * kUnroll + threadIdx.x; base < words;
         base += step) {
        Word w[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t e = base + (int64_t)u * kThreads;
            if (e < words) w[u] = src[e];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t e = base + (int64_t)u * kThreads;
            if (e < words) dst[e] = w[u];
        }
    }
}

template <typename Word>
int launch_words(const luce_gather_params &p, cudaStream_t stream) {
    const int64_t words = p.row_bytes / (int64_t)sizeof(Word);
    const int64_t per_block = (int64_t)kThreads * kUnroll;
    int64_t slices = (words + per_block - 1) / per_block;
    if (slices > kMaxGridY) slices = kMaxGridY;
    const dim3 grid((unsigned)p.n, (unsigned)slices);
    gather_kernel<Word><<<grid, kThreads, 0, stream>>>(p);
    return luce_status(cudaGetLastError());
}

bool multiple_of(const luce_gather_params &p, uint64_t w) {
    return (reinterpret_cast<uintptr_t>(p.src) % w) == 0 && (reinterpret_cast<uintptr_t>(p.dst) % w) == 0 &&
           (uint64_t)p.row_bytes % w == 0 && (uint64_t)p.src_stride % w == 0 &&
           (uint64_t)p.dst_stride % w == 0;
}

int launch_gather(const luce_gather_params &p, cudaStream_t stream) {
    if (p.n < 0 || p.n > 0x7fffffff || p.row_bytes < 0 || p.src_stride < 0 || p.dst_stride < 0)
        return (int)cudaErrorInvalidValue;
    if (p.n == 0 || p.row_bytes == 0) return 0;
    if (multiple_of(p, 16)) return launch_words<uint4>(p, stream);
    if (multiple_of(p, 4)) return launch_words<uint32_t>(p, stream);
    return launch_words<unsigned char>(p, stream);
}

}  // namespace

extern "C" int luce_gather(const luce_gather_params *p, void *stream) {
    return launch_gather(*p, (cudaStream_t)stream);
}
