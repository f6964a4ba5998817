# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin launch layer over the luce kernel library (cuda/luce_ops.h).

The library (libluce_cuda.so, or libluce_hip.so with the same ABI) is dlopen()ed at run time,
so this extension builds without a GPU toolkit. Each wrapper fills a POD params struct from
raw device addresses and sizes, calls the kernel entry point with the GIL released and turns a
non-zero status into KernelError naming the kernel.
"""
from libc.stdint cimport int64_t, uintptr_t

include "_cuda_load.pxi"


cdef extern from "luce_ops.h":
    ctypedef struct luce_rmsnorm_params:
        const float *x
        const float *weight
        float *out
        int64_t rows
        int64_t cols
        float eps


ctypedef int (*abi_version_fn)() noexcept nogil
ctypedef const char *(*error_string_fn)(int) noexcept nogil
ctypedef int (*sync_fn)() noexcept nogil
ctypedef int (*rmsnorm_fn)(const luce_rmsnorm_params *, void *) noexcept nogil
ctypedef int (*set_overlap_fn)(int) noexcept nogil


class KernelError(RuntimeError):
    """A kernel entry point returned a non-zero status."""


cdef void *_handle = NULL
cdef abi_version_fn _abi_version = NULL
cdef error_string_fn _error_string = NULL
cdef sync_fn _sync = NULL
cdef rmsnorm_fn _rmsnorm = NULL
cdef set_overlap_fn _set_overlap = NULL
_loaded_path = None

EXPECTED_ABI_VERSION = 22


def load(str path):
    """dlopen the kernel library at `path` and resolve every entry point."""
    global _handle, _abi_version, _error_string, _sync, _rmsnorm, _set_overlap, _loaded_path
    cdef void *lib = _open_library(path)
    cdef abi_version_fn abi_version = <abi_version_fn>_symbol(lib, path, "luce_abi_version")
    if abi_version() != EXPECTED_ABI_VERSION:
        raise OSError(f"kernel library {path} has ABI {abi_version()}, this build expects "
                      f"{EXPECTED_ABI_VERSION}: {REBUILD_HINT}")
    _error_string = <error_string_fn>_symbol(lib, path, "luce_error_string")
    _sync = <sync_fn>_symbol(lib, path, "luce_device_synchronize")
    _rmsnorm = <rmsnorm_fn>_symbol(lib, path, "luce_rmsnorm")
    _set_overlap = <set_overlap_fn>_symbol(lib, path, "luce_set_decode_overlap")
    _abi_version = abi_version
    _handle = lib
    _loaded_path = path


def loaded_path():
    """Path of the loaded kernel library, or None."""
    return _loaded_path


def raise_for_status(int status, str kernel):
    """Raise KernelError naming `kernel` when status != 0 (for the luce._cuda_<family> modules)."""
    if status != 0:
        msg = _error_string(status).decode(errors="replace") if _error_string != NULL else "?"
        raise KernelError(f"{kernel} failed with status {status}: {msg}")


cdef int _check(int status, str kernel) except -1:
    raise_for_status(status, kernel)
    return 0


def synchronize():
    _require_loaded(_handle)
    cdef int status
    with nogil:
        status = _sync()
    _check(status, "luce_device_synchronize")


def set_decode_overlap(bint every_kind):
    """Which decode-chain launches overlap the kernel ahead while LUCE_PDL is unset (luce_ops.h:
    luce_set_decode_overlap): every kind, or only the matmuls and the decode attention."""
    _require_loaded(_handle)
    _check(_set_overlap(1 if every_kind else 0), "luce_set_decode_overlap")


def rmsnorm(uintptr_t x, uintptr_t weight, uintptr_t out, int64_t rows, int64_t cols,
            float eps, uintptr_t stream=0):
    """x, out [rows, cols] f32; weight [cols] f32 (device addresses)."""
    _require_loaded(_handle)
    cdef luce_rmsnorm_params p
    p.x = <const float *>x
    p.weight = <const float *>weight
    p.out = <float *>out
    p.rows = rows
    p.cols = cols
    p.eps = eps
    cdef int status
    with nogil:
        status = _rmsnorm(&p, <void *>stream)
    _check(status, "luce_rmsnorm")
