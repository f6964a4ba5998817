# cython: language_level=3, boundscheck=False, wraparound=False
"""Launch layer of the cpu backend's C kernels (luce/cpu/, ABI in luce/cpu/cpu_ops.h).

Wrappers take numpy arrays, check dtype, shape and contiguity, and call the C entry points
with the GIL released. luce/ops/cpu_backend.py is the Backend built on them.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

cnp.import_array()

cdef extern from "sys/mman.h":
    int madvise(void *addr, size_t length, int advice) nogil
    int MADV_DONTNEED

cdef extern from "unistd.h":
    long sysconf(int name) nogil
    int _SC_PAGESIZE

cdef extern from "cpu_ops.h":
    int LUCE_ISA_PORTABLE, LUCE_ISA_AVX2, LUCE_ISA_AVX512
    int luce_cpu_isa_supported(int isa) nogil
    int luce_cpu_set_isa(int isa) nogil
    int luce_cpu_get_isa() nogil
    void luce_cpu_set_threads(int n) nogil
    int luce_cpu_get_threads() nogil
    ctypedef struct luce_cpu_matmul_out:
        const uint8_t *w
        const uint8_t *packed
        int32_t qtype
        int64_t n
        int64_t row_bytes
        const float *bias
        float *y
    int luce_cpu_matmuls(const float *x, int64_t T, int64_t k, const luce_cpu_matmul_out *outs, int n_outs) nogil
    int64_t luce_cpu_row_bytes(int32_t qtype, int64_t k) nogil
    int64_t luce_cpu_packed_bytes(int32_t qtype, int64_t n, int64_t k) nogil
    int luce_cpu_pack(const uint8_t *w, int32_t qtype, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out) nogil
    uint64_t luce_cpu_read_probe(const uint8_t *buf, int64_t n_bytes) nogil
    int luce_cpu_dequantize_rows(const uint8_t *w, int32_t qtype, int64_t row_bytes, int64_t k, const int64_t *rows,
                                 int64_t n, float *out) nogil

DEF MAX_MATMULS = 8   # weights one matmuls call takes (q/k/v, gate/up, the GDN in-projections)

ISAS = {"portable": LUCE_ISA_PORTABLE, "avx2": LUCE_ISA_AVX2, "avx512": LUCE_ISA_AVX512}
ISA_NAMES = {v: k for k, v in ISAS.items()}
# ggml type ids the matmul takes
QTYPES = {"F32": 0, "F16": 1, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
          "IQ4_XS": 23, "BF16": 30}


class CpuKernelError(RuntimeError):
    """A cpu kernel refused its arguments (a bug in the caller: the backend checks first)."""


cdef int _check(int rc, str what) except -1:
    if rc == -2:
        raise MemoryError(f"{what}: out of memory")
    if rc != 0:
        raise CpuKernelError(f"{what}: the kernel refused its arguments (status {rc})")
    return 0


def supported_isas():
    """Names of the instruction-set paths this CPU and build run, portable first."""
    return [name for name, isa in ISAS.items() if luce_cpu_isa_supported(isa)]


def set_isa(str name):
    """Select the path `name` (or the best supported one below it); returns the one selected."""
    if name not in ISAS:
        raise ValueError(f"unknown instruction set {name!r}: one of {', '.join(ISAS)}")
    return ISA_NAMES[luce_cpu_set_isa(ISAS[name])]


def get_isa():
    return ISA_NAMES[luce_cpu_get_isa()]


def set_threads(int n):
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    luce_cpu_set_threads(n)


def get_threads():
    return luce_cpu_get_threads()


def row_bytes(int qtype, int64_t k):
    """Bytes of one row of k values of ggml type qtype; ValueError if unsupported."""
    cdef int64_t n = luce_cpu_row_bytes(qtype, k)
    if n < 0:
        raise ValueError(f"the cpu matmul does not take ggml type {qtype} with rows of {k} values")
    return n


def dequantize_rows(object w, object rows, object out):
    """Rows `rows` (int64 [n], in range) of the weight w (.raw, .qtype, .k, .row_bytes) decoded
    into out [n, k] f32."""
    cdef object raw = w.raw
    if raw.dtype != np.uint8 or not raw.flags.c_contiguous:
        raise ValueError("weight bytes must be C-contiguous uint8")
    if not isinstance(rows, np.ndarray) or rows.dtype != np.int64 or not rows.flags.c_contiguous:
        raise TypeError("rows must be a C-contiguous int64 array")
    cdef int64_t n = rows.shape[0], k = w.k
    if out.shape != (n, k):
        raise ValueError(f"dequantize_rows: output must be [{n}, {k}]")
    cdef const uint8_t *wp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>raw)
    cdef const int64_t *rp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>rows)
    cdef float *op = <float *>_f32_ptr(out, "output")
    cdef int32_t qtype = w.qtype
    cdef int64_t row_bytes = w.row_bytes
    cdef int rc
    with nogil:
        rc = luce_cpu_dequantize_rows(wp, qtype, row_bytes, k, rp, n, op)
    _check(rc, "dequantize_rows")


def read_probe(object buf):
    """Stream the bytes of `buf` (a C-contiguous uint8 array) once on every thread."""
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or not buf.flags.c_contiguous:
        raise TypeError("read_probe wants a C-contiguous uint8 array")
    cdef const uint8_t *p = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>buf)
    cdef int64_t n = buf.nbytes
    cdef uint64_t r
    with nogil:
        r = luce_cpu_read_probe(p, n)
    return r


cdef const float *_f32_ptr(object a, str what) except NULL:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise TypeError(f"{what} must be a C-contiguous float32 array")
    return <const float *>cnp.PyArray_DATA(<cnp.ndarray>a)


cdef class CpuWeight:
    """A matrix [n, k] as GGUF blocks of ggml type `qtype`: raw [n, row_bytes] uint8 (a view of
    the mapped file, or of an f32 array), and optionally the same blocks packed
    (luce/cpu/packed.h: `pack`), which the AVX-512 path multiplies instead. Checked once, here;
    matmuls reads the C fields."""
    cdef readonly object raw, packed
    cdef readonly int32_t qtype
    cdef readonly int64_t n, k, row_bytes
    cdef const uint8_t *ptr
    cdef const uint8_t *pptr

    def __init__(self, object raw, int qtype, int64_t n, int64_t k, int64_t row_bytes, object packed=None):
        if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or not raw.flags.c_contiguous:
            raise TypeError("weight bytes must be a C-contiguous uint8 array")
        if luce_cpu_row_bytes(qtype, k) != row_bytes or raw.nbytes != n * row_bytes:
            raise ValueError(f"weight bytes: {raw.nbytes} for [{n}, {k}] of ggml type {qtype} "
                             f"(rows of {row_bytes} bytes)")
        self.raw, self.qtype, self.n, self.k, self.row_bytes = raw, qtype, n, k, row_bytes
        self.ptr = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>raw)
        self.packed, self.pptr = None, NULL
        if packed is not None:
            if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or not packed.flags.c_contiguous \
                    or packed.nbytes != luce_cpu_packed_bytes(qtype, n, k):
                raise ValueError(f"packed bytes of a [{n}, {k}] ggml type {qtype} weight: expected "
                                 f"{luce_cpu_packed_bytes(qtype, n, k)} uint8")
            self.packed, self.pptr = packed, <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>packed)

    @property
    def shape(self):
        return (self.n, self.k)


def packed_bytes(int qtype, int64_t n, int64_t k):
    """Bytes of the packed form of a [n, k] weight, or -1 if it has none (type, n % 16)."""
    return luce_cpu_packed_bytes(qtype, n, k)


def pack(CpuWeight w):
    """The weight's blocks in the column-interleaved layout of luce/cpu/packed.h (a new
    uint8 array), or None if its type or shape has no packed form."""
    cdef int64_t nbytes = luce_cpu_packed_bytes(w.qtype, w.n, w.k)
    if nbytes < 0:
        return None
    cdef cnp.ndarray out = np.empty(nbytes, np.uint8)
    cdef int rc
    with nogil:
        rc = luce_cpu_pack(w.ptr, w.qtype, w.n, w.k, w.row_bytes, <uint8_t *>cnp.PyArray_DATA(out))
    _check(rc, "pack")
    return out


def release_file_pages(cnp.ndarray a):
    """Drop this process's mapping of the whole pages inside `a` (a view of a file mapped
    read-only: the pages stay in the page cache and fault back in when read), so a weight
    read once to pack it does not stay resident twice. Never call it on anonymous memory."""
    cdef size_t page = <size_t>sysconf(_SC_PAGESIZE)
    cdef size_t start = <size_t>cnp.PyArray_DATA(a), end = start + <size_t>a.nbytes
    cdef size_t lo = (start + page - 1) // page * page, hi = end // page * page
    if hi > lo:
        madvise(<void *>lo, hi - lo, MADV_DONTNEED)


def matmuls(object x, list weights, list biases, list outs):
    """x [T, k] f32; weights: CpuWeight; biases: [n] f32 or None; outs: [T, n] f32 written in place."""
    cdef int m = len(weights), i
    if len(biases) != m or len(outs) != m or m == 0:
        raise ValueError("matmuls needs one bias (or None) and one output per weight")
    cdef const float *xp = _f32_ptr(x, "x")
    if x.ndim != 2:
        raise ValueError(f"matmul wants x [T, K], got {x.shape}")
    cdef int64_t T = x.shape[0], K = x.shape[1]
    cdef luce_cpu_matmul_out o[MAX_MATMULS]
    if m > MAX_MATMULS:
        raise ValueError(f"matmuls takes at most {MAX_MATMULS} weights at once")
    cdef CpuWeight w
    cdef object b, y
    cdef int rc
    for i in range(m):
        w, b, y = <CpuWeight?>weights[i], biases[i], outs[i]
        if w.k != K:
            raise ValueError(f"matmul: x {x.shape} does not match the weight [{w.n}, {w.k}]")
        if not isinstance(y, np.ndarray) or cnp.PyArray_NDIM(<cnp.ndarray>y) != 2 \
                or cnp.PyArray_DIM(<cnp.ndarray>y, 0) != T or cnp.PyArray_DIM(<cnp.ndarray>y, 1) != w.n:
            raise ValueError(f"matmul output must be [{T}, {w.n}]")
        o[i].w = w.ptr
        o[i].packed = w.pptr
        o[i].qtype = w.qtype
        o[i].n = w.n
        o[i].row_bytes = w.row_bytes
        o[i].y = <float *>_f32_ptr(y, "matmul output")
        if b is None:
            o[i].bias = NULL
        else:
            if cnp.PyArray_SIZE(<cnp.ndarray>b) != w.n:
                raise ValueError(f"matmul: bias {b.shape}, expected ({w.n},)")
            o[i].bias = _f32_ptr(b, "bias")
    with nogil:
        rc = luce_cpu_matmuls(xp, T, K, o, m)
    _check(rc, "matmul")


include "_cpu_sequence.pxi"
