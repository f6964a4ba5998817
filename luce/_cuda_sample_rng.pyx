# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for seeded sampling of logits rows (cuda/sample_rng.cu, cuda/luce_ops.h).
Raw device addresses in, KernelError out. A row holding NaN gets id -1."""
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    int LUCE_SAMPLE_TOPK_MAX

    ctypedef struct luce_sample_rng_params:
        const float *logits
        const double *temperature
        const int32_t *top_k
        const double *top_p
        const double *min_p
        const uint64_t *seed
        const int64_t *position
        int64_t *ids_out
        void *workspace
        int64_t workspace_bytes
        int64_t rows
        int64_t vocab
        int64_t logits_stride


ctypedef int (*sample_fn)(const luce_sample_rng_params *, void *) noexcept nogil
ctypedef int64_t (*workspace_fn)(int64_t, int64_t) noexcept nogil

cdef sample_fn _sample = NULL
cdef workspace_fn _workspace = NULL

TOPK_MAX = LUCE_SAMPLE_TOPK_MAX


def load(str path):
    """Resolve luce_sample_rng and its workspace size in the kernel library at `path`."""
    global _sample, _workspace
    cdef void *lib = _open_library(path)
    _workspace = <workspace_fn>_symbol(lib, path, "luce_sample_rng_workspace_bytes")
    _sample = <sample_fn>_symbol(lib, path, "luce_sample_rng")


def workspace_bytes(int64_t rows, int64_t vocab):
    _require_loaded(<void *>_sample)
    return _workspace(rows, vocab)


def sample_rng(uintptr_t logits, uintptr_t temperature, uintptr_t top_k, uintptr_t top_p, uintptr_t min_p,
               uintptr_t seed, uintptr_t position, uintptr_t ids_out, uintptr_t workspace,
               int64_t workspace_bytes, int64_t rows, int64_t vocab, logits_stride=None, uintptr_t stream=0):
    """logits [rows, vocab] f32; temperature, top_p, min_p [rows] f64; top_k [rows] int32;
    seed [rows] uint64; position [rows] int64 -> ids_out [rows] int64 (device addresses)."""
    _require_loaded(<void *>_sample)
    cdef luce_sample_rng_params p
    p.logits = <const float *>logits
    p.temperature = <const double *>temperature
    p.top_k = <const int32_t *>top_k
    p.top_p = <const double *>top_p
    p.min_p = <const double *>min_p
    p.seed = <const uint64_t *>seed
    p.position = <const int64_t *>position
    p.ids_out = <int64_t *>ids_out
    p.workspace = <void *>workspace
    p.workspace_bytes = workspace_bytes
    p.rows = rows
    p.vocab = vocab
    p.logits_stride = vocab if logits_stride is None else logits_stride
    cdef int status
    with nogil:
        status = _sample(&p, <void *>stream)
    raise_for_status(status, "luce_sample_rng")
