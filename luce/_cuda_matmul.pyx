# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the quantized matmul (cuda/matmul.cu; ABI in cuda/luce_ops.h).

y [rows, n] f32 = x [rows, k] f32 @ W^T (+ bias [n]), W [n, k] GGUF blocks of ggml type
`qtype` (QTYPES). Wrappers take raw device addresses (uintptr_t) and sizes, fill the params
struct, call the entry point with the GIL released and raise luce._cuda.KernelError on a
non-zero status. Block types need a workspace of workspace_bytes(rows, k) bytes.
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_matmul_params:
        const float *x
        const void *w
        const float *bias
        float *y
        void *workspace
        int64_t workspace_bytes
        int64_t rows
        int64_t n
        int64_t k
        int32_t qtype
        int32_t path
        int32_t flags
        int32_t tune


ctypedef int (*matmul_fn)(const luce_matmul_params *, void *) noexcept nogil
ctypedef int (*matmul_pair_fn)(const luce_matmul_params *, const luce_matmul_params *, void *) noexcept nogil
ctypedef int64_t (*workspace_fn)(int64_t, int64_t) noexcept nogil
ctypedef int64_t (*row_bytes_fn)(int32_t, int64_t) noexcept nogil
ctypedef int (*split_k_fn)(int32_t, int64_t, int64_t) noexcept nogil

cdef matmul_fn _matmul = NULL
cdef matmul_fn _matmul_prefill = NULL
cdef matmul_pair_fn _matmul_pair = NULL
cdef workspace_fn _prefill_workspace_bytes = NULL
cdef workspace_fn _workspace_bytes = NULL
cdef row_bytes_fn _row_bytes = NULL
cdef split_k_fn _prefill_split_k = NULL

# ggml type ids the kernel multiplies (LUCE_QT_* in cuda/luce_ops.h).
QTYPES = {"F32": 0, "F16": 1, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
          "IQ4_XS": 23, "BF16": 30}
FLOAT_QTYPES = (0, 1, 30)
PATH_DECODE = 0
PATH_PREFILL = 1
REUSE_X = 1
X_ONCE = 2   # no later call reuses this call's quantized x: one-row calls quantize it in lane (LUCE_MATMUL_X_ONCE)
PAIR_QTYPES = ((12, 14), (13, 14))   # (a, b) luce_matmul_pair may run as one launch: Q4_K or Q5_K, then Q6_K


def load(str path):
    """Resolve the matmul entry points in the kernel library at `path`."""
    global _matmul, _workspace_bytes, _row_bytes, _matmul_prefill, _prefill_workspace_bytes, _matmul_pair
    global _prefill_split_k
    cdef void *lib = _open_library(path)
    _matmul_pair = <matmul_pair_fn>_symbol(lib, path, "luce_matmul_pair")
    _workspace_bytes = <workspace_fn>_symbol(lib, path, "luce_matmul_workspace_bytes")
    _row_bytes = <row_bytes_fn>_symbol(lib, path, "luce_matmul_row_bytes")
    _matmul = <matmul_fn>_symbol(lib, path, "luce_matmul")
    _prefill_workspace_bytes = <workspace_fn>_symbol(lib, path, "luce_matmul_prefill_workspace_bytes")
    _matmul_prefill = <matmul_fn>_symbol(lib, path, "luce_matmul_prefill")
    _prefill_split_k = <split_k_fn>_symbol(lib, path, "luce_matmul_prefill_split_k")


def workspace_bytes(int64_t rows, int64_t k):
    """Bytes of workspace a block-type matmul of `rows` rows of length k needs."""
    _require_loaded(<void *>_matmul)
    return _workspace_bytes(rows, k)


def row_bytes(int32_t qtype, int64_t k):
    """Bytes of one weight row of k values of `qtype`; ValueError if unsupported or ragged."""
    _require_loaded(<void *>_matmul)
    cdef int64_t nb = _row_bytes(qtype, k)
    if nb < 0:
        raise ValueError(f"matmul: ggml type {qtype} with k={k} is not supported (types "
                         f"{sorted(QTYPES)}; k must be whole blocks: 256 values for K-quants "
                         f"and IQ4_XS, 32 for Q8_0/Q5_0)")
    return nb


def prefill_workspace_bytes(int64_t rows, int64_t k):
    """Bytes of workspace matmul_prefill of `rows` rows of length k needs."""
    _require_loaded(<void *>_matmul_prefill)
    return _prefill_workspace_bytes(rows, k)


def prefill_split_k(int32_t qtype, int64_t n, int64_t k):
    """The k parts matmul_prefill's tune 81 runs for an [n, k] matrix of `qtype` on this device: 1
    where it does not split (the int8 GEMM, no sm_90a code for the device, no such clusters)."""
    _require_loaded(<void *>_matmul_prefill)
    cdef int z = _prefill_split_k(qtype, n, k)
    if z <= 0:
        raise ValueError(f"prefill_split_k: ggml type {qtype} with k={k}, n={n} is not a block matrix")
    return z


cdef void _fill(luce_matmul_params *p, uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t y, uintptr_t workspace,
                int64_t workspace_bytes, int64_t rows, int64_t n, int64_t k, int32_t qtype, int32_t path,
                int32_t flags, int32_t tune) noexcept:
    p.x = <const float *>x
    p.w = <const void *>w
    p.bias = <const float *>bias
    p.y = <float *>y
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    p.rows = rows
    p.n = n
    p.k = k
    p.qtype = qtype
    p.path = path
    p.flags = flags
    p.tune = tune


def matmul_pair(uintptr_t x, uintptr_t w_a, uintptr_t bias_a, uintptr_t y_a, int64_t n_a, int32_t qtype_a,
                uintptr_t w_b, uintptr_t bias_b, uintptr_t y_b, int64_t n_b, int32_t qtype_b, uintptr_t workspace,
                int64_t workspace_bytes, int64_t rows, int64_t k, int32_t flags_a=0, uintptr_t stream=0):
    """matmul of weight a (flags_a), then of weight b on the same x (REUSE_X: a's workspace), as
    luce_matmul_pair: one launch where both take the one-row kernel (PAIR_QTYPES), the same bits."""
    _require_loaded(<void *>_matmul_pair)
    cdef luce_matmul_params a, b
    _fill(&a, x, w_a, bias_a, y_a, workspace, workspace_bytes, rows, n_a, k, qtype_a, PATH_DECODE, flags_a, 0)
    _fill(&b, x, w_b, bias_b, y_b, workspace, workspace_bytes, rows, n_b, k, qtype_b, PATH_DECODE, REUSE_X, 0)
    cdef int status
    with nogil:
        status = _matmul_pair(&a, &b, <void *>stream)
    raise_for_status(status, "luce_matmul_pair")


cdef int _launch(matmul_fn fn, uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t y, uintptr_t workspace,
                 int64_t workspace_bytes, int64_t rows, int64_t n, int64_t k, int32_t qtype, int32_t path,
                 int32_t flags, int32_t tune, uintptr_t stream) noexcept:
    """fn (luce_matmul or luce_matmul_prefill) on these params, the GIL released; its status."""
    cdef luce_matmul_params p
    _fill(&p, x, w, bias, y, workspace, workspace_bytes, rows, n, k, qtype, path, flags, tune)
    cdef int status
    with nogil:
        status = fn(&p, <void *>stream)
    return status


def matmul(uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t y, uintptr_t workspace,
           int64_t workspace_bytes, int64_t rows, int64_t n, int64_t k, int32_t qtype,
           int32_t path=0, int32_t flags=0, int32_t tune=0, uintptr_t stream=0):
    """x [rows, k] f32, w [n, row_bytes(qtype, k)] u8, bias [n] f32 or 0, y [rows, n] f32,
    workspace (block types) of workspace_bytes (device addresses; x, workspace 16-byte
    aligned). path PATH_DECODE or PATH_PREFILL, flags REUSE_X | X_ONCE, tune 0..10 (cuda/luce_ops_weights.h): kernel
    and launch shape only, the result is bitwise the same for any of them."""
    _require_loaded(<void *>_matmul)
    raise_for_status(_launch(_matmul, x, w, bias, y, workspace, workspace_bytes, rows, n, k, qtype, path, flags,
                             tune, stream), "luce_matmul")


def matmul_prefill(uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t y, uintptr_t workspace,
                   int64_t workspace_bytes, int64_t rows, int64_t n, int64_t k, int32_t qtype,
                   int32_t flags=0, uintptr_t stream=0, int32_t tune=0):
    """Prompt rows (cuda/matmul_prefill.cu): as matmul for block types, x quantized to 8 bits
    per 32 values (luce/ref/matmul_prefill.py); workspace of prefill_workspace_bytes(rows, k).
    tune 0: the block shape by device and size; 2, 4, 8: warps per block (the same bits)."""
    _require_loaded(<void *>_matmul_prefill)
    if qtype in FLOAT_QTYPES:
        raise ValueError(f"matmul_prefill: ggml type {qtype} is a float type; use matmul")
    raise_for_status(_launch(_matmul_prefill, x, w, bias, y, workspace, workspace_bytes, rows, n, k, qtype,
                             PATH_PREFILL, flags, tune, stream), "luce_matmul_prefill")
