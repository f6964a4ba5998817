# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for embedding rows of a quantized table (cuda/embedding.cu; ABI in
cuda/luce_ops.h). Raw device addresses in, luce._cuda.KernelError out."""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_embedding_params:
        const void *table
        const int32_t *token_ids
        float *out
        int64_t n_rows
        int64_t cols
        int64_t row_bytes
        int64_t n_tokens
        int64_t out_stride
        int32_t qtype


ctypedef int (*embedding_fn)(const luce_embedding_params *, void *) noexcept nogil
ctypedef int64_t (*row_bytes_fn)(int32_t, int64_t) noexcept nogil

cdef embedding_fn _embedding = NULL
cdef row_bytes_fn _row_bytes = NULL

MAX_TOKENS = 65535


def load(str path):
    """Resolve luce_embedding and luce_embedding_row_bytes in the kernel library at `path`."""
    global _embedding, _row_bytes
    cdef void *lib = _open_library(path)
    _row_bytes = <row_bytes_fn>_symbol(lib, path, "luce_embedding_row_bytes")
    _embedding = <embedding_fn>_symbol(lib, path, "luce_embedding")


def row_bytes(int32_t qtype, int64_t cols):
    """Bytes of one table row of cols values of ggml type qtype; -1 if unsupported."""
    _require_loaded(<void *>_embedding)
    return _row_bytes(qtype, cols)


def embedding(uintptr_t table, uintptr_t token_ids, uintptr_t out, int64_t n_rows, int64_t cols,
              int64_t row_bytes, int64_t n_tokens, int32_t qtype, out_stride=None,
              uintptr_t stream=0):
    """table [n_rows, row_bytes] u8 GGUF blocks, token_ids [n_tokens] int32, out
    [n_tokens, cols] f32 (row stride out_stride, default cols) -> decoded rows."""
    _require_loaded(<void *>_embedding)
    cdef luce_embedding_params p
    p.table = <const void *>table
    p.token_ids = <const int32_t *>token_ids
    p.out = <float *>out
    p.n_rows = n_rows
    p.cols = cols
    p.row_bytes = row_bytes
    p.n_tokens = n_tokens
    p.out_stride = cols if out_stride is None else out_stride
    p.qtype = qtype
    cdef int status
    with nogil:
        status = _embedding(&p, <void *>stream)
    raise_for_status(status, "luce_embedding")
