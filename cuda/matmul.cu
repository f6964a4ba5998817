// Matmul fused with GGUF dequant: y [rows, n] f32 = x [rows, k] f32 @ W^T (+ bias [n]).
// W [n, k] in GGUF blocks, row-major (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q5_0, F16, BF16, F32;
// readers in matmul_kquants.cuh, matmul_blocks.cuh, matmul_float.cuh). Reference:
// luce/ref/matmul.py on luce.gguf.quants.dequantize(W). ABI: luce_matmul in luce_ops.h.
//
// Block types, two launches:
// 1. quantize_x: per row and 256-value chunk, x = scale * q with q 16-bit (|q| <= 32767,
//    scale = max|x| / 32767), stored as a signed high byte and an unsigned low byte in the
//    mma B layout (matmul_mma.cuh), plus the f32 sums of every 16 values of x and the
//    exact integer sums of every 32 as byte planes (matmul_x.cuh).
// 2. mmq: per 32-value group, integer tensor-core products of the weights' small integers
//    with both bytes give the exact sum(q_w * q_x). Types with small integer scales (Q4_K,
//    Q5_K, Q6_K, IQ4_XS) sum scale * product in integers over a chunk and go to f32 once per
//    chunk; Q8_0 and Q5_0 (f16 scale per group) add scale * float(product) per group
//    (matmul_chunk.cuh). Per output element, the chunks kp, kp + 4, kp + 8, ... go to
//    accumulator kp, then y = ((acc0 + acc1) + acc2) + acc3 (+ bias). The order depends on
//    k only: a row's bits never depend on the other rows, on the launch shape (tokens per
//    block NT, row tiles per block WM) or on the path.
//    A block of the tile kernel (matmul_tile.cuh) is 4 warps (one per k part) x WM row tiles
//    of 16 rows x TS token sets of 8 * NT tokens; each warp streams its 16 rows' chunks through
//    shared memory (cp.async, 2 to 4 stages deep, matmul_stage.cuh) and padding tokens read no
//    activations. Launch shapes (launch_quant): one block per block tile, or a one-wave grid
//    whose blocks take several tiles through one ring, started before the kernel ahead ends
//    (cuda/pdl.cuh).
// One-row decode calls may take instead the dp4a kernel of matmul_gemv.cuh (IQ4_XS: its staged
// form, matmul_gemv_staged.cuh), which computes the same integers and float steps (the same bits),
// and under LUCE_MATMUL_X_ONCE quantizes x itself (matmul_gemv_x.cuh: one launch, no workspace);
// IQ4_XS, Q5_K, Q4_K, Q6_K and Q8_0 decode calls of 2..8 rows at k <= 6,144 the few-row kernel of
// matmul_gemv_rows.cuh and past it (Q8_0: also where its stages do not fit) its large-k form,
// matmul_gemv_rows_k.cuh (ditto).
#include <stdlib.h>

#include "matmul_kquants.cuh"
#include "matmul_blocks.cuh"
#include "matmul_float.cuh"
#include "matmul_stage.cuh"
#include "matmul_chunk.cuh"
#include "matmul_rows.cuh"
#include "matmul_tile.cuh"
#include "matmul_gemv_launch.cuh"
#include "matmul_gemv_pair.cuh"
#include "matmul_gemv_rows_launch.cuh"
#include "pdl.cuh"

namespace {

using namespace mm;

// Waves of 16-row tiles for n rows at 4 blocks per SM (0 if the device is unknown). The ring
// beat one block per tile (measured on an H200, docs/PERF.md, 2026-12-01) at up to 8 rows when
// the tiles fill 1 to 4 waves (gate/up, qkv; under one wave, down and out, and far over it, the
// LM head, one block per tile did better), and at 9 to 16 rows from one wave up.
inline double tile_waves(int64_t n) {
    const int sms = device_sms();
    return sms > 0 ? (double)((n + 15) / 16) / (4.0 * sms) : 0.0;
}

// Launch shape from the row count (decode) or fixed (prefill). `tune` 0: the measured choice
// (tile_waves up to 32 rows; kRingWide for Q8_0 and Q5_0 up to 8 rows, whose large stages leave
// few blocks; two row tiles a block past 32 rows), else the launch before, as for the prefill
// path. 1: the ring at every row count (kRingWide up to 8 rows), 2: two row tiles per block,
// 3: the launch before (kLegacy) everywhere. Every shape computes the same bits (see the header).
// 12: the wide-token tile kernel (matmul_rows.cuh: 64 rows a block, 4 warps of one m-tile) for
// decode calls of 9+ rows where it fits, else as 0 (11, its form of 2 warps of two m-tiles, was
// slower at every shape measured and spilled: removed, refused); 13 / 14: its cluster form, the
// k parts shared by clusters of 2 / 4 blocks (matmul_rows.cuh; where the device launches no
// clusters, as 12); 15: the cluster size by rows_auto_cluster (1, 2 or 4). Tune 0 takes 15 for
// decode calls of 9-16 rows, and of 17+ rows for matrices of 2^24+ weights (below). With 15 for
// every decode call of 9+ rows, on an H100 (docs/PERF.md session 29, 27B IQ4_XS, us): gate 17408 x
// 5120 at 16 / 23 rows 49.5 / 58.6 -> 45.0 / 55.7, down 5120 x 17408 at 23 / 64 88.7 / 165.7 ->
// 54.4 / 129.6, out at 23 33.1 -> 24.1, the LM head alike (615 -> 601 at 23); the 27B's verify
// at 16 / 23 / 64 rows 20.3 / 26.2 / 46.2 -> 19.1 / 20.8 / 44.9 ms and its DFlash pass (Q8_0, 16
// rows) 2.68 -> 2.04 ms. Slower alone: down and out at 16 rows (55.9 -> 59.2, 20.5 -> 25.3) and
// the gate at 64 (119.8 -> 125.7). Devices without clusters (sm_80-89, HIP) would run it one block
// a row block (down at 23 rows: 187.8 us on the H100): they keep the choice before, 12 for
// matrices of 8,192+ rows at 17+ tokens and the LM head's 9-16 (H200, session 15). Past 16 rows
// only matrices of 2^24+ weights take it: the Coder-1.5B's (k 1,536 or n 1,536) verify at 32 / 64
// rows measured 2.99 / 4.57 -> 3.48 / 4.95 ms with it everywhere (0.5B 2.06 -> 2.64 at 32); this
// split itself is not yet measured.
constexpr int64_t kRowsClusterMinWeights = (int64_t)1 << 24;
// LUCE_MATMUL_CLUSTERS=0: tune 0 takes the choice of devices without clusters (the cluster forms failed their
// bitwise test on an H200 in docs/PERF.md session 47; session 48 did not reproduce it on the same host with
// the same machine code, cause unknown; tunes 13-15 still run them).
bool clusters_by_default() {
    static const bool on = [] {
        const char *v = getenv("LUCE_MATMUL_CLUSTERS");
        return !(v && v[0] == '0');
    }();
    return on;
}
template <class Q>
int launch_quant(const MmqArgs &a, int path, int tune, cudaStream_t stream) {
    const int64_t t = path == LUCE_MATMUL_PREFILL ? (int64_t)1 << 40 : a.rows;
    if (tune == 0 && path != LUCE_MATMUL_PREFILL && t > 8) {
        if (cluster::launches() && clusters_by_default() &&
            (t <= 16 || a.n * a.x.groups * 32 >= kRowsClusterMinWeights))
            tune = 15;
        else if (a.n >= 8192 && (t > 16 || tile_waves(a.n) > 8.0)) tune = 12;
    }
    if (tune >= 12) {
        const int r = t <= 8 ? -1 : launch_rows<Q, 1, 4>(a, tune == 15 ? 0 : 1 << (tune - 12), stream);
        if (r >= 0) return r;
        tune = 0;
    }
    if (tune == 2) {
        if (t <= 8) return launch_mmq<Q, 1, 2, 1>(a, stream);
        if (t <= 16) return launch_mmq<Q, 2, 2, 1>(a, stream);
        return launch_mmq<Q, 2, 2, 2>(a, stream);
    }
    const bool measured = tune == 0 || tune >= 4;
    const double waves = measured && t <= 32 ? tile_waves(a.n) : 0.0;
    // Two row tiles a block where it measured faster (H200, docs/PERF.md session 15): the LM head's
    // 9-16 rows (waves > 8: 569 against 781 us at 16 rows), and every matrix at 33-80+ rows
    // (gate 164 -> 154 us at 64 rows, 287 -> 204 at 80; down, out, Q8_0 and the LM head alike).
    if (measured && path != LUCE_MATMUL_PREFILL && t > 8) {
        if (t <= 16 && waves > 8.0 && fits_device<Q, 2, 2, 1, kRing>()) return launch_mmq<Q, 2, 2, 1>(a, stream);
        if (t > 32 && fits_device<Q, 2, 2, 2, kRing>()) return launch_mmq<Q, 2, 2, 2>(a, stream);
    }
    const bool ring = tune == 1 || (t <= 8 ? waves >= 1.0 && waves <= 4.0 : t <= 32 && waves >= 1.0);
    if (!ring) {
        if (t == 1) return launch_mmq<Q, 1, 1, 1, true, kLegacy>(a, stream);
        if (t <= 8) return launch_mmq<Q, 1, 1, 1, false, kLegacy>(a, stream);
        if (t <= 16 || !fits_device<Q, 2, 1, 2, kLegacy>()) return launch_mmq<Q, 2, 1, 1, false, kLegacy>(a, stream);
        if (t <= 32 || !fits_device<Q, 2, 1, 4, kLegacy>()) return launch_mmq<Q, 2, 1, 2, false, kLegacy>(a, stream);
        return launch_mmq<Q, 2, 1, 4, false, kLegacy>(a, stream);
    }
    if (tune == 1 || !Q::kIntScale) {
        if (t == 1) return launch_mmq<Q, 1, 1, 1, true, kRingWide>(a, stream);
        if (t <= 8) return launch_mmq<Q, 1, 1, 1, false, kRingWide>(a, stream);
    }
    if (t == 1) return launch_mmq<Q, 1, 1, 1, true>(a, stream);
    if (t <= 8) return launch_mmq<Q, 1, 1, 1>(a, stream);
    if (t <= 16 || !fits_device<Q, 2, 1, 2, kRing>()) return launch_mmq<Q, 2, 1, 1>(a, stream);
    if (t <= 32 || !fits_device<Q, 2, 1, 4, kRing>()) return launch_mmq<Q, 2, 1, 2>(a, stream);
    return launch_mmq<Q, 2, 1, 4>(a, stream);
}

bool is_block_type(int qtype) { return qtype != LUCE_QT_F32 && qtype != LUCE_QT_F16 && qtype != LUCE_QT_BF16; }

// Tunes 9 and 10 pick for or against the few-row kernel at 2..8 rows; tune 0 takes it for the types
// marked in matmul_gemv_rows_launch.cuh (kGemvRowsIQ4XS, kGemvRowsQ5K, ...).
constexpr int kMaxTune = 15;

// The tune a tune-0 call takes: LUCE_MATMUL_TUNE (1..kMaxTune) where set, for benchmarks that
// time a launch shape end to end (every tune gives the same bits), else 0.
int default_tune() {
    static const int tune = [] {
        const char *v = getenv("LUCE_MATMUL_TUNE");
        const int t = v ? atoi(v) : 0;
        return t >= 1 && t <= kMaxTune && t != 11 ? t : 0;  // 11: removed (refused per call)
    }();
    return tune;
}

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


namespace {

// x [rows, k] quantized into the workspace (layout xl) for the decode family.
cudaError_t quantize_x(const luce_matmul_params *p, const XLayout &xl, cudaStream_t stream) {
    const int64_t warps = xl.tp * xl.chunks;
    const int per_block = 256 / WARP_SIZE;
    return launch_overlapped(quantize_x_kernel, dim3((unsigned)((warps + per_block - 1) / per_block)), dim3(256), 0,
                             stream, chain_overlap(kPdlQuant), p->x, p->rows, p->k, xl);
}

// One launch for luce_matmul_pair: a (Q4_K / Q5_K, twice the rows a batch) and b (Q6_K), one
// decode row each of the same x and workspace, both taking the one-row kernel at tune 0 with one
// chunk slot a lane. Else kPairNotTaken: the caller makes the two calls.
constexpr int kPairNotTaken = -1;

int matmul_pair_launch(const luce_matmul_params *a, const luce_matmul_params *b, cudaStream_t stream) {
    const bool shapes = a->rows == 1 && b->rows == 1 && a->path == LUCE_MATMUL_DECODE && b->path == LUCE_MATMUL_DECODE &&
                        a->k == b->k && a->x == b->x && a->workspace == b->workspace &&
                        a->workspace_bytes == b->workspace_bytes && (b->flags & LUCE_MATMUL_REUSE_X) &&
                        (a->qtype == LUCE_QT_Q4_K || a->qtype == LUCE_QT_Q5_K) && b->qtype == LUCE_QT_Q6_K &&
                        a->tune == 0 && b->tune == 0 && default_tune() == 0 && a->n > 0 && b->n > 0 && a->w && b->w &&
                        a->y && b->y && a->x && a->workspace && a->workspace_bytes >= x_bytes(1, a->k) &&
                        is_aligned16(a->x) && is_aligned16(a->workspace);
    if (!shapes) return kPairNotTaken;
    const int64_t rb_a = luce_matmul_row_bytes(a->qtype, a->k), rb_b = luce_matmul_row_bytes(b->qtype, b->k);
    if (rb_a < 0 || rb_b < 0) return kPairNotTaken;
    const XLayout xl = x_layout(a->workspace, 1, a->k);
    const uint8_t *wa = static_cast<const uint8_t *>(a->w), *wb = static_cast<const uint8_t *>(b->w);
    const OneRow ra = one_row_choice(a, wa, xl, rb_a, 0, false), rb = one_row_choice(b, wb, xl, rb_b, 0, false);
    if (!ra.runs || !rb.runs || !ra.deep || rb.deep || gemv_slots(xl.chunks) != 1) return kPairNotTaken;
    if (!(a->flags & LUCE_MATMUL_REUSE_X)) {
        const cudaError_t err = quantize_x(a, xl, stream);
        if (err != cudaSuccess) return luce_status(err);
    }
    const GemvArgs ga{wa, wa + a->n * rb_a, a->bias, a->y, xl, a->n, rb_a, 0, nullptr};
    const GemvArgs gb{wb, wb + b->n * rb_b, b->bias, b->y, xl, b->n, rb_b, 0, nullptr};
    if (a->qtype == LUCE_QT_Q4_K)
        return launch_gemv_pair<GemvQ4K, 2 * GemvQ4K::kRows, GemvQ6K, GemvQ6K::kRows>(ga, gb, stream);
    return launch_gemv_pair<GemvQ5K, 2 * GemvQ5K::kRows, GemvQ6K, GemvQ6K::kRows>(ga, gb, stream);
}

}  // namespace

extern "C" int luce_matmul_pair(const luce_matmul_params *a, const luce_matmul_params *b, void *stream_ptr) {
    if (!a || !b) return (int)cudaErrorInvalidValue;
    const int status = matmul_pair_launch(a, b, (cudaStream_t)stream_ptr);
    if (status != kPairNotTaken) return status;
    if (const int err = luce_matmul(a, stream_ptr)) return err;
    return luce_matmul(b, stream_ptr);
}

extern "C" int luce_matmul(const luce_matmul_params *p_in, void *stream_ptr) {
    luce_matmul_params tuned = *p_in;
    if (tuned.tune == 0) tuned.tune = default_tune();
    const int rows_tune = tuned.tune >= 11 ? tuned.tune : 0;  // the tile kernel's form (launch_quant); else as 0
    if (rows_tune && tuned.tune <= kMaxTune) tuned.tune = 0;
    const luce_matmul_params *p = &tuned;
    if (p->rows == 0) return 0;
    const int64_t row_bytes = luce_matmul_row_bytes(p->qtype, p->k);
    if (p->rows < 0 || p->n <= 0 || row_bytes < 0 || !p->x || !p->w || !p->y || p->tune < 0 ||
        p->tune > kMaxTune || rows_tune == 11 || (p->path != LUCE_MATMUL_DECODE && p->path != LUCE_MATMUL_PREFILL))
        return (int)cudaErrorInvalidValue;
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    if (!is_block_type(p->qtype)) {
        FloatArgs a{p->x, static_cast<const uint8_t *>(p->w), p->bias, p->y, p->rows, p->n, p->k, row_bytes};
        if (p->qtype == LUCE_QT_F32) return launch_float_matmul<LUCE_QT_F32>(a, stream);
        if (p->qtype == LUCE_QT_F16) return launch_float_matmul<LUCE_QT_F16>(a, stream);
        return launch_float_matmul<LUCE_QT_BF16>(a, stream);
    }
    if (!p->workspace || p->workspace_bytes < x_bytes(p->rows, p->k) || !is_aligned16(p->x) ||
        !is_aligned16(p->workspace) || p->rows > 65535LL * 64)
        return (int)cudaErrorInvalidValue;
    const XLayout xl = x_layout(p->workspace, p->rows, p->k);
    const uint8_t *w = static_cast<const uint8_t *>(p->w);
    const int tune = p->tune == 9 || p->tune == 10 ? 0 : p->tune;  // the few-row choice's tunes act as 0 elsewhere
    const OneRow one_row = one_row_choice(p, w, xl, row_bytes, tune);  // matmul_gemv_launch.cuh
    // X_ONCE without REUSE_X on the one-row kernel: it quantizes x itself, the workspace is not written.
    const bool in_lane = one_row.runs && one_row.x_in_lane &&
                         (p->flags & (LUCE_MATMUL_REUSE_X | LUCE_MATMUL_X_ONCE)) == LUCE_MATMUL_X_ONCE;
    if (!(p->flags & LUCE_MATMUL_REUSE_X) && !in_lane) {
        const cudaError_t err = quantize_x(p, xl, stream);
        if (err != cudaSuccess) return luce_status(err);
    }
    if (one_row.runs) return launch_one_row(p, w, xl, row_bytes, tune, one_row, in_lane ? p->x : nullptr, stream);
    const int rows_status = try_gemv_rows(p, w, xl, row_bytes, stream);
    if (rows_status >= 0) return rows_status;
    const MmqArgs a{w, w + p->n * row_bytes, p->bias, p->y, xl, p->rows, p->n, row_bytes};
    const int qt = rows_tune ? rows_tune : tune;
    switch (p->qtype) {
        case LUCE_QT_Q4_K: return launch_quant<ReaderQ4K>(a, p->path, qt, stream);
        case LUCE_QT_Q5_K: return launch_quant<ReaderQ5K>(a, p->path, qt, stream);
        case LUCE_QT_Q6_K: return launch_quant<ReaderQ6K>(a, p->path, qt, stream);
        case LUCE_QT_IQ4_XS: return launch_quant<ReaderIQ4XS>(a, p->path, qt, stream);
        case LUCE_QT_Q8_0: return launch_quant<ReaderQ80>(a, p->path, qt, stream);
        case LUCE_QT_Q5_0: return launch_quant<ReaderQ50>(a, p->path, qt, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
