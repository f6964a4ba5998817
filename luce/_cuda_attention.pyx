# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for paged GQA attention (cuda/attention.cu; ABI in cuda/luce_ops.h).

Wrappers take raw device addresses (uintptr_t) and sizes, fill luce_attention_params, call
the entry point with the GIL released and raise luce._cuda.KernelError on a non-zero status.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"
include "_cuda_rope_kv.pxi"


cdef extern from "luce_ops.h":
    enum: LUCE_ATTN_PARTITION
    ctypedef struct luce_attention_params:
        const float *q
        const float *k_pages
        const float *v_pages
        float *out
        float *workspace
        const int32_t *qo_indptr
        const int32_t *kv_indptr
        const int32_t *kv_indices
        const int32_t *kv_last_page_len
        const int32_t *seq_slots
        const int32_t *tree_parents
        int64_t workspace_bytes
        int32_t n_rows
        int32_t n_segments
        int32_t n_heads_q
        int32_t n_heads_kv
        int32_t head_dim
        int32_t page_size
        int32_t max_kv_len
        int32_t causal
        float scale
        int32_t prompt_rows
        int32_t *counters
        int64_t n_counters
        int64_t n_kv_indices


ctypedef int (*attention_fn)(const luce_attention_params *, void *) noexcept nogil
ctypedef int (*rope_attention_fn)(const luce_rope_kv_params *, const luce_attention_params *, void *) noexcept nogil
ctypedef int64_t (*workspace_fn)(int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int64_t) noexcept nogil

PARTITION = LUCE_ATTN_PARTITION  # keys per partition, at absolute KV indices
SUPPORTS_TREE_PARENTS = True     # attention() takes tree_parents (tree rows, DESIGN 3 and 7)

cdef attention_fn _attention = NULL
cdef workspace_fn _workspace_bytes = NULL
cdef rope_attention_fn _rope_kv_attention = NULL


def load(str path):
    """Resolve the attention entry points in the kernel library at `path`."""
    global _attention, _workspace_bytes, _rope_kv_attention
    cdef void *lib = _open_library(path)
    _rope_kv_attention = <rope_attention_fn>_symbol(lib, path, "luce_rope_kv_attention")
    _workspace_bytes = <workspace_fn>_symbol(lib, path, "luce_attention_workspace_bytes")
    _attention = <attention_fn>_symbol(lib, path, "luce_attention")


def workspace_bytes(int32_t n_rows, int32_t n_heads_q, int32_t head_dim, int32_t max_kv_len,
                    int32_t prompt_rows=0, int32_t n_heads_kv=0, int32_t page_size=0, int64_t n_kv_indices=0):
    """Bytes of workspace `attention` needs for these sizes with rows 0..prompt_rows-1 prompt
    rows: they take (D + 2) floats a head per 1,024-key split where the prompt-row kernel fits
    the device, the other rows per chunk (at most max(16, ceil(max_kv_len / LUCE_ATTN_PARTITION));
    luce.ref.attention.chunk_grid) (prompt_rows = 0: the most any
    launch of these sizes needs without staging); with n_kv_indices (entries of kv_indices, > 0) also the
    prompt segments' keys as f16 (4 * n_kv_indices * page_size * Hkv * D bytes) where the f16
    prompt kernel's staged form runs. attention() must get the same n_kv_indices."""
    _require_loaded(<void *>_attention)
    cdef int64_t n = _workspace_bytes(n_rows, prompt_rows, n_heads_q, head_dim, max_kv_len, n_heads_kv, page_size,
                                      n_kv_indices)
    if n < 0:
        raise ValueError(f"attention workspace: negative size argument or prompt_rows outside [0, n_rows] "
                         f"({n_rows}, {n_heads_q}, {head_dim}, {max_kv_len}, prompt_rows={prompt_rows}, "
                         f"n_heads_kv={n_heads_kv}, page_size={page_size}, n_kv_indices={n_kv_indices})")
    return n


def attention(uintptr_t q, uintptr_t k_pages, uintptr_t v_pages, uintptr_t out,
              uintptr_t workspace, int64_t workspace_bytes,
              uintptr_t qo_indptr, uintptr_t kv_indptr, uintptr_t kv_indices,
              uintptr_t kv_last_page_len, uintptr_t seq_slots,
              int32_t n_rows, int32_t n_segments, int32_t n_heads_q, int32_t n_heads_kv,
              int32_t head_dim, int32_t page_size, int32_t max_kv_len, float scale,
              bint causal=True, uintptr_t stream=0, uintptr_t tree_parents=0, int32_t prompt_rows=0,
              uintptr_t counters=0, int64_t n_counters=0, int64_t n_kv_indices=0, rope=None):
    """q, out [n_rows, Hq, D] f32; k_pages, v_pages [n_pages, page_size, Hkv, D] f32; CSR
    int32 arrays as luce/models/batch.py (device addresses). max_kv_len bounds every row's
    key count; workspace holds workspace_bytes(n_rows, Hq, D, max_kv_len, prompt_rows, Hkv,
    page_size, n_kv_indices) bytes.
    tree_parents: device address of [n_rows] int32 global parent rows (-1: root or ordinary
    row; 0: no trees); tree rows attend the committed prefix plus their root path.
    prompt_rows: rows 0..prompt_rows-1 (no tree rows among them) take the prompt-row kernel
    (f16 tensor cores, luce/ref/attention_prefill.py); a prompt row's bits depend only on
    the row, never on prompt_rows or the other rows.
    n_kv_indices: entries of kv_indices (0: the prompt kernel reads the f32 pages in every
    tile, the same bits; > 0: it first stages the prompt segments' keys as f16).
    counters: device address of [n_counters] int32, all zero (the launch leaves them zero):
    without prompt rows, the last partition block of a row's heads merges the partitions
    (no combine launch) where n_rows * Hkv * head groups <= n_counters. The same bits.
    rope: None, or the attention input of a decode launch fused in (luce_rope_kv_attention;
    q is then not read): (q, k, v, q_norm, k_norm, kv_dst, positions, q_stride, k_stride,
    v_stride, rope_dim, theta, sections, eps), luce._cuda_fused.rope_kv's arguments of the
    same name (rows, heads and head_dim are this launch's; n_pos 1: no M-RoPE). Only where every live segment is
    one AR row (no prompt rows, no tree_parents, causal, head_dim 64 or 128): the bits of
    rope_kv (its q_out as q) then attention, one launch fewer."""
    _require_loaded(<void *>_attention)
    cdef luce_attention_params p
    p.q = <const float *>q
    p.k_pages = <const float *>k_pages
    p.v_pages = <const float *>v_pages
    p.out = <float *>out
    p.workspace = <float *>workspace
    p.qo_indptr = <const int32_t *>qo_indptr
    p.kv_indptr = <const int32_t *>kv_indptr
    p.kv_indices = <const int32_t *>kv_indices
    p.kv_last_page_len = <const int32_t *>kv_last_page_len
    p.seq_slots = <const int32_t *>seq_slots
    p.tree_parents = <const int32_t *>tree_parents
    p.workspace_bytes = workspace_bytes
    p.n_rows = n_rows
    p.n_segments = n_segments
    p.n_heads_q = n_heads_q
    p.n_heads_kv = n_heads_kv
    p.head_dim = head_dim
    p.page_size = page_size
    p.max_kv_len = max_kv_len
    p.causal = 1 if causal else 0
    p.scale = scale
    p.prompt_rows = prompt_rows
    p.counters = <int32_t *>counters
    p.n_counters = n_counters
    p.n_kv_indices = n_kv_indices
    cdef int status
    cdef luce_rope_kv_params r
    if rope is None:
        with nogil:
            status = _attention(&p, <void *>stream)
        raise_for_status(status, "luce_attention")
        return
    rq, rk, rv, q_norm, k_norm, kv_dst, positions, q_stride, k_stride, v_stride, rope_dim, theta, sections, eps = \
        rope
    _fill_rope_kv(&r, rq, rk, rv, q_norm, k_norm, 0, k_pages, v_pages, kv_dst, positions, n_rows, q_stride,
                  k_stride, v_stride, n_heads_q, n_heads_kv, head_dim, rope_dim, theta, sections, 1, eps)
    with nogil:
        status = _rope_kv_attention(&r, &p, <void *>stream)
    raise_for_status(status, "luce_rope_kv_attention")
