"""The down projection's SwiGLU in lane (LUCE_MATMUL_X_SWIGLU: cuda/matmul_gemv_x.cuh) on the
CPU, from the kernels' own source (tests/kernels/emu): a one-row decode call whose x is the row
[gate | up] runs one launch (no luce_swiglu_quant, no quantize_x) and leaves the workspace
unwritten, and its y is bitwise that of luce_swiglu_quant then luce_matmul with REUSE_X (the
two launches it replaces) on the one-row kernel and on the tile kernel (tune 4), for every block
type (IQ4_XS in its staged form and its register form), gate/up of whole and partial chunks, zeros,
huge values (silu saturating), inf and NaN. luce_matmul_x_in_lane answers where the flag runs;
elsewhere (more rows, another flag beside it, a call off the one-row kernel) it is refused.
tests/kernels/test_matmul_gemv_x.py runs the same bits on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_matmul import weights
from tests.kernels.test_matmul_gemv_x_emulated import SENTINEL, patterned_x, same_bits

pytestmark = pytest.mark.slow
_P = C.c_void_p
REUSE_X, X_ONCE, X_SWIGLU = 1, 2, 4   # LUCE_MATMUL_* (cuda/luce_ops_weights.h)


class SwigluParams(C.Structure):
    _fields_ = ([(f, _P) for f in "gate up out workspace".split()]
                + [(f, C.c_int64) for f in "workspace_bytes rows cols gate_stride up_stride".split()])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["matmul.cu", "norm_quant.cu"], tmp_path_factory.mktemp("emu_swiglu_x"),
                   "the quantized matmul and SwiGLU + quantize")
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(Params), _P]
    lib.luce_matmul_x_in_lane.argtypes = [C.POINTER(Params)]
    lib.luce_swiglu_quant.argtypes = [C.POINTER(SwigluParams), _P]
    lib.emu_launches.restype = C.c_size_t
    return lib


def matmul(lib, x, w, n, k, qtype, flags, tune, ws):
    """(status, y, launches) of one decode luce_matmul call with x's first k... columns as given."""
    rows = x.shape[0]
    y = np.full((rows, n), np.nan, np.float32)
    p = Params(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, ws.ctypes.data,
               lib.luce_matmul_workspace_bytes(rows, k), rows, n, k, int(qtype), 0, flags, tune)
    before = lib.emu_launches()
    status = lib.luce_matmul(C.byref(p), None)
    return status, y, lib.emu_launches() - before


def in_lane(lib, w, n, k, qtype, tune) -> bool:
    p = Params(None, w.ctypes.data, None, None, None, 0, 1, n, k, int(qtype), 0, 0, tune)
    return bool(lib.luce_matmul_x_in_lane(C.byref(p)))


def two_launches(lib, gu, w, n, k, qtype, tune):
    """luce_swiglu_quant of the row, then luce_matmul with REUSE_X: y."""
    nbytes = lib.luce_matmul_workspace_bytes(1, k)
    ws = np.zeros(nbytes + 16, np.uint8)
    act = np.zeros((1, k), np.float32)
    sp = SwigluParams(gu.ctypes.data, gu.ctypes.data + 4 * k, act.ctypes.data, ws.ctypes.data, nbytes, 1, k,
                      2 * k, 2 * k)
    assert lib.luce_swiglu_quant(C.byref(sp), None) == 0
    status, y, _ = matmul(lib, act, w, n, k, qtype, REUSE_X, tune, ws)
    assert status == 0
    return y


def gate_up(k, seed, pattern):
    """[gate | up] of one row: gate patterned (patterned_x), up N(0, 1)."""
    g = patterned_x(k, seed, pattern)
    u = np.random.default_rng(seed + 1).standard_normal((1, k)).astype(np.float32)
    if pattern == "mixed":
        g[0, :64] *= np.float32(90.0)   # silu(g) = g and silu(-g) = -0.0 in f32
    return np.ascontiguousarray(np.concatenate([g, u], axis=1))


# (type, k, n): Coder-0.5B's FFN width 4,864 (19 chunks), partial last chunks for the 32-value
# types, 1,536; n not a multiple of the rows a batch.
CASES = [(Q.Q4_K, 4864, 7), (Q.Q4_K, 1536, 19), (Q.Q5_K, 1536, 13), (Q.Q6_K, 4864, 6), (Q.Q6_K, 1536, 11),
         (Q.Q8_0, 4864, 7), (Q.Q8_0, 352, 13), (Q.Q5_0, 896, 37), (Q.Q5_0, 4864, 5), (Q.IQ4_XS, 1536, 13),
         (Q.IQ4_XS, 4864, 10)]


@pytest.mark.parametrize("qtype,k,n", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_swiglu_in_lane_gives_the_two_launch_bits(lib, qtype, k, n):
    raw, _ = weights(qtype, n, k, seed=k % 5)
    w = np.ascontiguousarray(raw).reshape(-1)
    tunes = (0, 5, 7) if qtype == Q.IQ4_XS else (0, 5)
    for pattern in ("normal", "mixed", "sparse", "inf", "nan"):
        gu = gate_up(k, k + n, pattern)
        tile = two_launches(lib, gu, w, n, k, qtype, 4)
        for tune in tunes:
            what = f"{qtype.name} k={k} n={n} tune {tune} {pattern}"
            if not in_lane(lib, w, n, k, qtype, tune):
                assert tune == 0 and qtype == Q.Q6_K, f"{what}: not in lane"   # Q6_K past 16 MiB only
                continue
            ws = np.full(lib.luce_matmul_workspace_bytes(1, k) + 16, SENTINEL, np.uint8)
            status, y, launches = matmul(lib, gu, w, n, k, qtype, X_SWIGLU, tune, ws)
            assert status == 0 and launches == 1, f"{what}: status {status}, {launches} launches"
            assert (ws == SENTINEL).all(), f"{what}: the in-lane path wrote the workspace"
            assert same_bits(y, two_launches(lib, gu, w, n, k, qtype, tune)), f"{what}: != the two launches"
            assert same_bits(y, tile), f"{what}: != the tile kernel"
            assert np.isnan(y).all() if pattern in ("inf", "nan") else np.isfinite(y).all(), what


def test_swiglu_flag_refused_off_the_in_lane_path(lib):
    """Two rows, the tile kernel (tune 4), and X_SWIGLU beside REUSE_X or X_ONCE: an invalid value,
    nothing launched; luce_matmul_x_in_lane says 0 for tune 4 and for a float weight."""
    k, n = 896, 37
    raw, _ = weights(Q.Q5_0, n, k)
    w = np.ascontiguousarray(raw).reshape(-1)
    gu = gate_up(k, 3, "normal")
    ws = np.zeros(lib.luce_matmul_workspace_bytes(2, k) + 16, np.uint8)
    assert in_lane(lib, w, n, k, Q.Q5_0, 0) and not in_lane(lib, w, n, k, Q.Q5_0, 4)
    assert not in_lane(lib, w, n, k, Q.F32, 0)
    for x, flags, tune in ((np.concatenate([gu, gu]), X_SWIGLU, 0), (gu, X_SWIGLU, 4),
                           (gu, X_SWIGLU | REUSE_X, 0), (gu, X_SWIGLU | X_ONCE, 0)):
        status, _, launches = matmul(lib, np.ascontiguousarray(x), w, n, k, Q.Q5_0, flags, tune, ws)
        assert status != 0 and launches == 0, (x.shape, flags, tune)
