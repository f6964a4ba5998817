# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for greedy argmax and top-k log-probs (cuda/sampling.cu, cuda/luce_ops.h).
Raw device addresses in, KernelError out. A row holding NaN gets id -1."""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    int LUCE_TOPK_MAX

    ctypedef struct luce_sampling_params:
        const float *logits
        int64_t *ids_out
        float *logprobs_out
        int64_t rows
        int64_t vocab
        int64_t logits_stride
        int32_t k
        void *workspace
        int64_t workspace_bytes


ctypedef int (*sampling_fn)(const luce_sampling_params *, void *) noexcept nogil
ctypedef int64_t (*workspace_fn)(int64_t, int64_t, int32_t) noexcept nogil

cdef sampling_fn _argmax = NULL
cdef sampling_fn _top_k = NULL
cdef workspace_fn _workspace = NULL

TOPK_MAX = LUCE_TOPK_MAX


def load(str path):
    """Resolve luce_argmax, luce_top_k_logprobs and its workspace size in the kernel library at `path`."""
    global _argmax, _top_k, _workspace
    cdef void *lib = _open_library(path)
    _top_k = <sampling_fn>_symbol(lib, path, "luce_top_k_logprobs")
    _workspace = <workspace_fn>_symbol(lib, path, "luce_top_k_logprobs_workspace_bytes")
    _argmax = <sampling_fn>_symbol(lib, path, "luce_argmax")


def argmax(uintptr_t logits, uintptr_t ids_out, int64_t rows, int64_t vocab,
           logits_stride=None, uintptr_t stream=0):
    """logits [rows, vocab] f32 -> ids_out [rows] int64 (lowest id on ties; -1 on NaN rows)."""
    _require_loaded(<void *>_argmax)
    cdef luce_sampling_params p
    p.logits = <const float *>logits
    p.ids_out = <int64_t *>ids_out
    p.logprobs_out = NULL
    p.rows = rows
    p.vocab = vocab
    p.logits_stride = vocab if logits_stride is None else logits_stride
    p.k = 1
    p.workspace = NULL
    p.workspace_bytes = 0
    cdef int status
    with nogil:
        status = _argmax(&p, <void *>stream)
    raise_for_status(status, "luce_argmax")


def workspace_bytes(int64_t rows, int64_t vocab, int k):
    """Bytes of the workspace top_k_logprobs needs for rows of vocab logits and k."""
    _require_loaded(<void *>_workspace)
    return _workspace(rows, vocab, k)


def top_k_logprobs(uintptr_t logits, uintptr_t ids_out, uintptr_t logprobs_out, uintptr_t workspace,
                   int64_t workspace_bytes, int64_t rows, int64_t vocab, int k, logits_stride=None,
                   uintptr_t stream=0):
    """logits [rows, vocab] f32 -> ids_out [rows, k] int64, logprobs_out [rows, k] f32,
    best first (ties to the lowest id); 1 <= k <= TOPK_MAX; workspace: workspace_bytes(rows,
    vocab, k) bytes of device memory."""
    _require_loaded(<void *>_top_k)
    cdef luce_sampling_params p
    p.logits = <const float *>logits
    p.ids_out = <int64_t *>ids_out
    p.logprobs_out = <float *>logprobs_out
    p.rows = rows
    p.vocab = vocab
    p.logits_stride = vocab if logits_stride is None else logits_stride
    p.k = k
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    cdef int status
    with nogil:
        status = _top_k(&p, <void *>stream)
    raise_for_status(status, "luce_top_k_logprobs")
