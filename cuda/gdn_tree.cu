// Gated DeltaNet over draft trees: exact verify with factor capture, commit by factor
// replay (DESIGN 3), and the per-node stored states baseline (`--spec ddtree`). Reference:
// luce/ref/gdn_tree.py (gdn_tree_verify, gdn_tree_commit, gdn_tree_verify_baseline).
// Params and shapes: luce_gdn_tree_verify_params / luce_gdn_tree_commit_params in
// cuda/luce_ops.h: q, k [T, Hv, Dk], v, out, u [T, Hv, Dv], g, beta [T, Hv] f32; state
// [n_slots, Hv, Dk, Dv] f32; tree_parents [T] global parent rows.
//
// Both kernels use gdn_recurrent's block layout (grid (Dv / WARP_SIZE, Hv, segments),
// GDN_THREADS threads, a thread holding ROWS = Dk / GDN_KGROUPS rows of one column) and its
// device functions (cuda/gdn_common.cuh), so every node's output, u and the committed state
// are bitwise what luce_gdn_recurrent gives along the same tokens.
//
// Verify: every block first derives the walk from the parent array (in shared memory, all
// threads): subtree sizes, children visited smallest subtree first (ties by index), each
// node's depth-first rank, and which nodes save / restore which state slot. A branch node
// saves its state after its step while children remain; a child that does not follow its
// parent directly restores it. Saves nest like a stack, so slot = number of saves alive
// when the node saves, and smallest-first keeps that below floor(log2 n). Then the block
// walks the nodes in rank order with the running state in registers; saves go to shared
// memory (thread-private entries, no barrier) or, when too large, to the workspace.
// With normed set, the gated RMSNorm epilogue (gdn_norm_epilogue.cuh, arrivals zeroed by
// luce_gdn_tree_prepare) over the tree's rows of the head: normed is luce_gated_rmsnorm of out.
#include "gdn_common.cuh"
#include "gdn_norm_epilogue.cuh"

namespace {

#ifdef __HIPCC__
constexpr int64_t kOnChipSaveBytes = 32 << 10;   // RDNA: 64 KiB of LDS per workgroup
#else
constexpr int64_t kOnChipSaveBytes = 160 << 10;
#endif
constexpr int kScheduleArrays = 8;

int32_t max_saves_for(int32_t max_tree_rows) {
    int32_t s = 0;
    while ((2 << s) <= max_tree_rows) ++s;       // floor(log2(max_tree_rows))
    return s > 0 ? s : 1;
}

int64_t save_bytes_per_block(int32_t dk, int32_t max_tree_rows) {
    return (int64_t)max_saves_for(max_tree_rows) * dk * WARP_SIZE * (int64_t)sizeof(float);
}

__host__ __device__ inline int64_t schedule_bytes(int32_t max_tree_rows) {
    return ((int64_t)kScheduleArrays * max_tree_rows * (int64_t)sizeof(int32_t) + 15) / 16 * 16;
}

// Saves stay on chip up to kOnChipSaveBytes and what a block of this device may opt in to
// (sm_90: 227 KB; sm_86, sm_89, sm_120: 99 KB) beside the schedule and the kernel's static
// shared memory; beyond that they go to the workspace (the same bits: only where they live).
bool saves_on_chip(int32_t dk, int32_t max_tree_rows) {
    int64_t limit = kOnChipSaveBytes;
#ifndef __HIPCC__
    static int optin = -1;  // per process, as the device shape of matmul_prefill.cu
    if (optin < 0) {
        int device = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
            optin = 0;
    }
    const int64_t room = (int64_t)optin - schedule_bytes(max_tree_rows) - (int64_t)sizeof(GdnScratch) - 16;
    if (optin > 0 && room < limit) limit = room;
#endif
    return save_bytes_per_block(dk, max_tree_rows) <= limit;
}

// Shared arrays of the walk, each [n] int32.
struct TreeSchedule {
    int32_t *parent, *size, *nchild, *offset, *last, *order, *save, *restore;
};

__device__ TreeSchedule schedule_arrays(int32_t *base, int32_t cap) {
    return TreeSchedule{base, base + cap, base + 2 * cap, base + 3 * cap, base + 4 * cap,
                        base + 5 * cap, base + 6 * cap, base + 7 * cap};
}

// Builds the walk of the tree at rows r0..r0+n-1 (all threads call it; barriers inside).
// Returns false for a malformed parent array or a walk needing more than max_saves slots.
__device__ bool build_schedule(const int32_t *tree_parents, int64_t r0, int32_t n,
                               int32_t max_saves, TreeSchedule s, int32_t *bad) {
    const int tid = threadIdx.x;
    if (tid == 0) *bad = 0;
    __syncthreads();
    for (int i = tid; i < n; i += GDN_THREADS) {
        const int32_t pr = tree_parents[r0 + i];
        const int32_t lp = pr < 0 ? -1 : (int32_t)(pr - r0);
        if (i == 0 ? lp != -1 : (lp < 0 || lp >= i)) *bad = 1;
        s.parent[i] = lp;
        s.size[i] = 1;
        s.nchild[i] = 0;
    }
    __syncthreads();
    if (*bad) return false;
    for (int i = tid + 1; i < n; i += GDN_THREADS) {  // parents precede children: walks end at 0
        atomicAdd(&s.nchild[s.parent[i]], 1);
        for (int32_t a = s.parent[i]; a >= 0; a = s.parent[a]) atomicAdd(&s.size[a], 1);
    }
    __syncthreads();
    // offset: 1 + sizes of the siblings visited before i; last: i is its parent's last child.
    for (int i = tid; i < n; i += GDN_THREADS) {
        int32_t off = 1, last = 1;
        if (i > 0) {
            const int32_t p = s.parent[i], mine = s.size[i];
            for (int j = 1; j < n; ++j) {
                if (j == i || s.parent[j] != p) continue;
                const int32_t other = s.size[j];
                if (other < mine || (other == mine && j < i)) off += other;
                else last = 0;
            }
        }
        s.offset[i] = i > 0 ? off : 0;
        s.last[i] = last;
    }
    __syncthreads();
    for (int i = tid; i < n; i += GDN_THREADS) {
        int32_t rank = 0, alive = 0;  // alive: saved ancestors whose save outlives i's visit
        for (int32_t c = i; c > 0; c = s.parent[c]) {
            rank += s.offset[c];
            if (s.nchild[s.parent[c]] >= 2 && !s.last[c]) ++alive;
        }
        s.order[rank] = i;
        s.save[i] = s.nchild[i] >= 2 ? alive : -1;
        if (s.save[i] >= max_saves) *bad = 1;
        int32_t restore = -1;
        if (i > 0 && s.nchild[s.parent[i]] >= 2 && s.offset[i] != 1)
            restore = alive - (s.last[i] ? 0 : 1);  // the parent's slot
        s.restore[i] = restore;
    }
    __syncthreads();
    return *bad == 0;
}

template <int DK, bool NORM>
__global__ void __launch_bounds__(GDN_THREADS)
gdn_tree_verify_kernel(luce_gdn_tree_verify_params p, int32_t max_saves, int32_t on_chip) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    __shared__ GdnScratch scratch;
    __shared__ int32_t bad;
    extern __shared__ float4 dyn4[];
    const int seg = blockIdx.z, head = blockIdx.y;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t col = (int64_t)blockIdx.x * WARP_SIZE + lane;
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg];
    const int32_t n = (int32_t)(p.qo_indptr[seg + 1] - r0);
    if (slot < 0 || n <= 0) return;  // padding segment: nothing written
    const int64_t H = p.n_heads, dv = p.dv;

    int32_t *sched_base = reinterpret_cast<int32_t *>(dyn4);
    const TreeSchedule s = schedule_arrays(sched_base, p.max_tree_rows);
    bool ok = slot < p.n_slots && n <= p.max_tree_rows;
    float h[ROWS];
    if (ok) {
        const float *hp = p.state + ((slot * H + head) * DK + (int64_t)kgroup * ROWS) * dv + col;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) h[r] = hp[r * dv];
        ok = build_schedule(p.tree_parents, r0, n, max_saves, s, &bad);
    }
    if (!ok) {  // poison this tree's outputs and u, leave everything else alone
        if (kgroup == 0)
            for (int64_t t = r0; t < r0 + n; ++t) {
                p.out[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
                p.u_out[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
                if (NORM) p.normed[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
            }
        return;
    }
    if (blockIdx.x == 0) {  // factor copies that outlive the inputs
        for (int64_t i = threadIdx.x; i < (int64_t)n * DK; i += GDN_THREADS) {
            const int64_t idx = ((r0 + i / DK) * H + head) * DK + i % DK;
            if (p.k_out != nullptr) p.k_out[idx] = p.k[idx];
        }
        for (int i = threadIdx.x; i < n; i += GDN_THREADS) {
            const int64_t th = (r0 + i) * H + head;
            if (p.g_out != nullptr) p.g_out[th] = p.g[th];
            if (p.beta_out != nullptr) p.beta_out[th] = p.beta[th];
        }
    }

    const int64_t block = ((int64_t)seg * H + head) * gridDim.x + blockIdx.x;
    float *saves = on_chip ? reinterpret_cast<float *>(sched_base) + schedule_bytes(p.max_tree_rows) / 4
                           : p.workspace + block * max_saves * DK * WARP_SIZE;
    for (int32_t t = 0; t < n; ++t) {
        const int32_t node = s.order[t];
        const int32_t restore = s.restore[node];
        if (restore >= 0) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) h[r] = saves[((int64_t)restore * ROWS + r) * GDN_THREADS + threadIdx.x];
        }
        const int64_t th = (r0 + node) * H + head;
        float k[ROWS], q[ROWS];
        gdn_load_rows<ROWS>(p.k + th * DK + kgroup * ROWS, k);
        gdn_load_rows<ROWS>(p.q + th * DK + kgroup * ROWS, q);
        const float v = p.v[th * dv + col];
        const float decay = expf(p.g[th]);
        float u;
        const float o = gdn_step<ROWS>(h, k, q, v, decay, p.beta[th], scratch, &u);
        if (kgroup == 0) {
            p.out[th * dv + col] = o;
            p.u_out[th * dv + col] = u;
        }
        const int32_t save = s.save[node];
        if (save >= 0) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) saves[((int64_t)save * ROWS + r) * GDN_THREADS + threadIdx.x] = h[r];
        }
    }
    if constexpr (NORM) {
        const GdnNormEpilogue e = {p.z, p.z_stride, p.norm_weight, p.normed, p.arrivals, p.rms_eps, {}, nullptr};
        gdn_norm_epilogue(e, p.out, seg, r0, r0 + n, H, head, dv);
    }
}

template <int DK>
__global__ void __launch_bounds__(GDN_THREADS) gdn_tree_commit_kernel(luce_gdn_tree_commit_params p) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    const int seg = blockIdx.z, head = blockIdx.y;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t col = (int64_t)blockIdx.x * WARP_SIZE + lane;
    const int64_t slot = p.seq_slots[seg];
    const int64_t i0 = p.path_indptr[seg], i1 = p.path_indptr[seg + 1];
    if (slot < 0 || slot >= p.n_slots || i1 <= i0) return;
    const int64_t H = p.n_heads, dv = p.dv;
    float *hp = p.state + ((slot * H + head) * DK + (int64_t)kgroup * ROWS) * dv + col;
    float h[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) h[r] = hp[r * dv];
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t th = (int64_t)p.path_rows[i] * H + head;
        float k[ROWS];
        gdn_load_rows<ROWS>(p.k + th * DK + kgroup * ROWS, k);
        gdn_replay<ROWS>(h, k, expf(p.g[th]), p.u[th * dv + col]);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) hp[r * dv] = h[r];
}

template <int DK>
__global__ void __launch_bounds__(GDN_THREADS) gdn_tree_states_kernel(luce_gdn_tree_states_params p) {
    constexpr int ROWS = DK / GDN_KGROUPS;
    __shared__ GdnScratch scratch;
    const int seg = blockIdx.z, head = blockIdx.y;
    const int lane = threadIdx.x % WARP_SIZE, kgroup = threadIdx.x / WARP_SIZE;
    const int64_t col = (int64_t)blockIdx.x * WARP_SIZE + lane;
    const int64_t slot = p.seq_slots[seg];
    const int64_t r0 = p.qo_indptr[seg];
    const int32_t n = (int32_t)(p.qo_indptr[seg + 1] - r0);
    if (slot < 0 || n <= 0) return;  // padding segment: nothing written
    const int64_t H = p.n_heads, dv = p.dv;
    bool ok = slot < p.n_slots;      // every thread reads the same parents: a uniform decision
    for (int32_t i = 0; i < n && ok; ++i) {
        const int32_t pr = p.tree_parents[r0 + i];
        const int64_t lp = pr < 0 ? -1 : (int64_t)pr - r0;
        ok = i == 0 ? lp == -1 : (lp >= 0 && lp < i);
    }
    if (!ok) {
        if (kgroup == 0)
            for (int64_t t = r0; t < r0 + n; ++t) p.out[(t * H + head) * dv + col] = __int_as_float(0x7fc00000);
        return;
    }
    const int64_t row_off = (int64_t)kgroup * ROWS;
    float h[ROWS];
    for (int32_t i = 0; i < n; ++i) {
        const int64_t t = r0 + i;
        const int32_t pr = p.tree_parents[t];
        // a thread reads back only the entries it wrote for the parent: program order suffices
        const float *hp = pr < 0 ? p.state + ((slot * H + head) * DK + row_off) * dv + col
                                 : p.node_states + (((int64_t)pr * H + head) * DK + row_off) * dv + col;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) h[r] = hp[r * dv];
        const int64_t th = t * H + head;
        float k[ROWS], q[ROWS];
        gdn_load_rows<ROWS>(p.k + th * DK + row_off, k);
        gdn_load_rows<ROWS>(p.q + th * DK + row_off, q);
        float u;
        const float o = gdn_step<ROWS>(h, k, q, p.v[th * dv + col], expf(p.g[th]), p.beta[th], scratch, &u);
        if (kgroup == 0) p.out[th * dv + col] = o;
        float *sp = p.node_states + ((t * H + head) * DK + row_off) * dv + col;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) sp[r * dv] = h[r];
    }
}

template <int DK>
int launch_states(const luce_gdn_tree_states_params &p, cudaStream_t stream) {
    const dim3 grid((unsigned)(p.dv / WARP_SIZE), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_tree_states_kernel<DK><<<grid, GDN_THREADS, 0, stream>>>(p);
    return luce_status(cudaGetLastError());
}

template <int DK, bool NORM>
int launch_verify_form(const luce_gdn_tree_verify_params &p, cudaStream_t stream) {
    const bool on_chip = saves_on_chip(DK, p.max_tree_rows);
    const int64_t smem = schedule_bytes(p.max_tree_rows) + (on_chip ? save_bytes_per_block(DK, p.max_tree_rows) : 0);
    static int64_t attribute_bytes = 48 << 10;  // raised once per size, before capture reaches it
    if (smem > attribute_bytes) {
        const cudaError_t err = cudaFuncSetAttribute(gdn_tree_verify_kernel<DK, NORM>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return luce_status(err);
        attribute_bytes = smem;
    }
    const dim3 grid((unsigned)(p.dv / WARP_SIZE), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_tree_verify_kernel<DK, NORM><<<grid, GDN_THREADS, (size_t)smem, stream>>>(
        p, max_saves_for(p.max_tree_rows), on_chip ? 1 : 0);
    return luce_status(cudaGetLastError());
}

template <int DK>
int launch_verify(const luce_gdn_tree_verify_params &p, cudaStream_t stream) {
    return p.normed != nullptr ? launch_verify_form<DK, true>(p, stream) : launch_verify_form<DK, false>(p, stream);
}

template <int DK>
int launch_commit(const luce_gdn_tree_commit_params &p, cudaStream_t stream) {
    const dim3 grid((unsigned)(p.dv / WARP_SIZE), (unsigned)p.n_heads, (unsigned)p.n_segments);
    gdn_tree_commit_kernel<DK><<<grid, GDN_THREADS, 0, stream>>>(p);
    return luce_status(cudaGetLastError());
}

}  // namespace

extern "C" int64_t luce_gdn_tree_verify_workspace_bytes(int32_t n_segments, int32_t n_heads, int32_t dk,
                                                        int32_t dv, int32_t max_tree_rows) {
    if (gdn_bad_sizes(n_segments, n_heads, dk, dv) || max_tree_rows < 1 || max_tree_rows > LUCE_GDN_TREE_MAX_ROWS)
        return -1;
    if (saves_on_chip(dk, max_tree_rows)) return 0;
    return (int64_t)n_segments * n_heads * (dv / WARP_SIZE) * save_bytes_per_block(dk, max_tree_rows);
}

extern "C" int luce_gdn_tree_verify(const luce_gdn_tree_verify_params *p, void *stream) {
    if (p->n_segments == 0) return 0;
    const int64_t need = luce_gdn_tree_verify_workspace_bytes(p->n_segments, p->n_heads, p->dk, p->dv,
                                                              p->max_tree_rows);
    if (need < 0 || p->n_slots < 0 || (need > 0 && (p->workspace == nullptr || p->workspace_bytes < need)) ||
        ((uintptr_t)p->q | (uintptr_t)p->k) % 16 != 0 || p->out == nullptr || p->u_out == nullptr ||
        (p->normed != nullptr && (p->z == nullptr || p->norm_weight == nullptr || p->arrivals == nullptr ||
                                  p->z_stride < (int64_t)p->n_heads * p->dv)))
        return (int)cudaErrorInvalidValue;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (p->dk) {
        case 64: return launch_verify<64>(*p, s);
        case 128: return launch_verify<128>(*p, s);
        default: return launch_verify<256>(*p, s);
    }
}

extern "C" int luce_gdn_tree_verify_states(const luce_gdn_tree_states_params *p, void *stream) {
    if (p->n_segments == 0) return 0;
    if (gdn_bad_sizes(p->n_segments, p->n_heads, p->dk, p->dv) || p->n_slots < 0 || p->out == nullptr ||
        p->node_states == nullptr || ((uintptr_t)p->q | (uintptr_t)p->k) % 16 != 0)
        return (int)cudaErrorInvalidValue;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (p->dk) {
        case 64: return launch_states<64>(*p, s);
        case 128: return launch_states<128>(*p, s);
        default: return launch_states<256>(*p, s);
    }
}

extern "C" int luce_gdn_tree_commit(const luce_gdn_tree_commit_params *p, void *stream) {
    if (p->n_segments == 0) return 0;
    if (gdn_bad_sizes(p->n_segments, p->n_heads, p->dk, p->dv) || p->n_slots < 0 || (uintptr_t)p->k % 16 != 0)
        return (int)cudaErrorInvalidValue;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (p->dk) {
        case 64: return launch_commit<64>(*p, s);
        case 128: return launch_commit<128>(*p, s);
        default: return launch_commit<256>(*p, s);
    }
}
