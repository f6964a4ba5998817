# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer for the ids carried between forward calls (cuda/step_ids.cu, cuda/luce_ops.h).
Raw device addresses in, KernelError out."""
from libc.stdint cimport int32_t, int64_t, uintptr_t

from luce._cuda import raise_for_status

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_step_ids_params:
        const int64_t *ids
        const int64_t *logits_indices
        const int32_t *qo_indptr
        const int32_t *slots
        int32_t *last_ids
        int32_t *token_ids
        int32_t n_logits
        int32_t n_segments
        int32_t vocab


ctypedef int (*step_ids_fn)(const luce_step_ids_params *, void *) noexcept nogil

cdef step_ids_fn _keep = NULL
cdef step_ids_fn _feed = NULL


def load(str path):
    """Resolve luce_keep_ids and luce_feed_ids in the kernel library at `path`."""
    global _keep, _feed
    cdef void *lib = _open_library(path)
    _keep = <step_ids_fn>_symbol(lib, path, "luce_keep_ids")
    _feed = <step_ids_fn>_symbol(lib, path, "luce_feed_ids")


def keep_ids(uintptr_t ids, uintptr_t logits_indices, uintptr_t qo_indptr, uintptr_t slots,
             uintptr_t last_ids, int32_t n_logits, int32_t n_segments, uintptr_t stream=0):
    """ids [n_logits] int64 (of the rows logits_indices [n_logits] int64) -> last_ids[slot]
    (int32): the id of the last row of each segment with a slot (slots [n_segments] int32, -1:
    none; the AR segments' ar_slots, or seq_slots)."""
    _require_loaded(<void *>_keep)
    cdef luce_step_ids_params p
    p.ids = <const int64_t *>ids
    p.logits_indices = <const int64_t *>logits_indices
    p.qo_indptr = <const int32_t *>qo_indptr
    p.slots = <const int32_t *>slots
    p.last_ids = <int32_t *>last_ids
    p.token_ids = NULL
    p.n_logits = n_logits
    p.n_segments = n_segments
    p.vocab = 1
    cdef int status
    with nogil:
        status = _keep(&p, <void *>stream)
    raise_for_status(status, "luce_keep_ids")


def feed_ids(uintptr_t token_ids, uintptr_t qo_indptr, uintptr_t ar_slots, uintptr_t last_ids,
             int32_t n_segments, int32_t vocab, uintptr_t stream=0):
    """token_ids [T] int32: each AR segment's row <- last_ids[slot] (0 outside [0, vocab))."""
    _require_loaded(<void *>_feed)
    cdef luce_step_ids_params p
    p.ids = NULL
    p.logits_indices = NULL
    p.qo_indptr = <const int32_t *>qo_indptr
    p.slots = <const int32_t *>ar_slots
    p.last_ids = <int32_t *>last_ids
    p.token_ids = <int32_t *>token_ids
    p.n_logits = 0
    p.n_segments = n_segments
    p.vocab = vocab
    cdef int status
    with nogil:
        status = _feed(&p, <void *>stream)
    raise_for_status(status, "luce_feed_ids")
