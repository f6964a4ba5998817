"""The one-row matmul's norm tail (luce_matmul_add_rmsnorm: cuda/matmul_norm.cu,
cuda/matmul_gemv_tail.cuh) on the CPU, from the kernels' own source (tests/kernels/emu): one
launch (plus quantize_x where x is not quantized in lane) must give bitwise what luce_matmul then
luce_add_rmsnorm give on its output: y, the sum x + residual, the normed row and the whole
quantized workspace (token 0 and the zeros of its padding tokens), for the types the tail runs
(Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), a norm of up to 1,024 columns (a warp sums it) and past it (the
block sum's order over the block's warps), a partial last chunk of the norm's row; it leaves its
counter zero, so a second launch (a graph replay) works alike. Calls the tail does not take
(IQ4_XS, two rows, another tune, no counter) run the two calls, the same bits.
The SwiGLU tail (luce_matmul_swiglu_quant) likewise: a merged gate | up projection and the
quantized SwiGLU for the down projection (the act row and the whole workspace), bitwise
luce_matmul then luce_swiglu_quant. tests/kernels/test_norm_quant.py checks the CUDA backend's
add_rmsnorm_matmuls with a Product and add_rmsnorm_swiglu on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.ref import norm_quant as ref
from luce.ref.matmul import matmul as ref_matmul
from luce.ref.swiglu import swiglu as ref_swiglu
from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams
from tests.kernels.test_fused_decode_emulated import NormParams
from tests.kernels.test_matmul import assert_rows_close, weights
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow
_P = C.c_void_p


class SwigluParams(C.Structure):
    """luce_swiglu_quant_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "gate up out workspace".split()] + \
               [(n, C.c_int64) for n in "workspace_bytes rows cols gate_stride up_stride".split()]
X_ONCE = 2   # LUCE_MATMUL_X_ONCE (cuda/luce_ops_weights.h)
EPS = 1e-6
SENTINEL = 0x5A


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["matmul.cu", "matmul_norm.cu", "norm_quant.cu", "rmsnorm.cu"], tmp_path_factory.mktemp("emu_tail"),
                   "the matmul with its norm tail")
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(MatmulParams), _P]
    lib.luce_add_rmsnorm.argtypes = [C.POINTER(NormParams), _P]
    lib.luce_matmul_add_rmsnorm.argtypes = [C.POINTER(MatmulParams), C.POINTER(NormParams), _P, _P]
    lib.luce_swiglu_quant.argtypes = [C.POINTER(SwigluParams), _P]
    lib.luce_matmul_swiglu_quant.argtypes = [C.POINTER(MatmulParams), C.POINTER(SwigluParams), _P, C.c_int32, _P]
    lib.emu_launches.restype = C.c_size_t
    return lib


def matmul_params(lib, x, raw, qtype, y, flags, tune):
    """(luce_matmul_params of the decode call x [rows, k] @ W^T -> y [rows, n] (W: raw GGUF rows), the
    buffers it points at, to keep alive); its workspace is its own."""
    rows, k = x.shape
    nbytes = lib.luce_matmul_workspace_bytes(rows, k)
    ws, w = np.zeros(nbytes + 16, np.uint8), np.ascontiguousarray(raw).reshape(-1)
    return MatmulParams(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, ws.ctypes.data, nbytes, rows, y.shape[1],
                        k, int(qtype), 0, flags, tune), (ws, w)


class Outputs:
    """y, sum, out and the norm's workspace of one way of running the pair, and its launches."""

    def __init__(self, lib, x, raw, qtype, n, residual, norm_w, flags, tune=0, fused=True, counter=None):
        rows = x.shape[0]
        self.y = np.full((rows, n), np.nan, np.float32)
        self.sum = np.full((rows, n), np.nan, np.float32)
        self.out = np.full((rows, n), np.nan, np.float32)
        norm_bytes = lib.luce_matmul_workspace_bytes(rows, n)
        self.ws = np.full(norm_bytes, SENTINEL, np.uint8)
        p, _keep = matmul_params(lib, x, raw, qtype, self.y, flags, tune)
        q = NormParams(self.y.ctypes.data, residual.ctypes.data, norm_w.ctypes.data, self.sum.ctypes.data,
                       self.out.ctypes.data, self.ws.ctypes.data, norm_bytes, rows, n, EPS)
        before = lib.emu_launches()
        if fused:
            ptr = None if counter is None else counter.ctypes.data
            assert lib.luce_matmul_add_rmsnorm(C.byref(p), C.byref(q), ptr, None) == 0
        else:
            assert lib.luce_matmul(C.byref(p), None) == 0
            assert lib.luce_add_rmsnorm(C.byref(q), None) == 0
        self.launches = lib.emu_launches() - before


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def inputs(qtype, k: int, n: int, rows: int = 1, seed: int = 0):
    """x [rows, k], the weights' GGUF bytes and decoded values [n, k], residual [rows, n], norm weight [n]."""
    rng = np.random.default_rng(seed + k + n)
    raw, dense = weights(qtype, n, k, seed=seed)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    residual = (3.0 * rng.standard_normal((rows, n))).astype(np.float32)
    norm_w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    return x, raw, dense, residual, norm_w


def check(lib, qtype, k, n, flags, rows=1, tune=0, with_counter=True, launches=None):
    x, raw, dense, residual, norm_w = inputs(qtype, k, n, rows)
    counter = np.zeros(1, np.int32) if with_counter else None
    two = Outputs(lib, x, raw, qtype, n, residual, norm_w, flags, tune, fused=False)
    what = f"{qtype.name} k={k} n={n} rows={rows} flags={flags} tune={tune}"
    assert not (two.ws == SENTINEL).all(), what
    for replay in range(2):   # a second launch on the counter the first left
        fused = Outputs(lib, x, raw, qtype, n, residual, norm_w, flags, tune, counter=counter)
        for name in ("y", "sum", "out", "ws"):
            assert same_bits(getattr(fused, name), getattr(two, name)), f"{what} (launch {replay}): {name} differs"
        if counter is not None:
            assert counter[0] == 0, f"{what}: the counter is left at {counter[0]}"
        if launches is not None:
            assert fused.launches == launches, f"{what}: {fused.launches} launches, want {launches}"
    y, s, out = ref.matmul_add_rmsnorm(x, dense, residual, norm_w, EPS)   # the f32 reference
    assert_rows_close(two.y, y, "matmul_blocks")
    rtol, atol = tolerance("matmul_blocks_normed")
    np.testing.assert_allclose(two.sum, s, rtol=rtol, atol=atol * np.abs(s).max(), err_msg=what)
    np.testing.assert_allclose(two.out, out, rtol=rtol, atol=atol * np.abs(out).max(), err_msg=what)
    return two


# (type, k, n): the Coder-0.5B's out projection (Q5_0 k = 896 -> n = 896, x in lane) and down
# projection (Q6_K k = 4,864: 5 warps a block), the Coder-1.5B's out projection (Q4_K 1,536 ->
# 1,536: 2 warps a block, a norm past 1,024 columns: the block sum's order over the warps), a
# norm of n = 1,152 (4.5 chunks, a partial last one) and one of 288 (1.125 chunks); k of one to
# four chunks (one warp a block).
CASES = [(Q.Q5_0, 896, 896), (Q.Q6_K, 4864, 896), (Q.Q4_K, 1536, 1536), (Q.Q8_0, 2304, 1152),
         (Q.Q8_0, 896, 1152), (Q.Q5_0, 352, 288), (Q.Q4_K, 768, 896), (Q.Q4_K, 512, 1152), (Q.Q5_K, 512, 896),
         (Q.Q6_K, 768, 1152), (Q.Q6_K, 512, 288)]


@pytest.mark.parametrize("qtype,k,n", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_the_tail_gives_the_two_calls_bits(lib, qtype, k, n):
    """x in lane (X_ONCE: one launch) and x from the workspace (quantize_x, then the matmul with its tail)."""
    check(lib, qtype, k, n, X_ONCE, launches=1)
    check(lib, qtype, k, n, 0, launches=2)


def test_calls_the_tail_does_not_take_run_the_two_calls(lib):
    """IQ4_XS (its staged form), two rows (the tile kernel), tune 5 (another shape), no counter, a
    float weight: the two calls, the same bits."""
    check(lib, Q.IQ4_XS, 512, 896, X_ONCE, launches=2)
    check(lib, Q.Q5_0, 896, 896, X_ONCE, rows=2, launches=3)
    check(lib, Q.Q4_K, 512, 896, X_ONCE, tune=5, launches=2)
    check(lib, Q.Q5_0, 896, 896, X_ONCE, with_counter=False, launches=2)
    check(lib, Q.F32, 64, 288, 0, launches=2)


def test_inconsistent_calls_are_refused(lib):
    """The norm's x must be the matmul's y, and its rows and columns the matmul's."""
    x, raw, _, residual, norm_w = inputs(Q.Q5_0, 896, 896)
    y, s, out = (np.zeros((1, 896), np.float32) for _ in range(3))
    ws = np.zeros(lib.luce_matmul_workspace_bytes(1, 896) + 16, np.uint8)
    w = np.ascontiguousarray(raw).reshape(-1)
    counter = np.zeros(1, np.int32)
    p = MatmulParams(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, ws.ctypes.data, ws.size - 16, 1, 896, 896,
                     int(Q.Q5_0), 0, 0, 0)
    for bad in ({"x": out.ctypes.data}, {"cols": 448}, {"rows": 2}):
        fields = {"x": y.ctypes.data, "residual": residual.ctypes.data, "weight": norm_w.ctypes.data,
                  "sum": s.ctypes.data, "out": out.ctypes.data, "workspace": ws.ctypes.data,
                  "workspace_bytes": ws.size - 16, "rows": 1, "cols": 896, "eps": EPS} | bad
        q = NormParams(**fields)
        assert lib.luce_matmul_add_rmsnorm(C.byref(p), C.byref(q), counter.ctypes.data, None) != 0, bad


class SwigluOutputs:
    """y [rows, 2F], act [rows, F] and the down projection's workspace of one way of running a merged
    gate | up projection and the SwiGLU after it, and its launches."""

    def __init__(self, lib, x, raw, qtype, F, flags, tune=0, fused=True, counters=None):
        rows = x.shape[0]
        self.y = np.full((rows, 2 * F), np.nan, np.float32)
        self.act = np.full((rows, F), np.nan, np.float32)
        act_bytes = lib.luce_matmul_workspace_bytes(rows, F)
        self.ws = np.full(act_bytes, SENTINEL, np.uint8)
        p, _keep = matmul_params(lib, x, raw, qtype, self.y, flags, tune)
        q = SwigluParams(self.y.ctypes.data, self.y.ctypes.data + 4 * F, self.act.ctypes.data, self.ws.ctypes.data,
                         act_bytes, rows, F, 2 * F, 2 * F)
        before = lib.emu_launches()
        if fused:
            ptr, n = (None, 0) if counters is None else (counters.ctypes.data, counters.size)
            assert lib.luce_matmul_swiglu_quant(C.byref(p), C.byref(q), ptr, n, None) == 0
        else:
            assert lib.luce_matmul(C.byref(p), None) == 0
            assert lib.luce_swiglu_quant(C.byref(q), None) == 0
        self.launches = lib.emu_launches() - before


def check_swiglu(lib, qtype, k, F, flags, rows=1, tune=0, n_counters=64, launches=None):
    rng = np.random.default_rng(k + F)
    raw, dense = weights(qtype, 2 * F, k, seed=1)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    counters = None if n_counters is None else np.zeros(n_counters, np.int32)
    two = SwigluOutputs(lib, x, raw, qtype, F, flags, tune, fused=False)
    what = f"{qtype.name} k={k} F={F} rows={rows} flags={flags} tune={tune}"
    for replay in range(2):
        fused = SwigluOutputs(lib, x, raw, qtype, F, flags, tune, counters=counters)
        for name in ("y", "act", "ws"):
            assert same_bits(getattr(fused, name), getattr(two, name)), f"{what} (launch {replay}): {name} differs"
        if counters is not None:
            assert not counters.any(), f"{what}: counters left at {counters[counters != 0]}"
        if launches is not None:
            assert fused.launches == launches, f"{what}: {fused.launches} launches, want {launches}"
    assert not (two.ws == SENTINEL).all(), what
    y = ref_matmul(x, dense)   # the f32 reference
    assert_rows_close(two.y, y, "matmul_blocks")
    act = ref_swiglu(y[:, :F], y[:, F:])
    rtol, atol = tolerance("matmul_blocks_normed")
    np.testing.assert_allclose(two.act, act, rtol=rtol, atol=atol * np.abs(act).max(), err_msg=what)


# (type, k, F): the Coder-0.5B's gate | up (Q5_0 896 -> 2 x 4,864: 19 chunks, one warp a block)
# and smaller widths (Q8_0, Q4_K at 2 x 512 rows, two warps a block; Q6_K; Q5_K).
SWIGLU_CASES = [(Q.Q5_0, 896, 4864), (Q.Q8_0, 352, 768), (Q.Q4_K, 1536, 512), (Q.Q6_K, 768, 512),
                (Q.Q5_K, 512, 256)]


@pytest.mark.parametrize("qtype,k,F", SWIGLU_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_the_swiglu_tail_gives_the_two_calls_bits(lib, qtype, k, F):
    """x from the workspace (as add_rmsnorm quantized it): the matmul with its SwiGLU tail, one launch."""
    check_swiglu(lib, qtype, k, F, 0, launches=2)


def test_swiglu_calls_the_tail_does_not_take_run_the_two_calls(lib):
    """F not whole chunks of 256, too few counters, no counters, two rows, tune 5, IQ4_XS: the two calls."""
    check_swiglu(lib, Q.Q5_0, 352, 416, 0, launches=3)
    check_swiglu(lib, Q.Q5_0, 352, 768, 0, n_counters=2, launches=3)
    check_swiglu(lib, Q.Q5_0, 352, 768, 0, n_counters=None, launches=3)
    check_swiglu(lib, Q.Q8_0, 352, 512, 0, rows=2, launches=3)
    check_swiglu(lib, Q.Q4_K, 512, 512, 0, tune=5, launches=3)
    check_swiglu(lib, Q.IQ4_XS, 512, 512, 0, launches=3)
