// Embedding lookup from a quantized table: out[t] = dequant(table row token_ids[t]).
// The table [n_rows, cols] stays in its GGUF blocks on the device (row r is row_bytes bytes
// at table + r * row_bytes); each value is decoded with the float operations of
// luce.gguf.quants (ggml's order: one rounding per product, so bitwise the host decode).
// Reference: luce/ref/embedding.py. Types: F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q5_K, Q6_K,
// IQ4_XS. Ids outside [0, n_rows) give a NaN row (the backend checks ids before launch).
// Grid: x = column slices, y = tokens; one thread per output value.
#include "common.cuh"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float f16_at(const uint8_t *p) {
    const uint16_t bits = (uint16_t)p[0] | ((uint16_t)p[1] << 8);
    return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float i2f(int v) { return (float)v; }

// Q4_K / Q5_K 6-bit (scale, min) of sub-block j from the 12 packed bytes at `s`.
__device__ __forceinline__ void k_scale_min(const uint8_t *s, int j, int &sc, int &m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[4 + j] & 63;
    } else {
        sc = (s[8 + j - 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[8 + j - 4] >> 4) | ((s[4 + j - 4] >> 6) << 4);
    }
}

__device__ __forceinline__ float iq4_value(int idx) {
    constexpr int8_t table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1, 13, 25, 38, 53, 69, 89, 113};
    return i2f(table[idx]);
}

// Value v of the block at b (v < values per block).
template <int QT>
__device__ float decode(const uint8_t *b, int v) {
    if constexpr (QT == LUCE_QT_F32) {
        return reinterpret_cast<const float *>(b)[v];
    } else if constexpr (QT == LUCE_QT_F16) {
        return f16_at(b + 2 * v);
    } else if constexpr (QT == LUCE_QT_BF16) {
        const uint32_t bits = ((uint32_t)b[2 * v] | ((uint32_t)b[2 * v + 1] << 8)) << 16;
        return __uint_as_float(bits);
    } else if constexpr (QT == LUCE_QT_Q8_0) {
        return __fmul_rn(i2f((int8_t)b[2 + v]), f16_at(b));
    } else if constexpr (QT == LUCE_QT_Q5_0) {
        const int l = v & 15;
        const uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) |
                            ((uint32_t)b[5] << 24);
        const int lo = v < 16 ? (b[6 + l] & 15) : (b[6 + l] >> 4);
        const int q = lo | (((qh >> v) & 1) << 4);
        return __fmul_rn(f16_at(b), i2f(q - 16));
    } else if constexpr (QT == LUCE_QT_Q4_K || QT == LUCE_QT_Q5_K) {
        const int j = v >> 5, l = v & 31;
        int sc, m;
        k_scale_min(b + 4, j, sc, m);
        const uint8_t *qs = b + (QT == LUCE_QT_Q4_K ? 16 : 48);
        int q = (qs[32 * (j >> 1) + l] >> (4 * (j & 1))) & 15;
        if constexpr (QT == LUCE_QT_Q5_K) q |= ((b[16 + l] >> j) & 1) << 4;
        const float scale = __fmul_rn(f16_at(b), i2f(sc));
        const float minimum = __fmul_rn(f16_at(b + 2), i2f(m));
        return __fsub_rn(__fmul_rn(scale, i2f(q)), minimum);
    } else if constexpr (QT == LUCE_QT_Q6_K) {
        const int h = v >> 7, w = v & 127, g = w >> 5, l = w & 31;
        const int lo = (b[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 15;
        const int hi = (b[128 + 32 * h + l] >> (2 * g)) & 3;
        const float scale = __fmul_rn(f16_at(b + 208), i2f((int8_t)b[192 + (v >> 4)]));
        return __fmul_rn(scale, i2f((lo | (hi << 4)) - 32));
    } else {  // IQ4_XS
        const int j = v >> 5, l = v & 15;
        const uint16_t scales_h = (uint16_t)b[2] | ((uint16_t)b[3] << 8);
        const int ls = ((b[4 + (j >> 1)] >> (4 * (j & 1))) & 15) | (((scales_h >> (2 * j)) & 3) << 4);
        const float sub_scale = __fmul_rn(f16_at(b), i2f(ls - 32));
        const uint8_t byte = b[8 + 16 * j + l];
        const int idx = (v & 31) < 16 ? (byte & 15) : (byte >> 4);
        return __fmul_rn(iq4_value(idx), sub_scale);
    }
}

template <int QT>
__global__ void __launch_bounds__(kThreads) embedding_kernel(luce_embedding_params p, int values,
                                                             int block_bytes) {
    const int64_t t = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (c >= p.cols) return;
    float *out = p.out + t * p.out_stride;
    const int32_t id = p.token_ids[t];
    if (id < 0 || id >= p.n_rows) {
        out[c] = __int_as_float(0x7fc00000);
        return;
    }
    const uint8_t *row = static_cast<const uint8_t *>(p.table) + (int64_t)id * p.row_bytes;
    out[c] = decode<QT>(row + (c / values) * block_bytes, (int)(c % values));
}

template <int QT>
cudaError_t launch(const luce_embedding_params &p, int values, int block_bytes, cudaStream_t s) {
    const dim3 grid((unsigned)((p.cols + kThreads - 1) / kThreads), (unsigned)p.n_tokens);
    embedding_kernel<QT><<<grid, kThreads, 0, s>>>(p, values, block_bytes);
    return cudaGetLastError();
}

}  // namespace

extern "C" int64_t luce_embedding_row_bytes(int32_t qtype, int64_t cols) {
    int values, bytes;
    switch (qtype) {
        case LUCE_QT_F32: values = 1; bytes = 4; break;
        case LUCE_QT_F16: case LUCE_QT_BF16: values = 1; bytes = 2; break;
        case LUCE_QT_Q8_0: values = 32; bytes = 34; break;
        case LUCE_QT_Q5_0: values = 32; bytes = 22; break;
        case LUCE_QT_Q4_K: values = 256; bytes = 144; break;
        case LUCE_QT_Q5_K: values = 256; bytes = 176; break;
        case LUCE_QT_Q6_K: values = 256; bytes = 210; break;
        case LUCE_QT_IQ4_XS: values = 256; bytes = 136; break;
        default: return -1;
    }
    if (cols < 0 || cols % values) return -1;
    return cols / values * bytes;
}

extern "C" int luce_embedding(const luce_embedding_params *p, void *stream) {
    const int64_t rb = luce_embedding_row_bytes(p->qtype, p->cols);
    if (rb < 0 || rb != p->row_bytes || p->n_tokens > 65535 || p->n_rows < 0 ||
        p->out_stride < p->cols)
        return luce_status(cudaErrorInvalidValue);
    if (p->n_tokens == 0 || p->cols == 0) return 0;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (p->qtype) {
        case LUCE_QT_F32: return luce_status(launch<LUCE_QT_F32>(*p, 1, 4, s));
        case LUCE_QT_F16: return luce_status(launch<LUCE_QT_F16>(*p, 1, 2, s));
        case LUCE_QT_BF16: return luce_status(launch<LUCE_QT_BF16>(*p, 1, 2, s));
        case LUCE_QT_Q8_0: return luce_status(launch<LUCE_QT_Q8_0>(*p, 32, 34, s));
        case LUCE_QT_Q5_0: return luce_status(launch<LUCE_QT_Q5_0>(*p, 32, 22, s));
        case LUCE_QT_Q4_K: return luce_status(launch<LUCE_QT_Q4_K>(*p, 256, 144, s));
        case LUCE_QT_Q5_K: return luce_status(launch<LUCE_QT_Q5_K>(*p, 256, 176, s));
        case LUCE_QT_Q6_K: return luce_status(launch<LUCE_QT_Q6_K>(*p, 256, 210, s));
        default: return luce_status(launch<LUCE_QT_IQ4_XS>(*p, 256, 136, s));
    }
}
