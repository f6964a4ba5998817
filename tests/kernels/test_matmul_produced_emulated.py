"""luce_matmul_produced (cuda/matmul.cu, cuda/matmul_gemv_x.cuh) on the CPU (tests/kernels/emu): a
one-row decode matmul whose x is RMSNorm(a + residual) * weight or silu(gate) * up runs as one
launch (the one-row kernel forms x in lane: no producer launch, x and the workspace unwritten),
and its y and the stored a + residual are bitwise those of the producer's own launch
(luce_add_rmsnorm / luce_swiglu_quant into the workspace) followed by luce_matmul on it, for
Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0, rows of one warp's norm (<= 1,024 columns) and of a block's
(1,536: its 256 threads' sums played by one warp), with and without a residual and a bias, a
gate|up row read in place, rows holding inf and NaN. Calls it does not take (two rows, IQ4_XS,
the tile kernel's tune, twice the rows a batch where x is not formed in lane) run the two launches,
the same bits. Bad calls are refused. tests/kernels/test_matmul_produced.py runs it on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_fused_decode_emulated import NormParams
from tests.kernels.test_matmul import weights

pytestmark = pytest.mark.slow
_P = C.c_void_p
REUSE_X, X_SWIGLU, X_ADD_RMSNORM = 1, 1, 2
EPS = 1e-6
SENTINEL = 0x5A


class XSource(C.Structure):
    """luce_x_source (cuda/luce_ops_weights.h), field for field."""
    _fields_ = [(n, _P) for n in "a b weight sum".split()] + [("a_stride", C.c_int64), ("b_stride", C.c_int64),
                                                              ("kind", C.c_int32), ("eps", C.c_float)]


class SwigluQuantParams(C.Structure):
    """luce_swiglu_quant_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "gate up out workspace".split()] + \
               [(n, C.c_int64) for n in "workspace_bytes rows cols gate_stride up_stride".split()]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["matmul.cu", "norm_quant.cu", "rmsnorm.cu"], tmp_path_factory.mktemp("emu_produced"),
                   "the produced matmul")
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(Params), _P]
    lib.luce_matmul_produced.argtypes = [C.POINTER(Params), C.POINTER(XSource), _P]
    lib.luce_add_rmsnorm.argtypes = [C.POINTER(NormParams), _P]
    lib.luce_swiglu_quant.argtypes = [C.POINTER(SwigluQuantParams), _P]
    lib.emu_launches.restype = C.c_size_t
    return lib


def ptr(a):
    return None if a is None else a.ctypes.data


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


class Inputs:
    """A producer's inputs for `rows` rows of k: norm (a, residual or None, weight) or swiglu (one
    [rows, 2k] gate|up buffer read in place, strides 2k)."""

    def __init__(self, kind: int, rows: int, k: int, seed: int, residual: bool = True, pattern: str = "normal"):
        rng = np.random.default_rng(seed)
        self.kind, self.rows, self.k = kind, rows, k
        if kind == X_ADD_RMSNORM:
            self.a = rng.standard_normal((rows, k)).astype(np.float32)
            self.b = rng.standard_normal((rows, k)).astype(np.float32) if residual else None
            self.weight = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
            self.stride = k
        else:
            self.gate_up = (2.0 * rng.standard_normal((rows, 2 * k))).astype(np.float32)
            self.weight, self.stride = None, 2 * k
        target = self.a if kind == X_ADD_RMSNORM else self.gate_up
        if pattern == "huge":       # rows of very different magnitude chunk by chunk
            target[:, : k // 2] *= 1e4
            target[:, 256:512] *= 1e-20
        elif pattern == "nan":
            target[0, k // 3] = np.nan
        elif pattern == "inf":
            target[0, 5] = np.inf

    def ptrs(self):
        """(a, b) device addresses as the source takes them."""
        if self.kind == X_ADD_RMSNORM:
            return ptr(self.a), ptr(self.b)
        base = self.gate_up.ctypes.data
        return base, base + 4 * self.k

    def producer(self, lib, out, ws, sum_out):
        """The producer's own launch: x into out and ws."""
        a, b = self.ptrs()
        if self.kind == X_ADD_RMSNORM:
            p = NormParams(a, b, ptr(self.weight), ptr(sum_out), ptr(out), ptr(ws), ws.size, self.rows, self.k, EPS)
            assert lib.luce_add_rmsnorm(C.byref(p), None) == 0
        else:
            p = SwigluQuantParams(a, b, ptr(out), ptr(ws), ws.size, self.rows, self.k, self.stride, self.stride)
            assert lib.luce_swiglu_quant(C.byref(p), None) == 0


def run(lib, src: Inputs, raw, qtype, n, tune=0, bias=None, produced=True, flags=0, kind=None, weight="set"):
    """luce_matmul_produced (or the producer then luce_matmul with REUSE_X) -> (status, y, sum,
    launches, x and workspace untouched)."""
    rows, k = src.rows, src.k
    nbytes = lib.luce_matmul_workspace_bytes(rows, k)
    ws = np.full(nbytes + 16, SENTINEL, np.uint8)
    x = np.full((rows, k), np.nan, np.float32)
    y = np.full((rows, n), np.nan, np.float32)
    has_sum = src.kind == X_ADD_RMSNORM and src.b is not None
    s = np.full((rows, k), np.nan, np.float32) if has_sum else None
    w = np.ascontiguousarray(raw).reshape(-1)
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    p = Params(ptr(x), ptr(w), ptr(b), ptr(y), ptr(ws), nbytes, rows, n, k, int(qtype), 0, flags, tune)
    before = lib.emu_launches()
    if produced:
        a_ptr, b_ptr = src.ptrs()
        xs = XSource(a_ptr, b_ptr, ptr(src.weight) if weight == "set" else None, ptr(s), src.stride, src.stride,
                     src.kind if kind is None else kind, EPS)
        status = lib.luce_matmul_produced(C.byref(p), C.byref(xs), None)
    else:
        src.producer(lib, x, ws, s)
        p.flags = REUSE_X
        status = lib.luce_matmul(C.byref(p), None)
    untouched = bool(np.isnan(x).all() and (ws == SENTINEL).all())
    return status, y, s, lib.emu_launches() - before, untouched


def check(lib, kind, qtype, k, n, tune=0, rows=1, residual=True, bias=False, pattern="normal", one_launch=True):
    raw, _ = weights(qtype, n, k, seed=k % 5)
    src = Inputs(kind, rows, k, seed=k + n + tune, residual=residual, pattern=pattern)
    b = np.random.default_rng(n).standard_normal(n).astype(np.float32) if bias else None
    what = f"{'norm' if kind == X_ADD_RMSNORM else 'swiglu'} {qtype.name} k={k} n={n} tune {tune} rows {rows} {pattern}"
    status, y, s, launches, untouched = run(lib, src, raw, qtype, n, tune, b)
    status2, y2, s2, launches2, _ = run(lib, src, raw, qtype, n, tune, b, produced=False)
    assert status == 0 and status2 == 0, what
    if one_launch:
        assert launches == 1 and untouched, f"{what}: {launches} launches, x / workspace written: {not untouched}"
    else:
        assert launches == 2 and not untouched, f"{what}: the producer's launch did not run"
    assert launches2 == 2
    assert same_bits(y, y2), f"{what}: y differs from the producer's launch + luce_matmul"
    if s is not None:
        assert same_bits(s, s2), f"{what}: the stored a + residual differs"
    if pattern == "normal":
        assert np.isfinite(y).all(), what
    if pattern == "nan":
        assert np.isnan(y[0]).all(), what


NORM_CASES = [(Q.Q4_K, 1024, 37), (Q.Q5_K, 1024, 19), (Q.Q6_K, 1024, 11), (Q.Q4_K, 1536, 21), (Q.Q6_K, 1536, 9),
              (Q.Q8_0, 896, 29), (Q.Q5_0, 896, 13), (Q.Q8_0, 1536, 7), (Q.Q5_0, 1536, 5)]


@pytest.mark.parametrize("qtype,k,n", NORM_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_norm_formed_in_lane_gives_the_producers_bits(lib, qtype, k, n):
    """k <= 1,024: the norm's one warp; 1,536: the block's 256 threads played by one warp."""
    for pattern in ("normal", "huge", "nan"):
        check(lib, X_ADD_RMSNORM, qtype, k, n, pattern=pattern)
    check(lib, X_ADD_RMSNORM, qtype, k, n, residual=False, bias=True)
    check(lib, X_ADD_RMSNORM, qtype, k, n, tune=5, bias=True)


@pytest.mark.parametrize("qtype,k,n", [(Q.Q4_K, 4864, 9), (Q.Q6_K, 4864, 7), (Q.Q4_K, 8960, 5), (Q.Q8_0, 4864, 6),
                                       (Q.Q5_0, 896, 11), (Q.Q5_K, 2048, 13)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_swiglu_formed_in_lane_gives_the_producers_bits(lib, qtype, k, n):
    """A gate|up row read in place (strides 2k); Coder-0.5B / 1.5B FFN widths."""
    for pattern in ("normal", "huge", "inf"):
        check(lib, X_SWIGLU, qtype, k, n, pattern=pattern, bias=pattern == "huge")


def test_calls_it_does_not_take_run_the_producer_first(lib):
    """Two rows, IQ4_XS (its staged form), the tile kernel (tune 4), tune 6's twice the rows a
    batch for Q6_K and Q8_0 (x not in lane there): two launches, the same bits."""
    check(lib, X_ADD_RMSNORM, Q.Q4_K, 1024, 13, rows=2, one_launch=False)
    check(lib, X_SWIGLU, Q.Q4_K, 1024, 13, rows=3, one_launch=False)
    check(lib, X_ADD_RMSNORM, Q.IQ4_XS, 1024, 9, one_launch=False)
    check(lib, X_SWIGLU, Q.Q4_K, 1024, 9, tune=4, one_launch=False)
    check(lib, X_ADD_RMSNORM, Q.Q6_K, 1024, 9, tune=6, one_launch=False)
    check(lib, X_SWIGLU, Q.Q8_0, 896, 9, tune=6, one_launch=False)
    check(lib, X_SWIGLU, Q.Q4_K, 1024, 9, tune=6)   # Q4_K forms x in lane at twice the rows too


def test_bad_calls_are_refused(lib):
    raw, _ = weights(Q.Q4_K, 5, 256)
    norm = Inputs(X_ADD_RMSNORM, 1, 256, 0)
    for kwargs in ({"flags": REUSE_X}, {"kind": 7}, {"weight": None}):
        status, y, _, launches, untouched = run(lib, norm, raw, Q.Q4_K, 5, **kwargs)
        assert status != 0 and launches == 0 and untouched and np.isnan(y).all(), kwargs
