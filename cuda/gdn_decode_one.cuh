// The GDN decode chain of AR rows in one launch (luce_gdn_decode's default form; the two-launch
// form, prepare then gdn_recurrent_kernel, with LUCE_GDN_ONE_LAUNCH=0): the recurrent step's grid
// (Dv / WARP_SIZE, Hv, segments), each block computing the inputs it reads with the prepare's
// device functions (gdn_decode_rows.cuh), so every value is bitwise the two-launch form's:
// - warps 0 and 1: q and k of key head h % Hk (conv + SiLU + L2 norm, a key head a warp as the
//   prepare), a lane of warp 2 the head's gates, into shared memory; every thread v of its column;
// - then gdn_step (gdn_common.cuh) from shared q, k, as gdn_recurrent_kernel, and the norm
//   epilogue (gdn_norm_epilogue.cuh, quantizing for the out projection where given).
// The conv state advances in place once every block has read it: a v channel by its one block
// after its rows; key head kh's q and k channels are read by the blocks of every value head j
// with j % Hk == kh (all Dv / WARP_SIZE column blocks of each), which count themselves in
// arrivals (the conv counter of (segment, kh)) after their reads; the last one advances them.
// Block (0, 0, 0) also quantizes the workspace's padding rows (zeros). Every counter is reset by
// its last arriver, so arrivals are zero after the launch as before it.
#pragma once

#include "gdn_decode_rows.cuh"

namespace {

template <int K, int DK>
__global__ void __launch_bounds__(GDN_THREADS, 2) gdn_decode_one_kernel(luce_gdn_decode_params p, mm::XLayout l,
                                                                     GdnNormEpilogue e, int32_t *conv_arrivals) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    __shared__ GdnScratch scratch;
    __shared__ float4 qk4[2][DK / 4];  // the row's q, k of the block's key head (16-byte aligned)
    float (*qk)[DK] = reinterpret_cast<float (*)[DK]>(qk4);
    __shared__ float gates[2];  // its beta, g
    __shared__ int last;
    wait_for_prior_kernels();  // qkv, z, b, a come from the matmuls ahead
    let_dependents_start();
    const int seg = blockIdx.z, head = blockIdx.y, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int64_t H = p.n_v_heads, Hk = p.n_k_heads, dv = p.dv, kh = head % Hk;
    const int64_t C = 2 * Hk * DK + H * dv, col = (int64_t)blockIdx.x * WARP_SIZE + lane;
    const int64_t cv = 2 * Hk * DK + head * dv + col;  // this thread's v channel
    if (l.xq != nullptr && blockIdx.x == 0 && head == 0 && seg == 0) {
        const int64_t pad_warps = (l.tp - p.rows) * l.chunks;
        for (int64_t item = warp; item < pad_warps; item += GDN_KGROUPS)  // whole warps
            mm::quantize_x_row_chunk<false>(nullptr, false, l, p.rows + item / l.chunks, item % l.chunks);
    }
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg], r1 = p.qo_indptr[seg + 1];
    if (slot < 0 || r1 <= r0) return;  // padding segment: nothing written, nothing counted
    if (slot >= p.n_slots) {           // bad slot: poison the outputs, leave every state alone
        if (warp == 0)
            for (int64_t t = r0; t < r1; ++t) p.out[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
    } else {
        float *conv = p.conv_state + slot * (K - 1) * C;
        float *hp = p.state + ((slot * H + head) * DK + (int64_t)warp * ROWS) * dv + col;
        float h[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) h[r] = hp[r * dv];
        for (int64_t t = r0; t < r1; ++t) {
            if (warp < 2) {  // q (warp 0) or k (warp 1) of key head kh
                float y[DK / WARP_SIZE];
                qk_head_normed<K, false>(p, nullptr, conv, C, warp * Hk + kh, r0, t - r0, y);
#pragma unroll
                for (int i = 0; i < DK / WARP_SIZE; ++i) qk[warp][lane + i * WARP_SIZE] = y[i];
            }
            if (warp == 2 && lane == 0) gdn_gates(p, t, head, gates[0], gates[1]);
            const float v = conv_silu_at<K, false>(p, nullptr, conv + cv, C, cv, r0, t - r0);
            __syncthreads();  // q, k and the gates are in shared memory
            const float beta = gates[0], g = gates[1];
            float k[ROWS], q[ROWS];
            gdn_load_rows<ROWS>(&qk[1][warp * ROWS], k);
            gdn_load_rows<ROWS>(&qk[0][warp * ROWS], q);
            float u;
            const float o = gdn_step<ROWS>(h, k, q, v, expf(g), beta, scratch, &u);  // its barriers end the reads of qk
            if (warp == 0) p.out[(t * H + head) * dv + col] = o;
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) hp[r * dv] = h[r];
        __syncthreads();  // every warp has read the v channels' windows
        if (warp == 0) conv_state_advance<K>(p, conv + cv, C, cv, r0, r1 - r0);
        __threadfence();  // this block's reads of the q / k windows are done before it counts
        __syncthreads();
        if (threadIdx.x == 0) {
            int32_t *counter = conv_arrivals + (int64_t)seg * Hk + kh;
            const int readers = (int)((H - kh + Hk - 1) / Hk * gridDim.x);
            last = atomicAdd(counter, 1) == readers - 1;
            if (last) *counter = 0;
        }
        __syncthreads();
        if (last && warp < 2) {
            __threadfence();
            qk_head_advance<K>(p, conv, C, warp * Hk + kh, r0, r1 - r0);
        }
    }
    gdn_norm_epilogue(e, p.out, seg, r0, r1, H, head, dv);
}

}  // namespace
