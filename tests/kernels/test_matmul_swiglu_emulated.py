"""luce_matmul_swiglu (cuda/matmul_swiglu_launch.cuh, cuda/matmul_gemv_swiglu.cuh) on the CPU
(tests/kernels/emu): a decode row's gate | up projection whose one-row kernel also forms the SwiGLU
and its quantization (the SwiGLU tail) is one launch, bitwise luce_matmul then luce_swiglu_quant:
y, the act, every byte of the act's workspace (the padding rows' zeros included), and the counts
left zero for the next call; calls it does not take (F not whole 256-value chunks, IQ4_XS, a tune
set, two rows) launch nothing and say so (LUCE_MATMUL_SWIGLU_NOT_TAKEN)."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_matmul import activations, weights

pytestmark = pytest.mark.slow
_P = C.c_void_p
REUSE_X = 1


class SwigluParams(C.Structure):
    _fields_ = ([(f, _P) for f in "gate up out workspace".split()]
                + [(f, C.c_int64) for f in "workspace_bytes rows cols gate_stride up_stride".split()])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["matmul.cu", "norm_quant.cu", "rmsnorm.cu"], tmp_path_factory.mktemp("emu_matmul_swiglu"),
                   "the gate | up matmul's SwiGLU tail")   # norm_quant.cu: the two launches it is compared with
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(Params), _P]
    lib.luce_swiglu_quant.argtypes = [C.POINTER(SwigluParams), _P]
    lib.luce_matmul_swiglu.argtypes = [C.POINTER(Params), C.POINTER(SwigluParams), _P, _P]
    lib.emu_launches.restype = C.c_size_t
    return lib


def gate_up_and_act(lib, x, raw, qtype, n: int, fused: bool, counts):
    """y [1, n], act [1, n / 2], the act's workspace bytes and the launches after x's own
    quantization (a first luce_matmul call, as the norm launch does before the matmul)."""
    k, F = x.shape[1], n // 2
    w = np.ascontiguousarray(raw.reshape(-1))
    x_bytes, act_bytes = lib.luce_matmul_workspace_bytes(1, k), lib.luce_matmul_workspace_bytes(1, F)
    ws = np.zeros(x_bytes // 4 + 4, np.float32)
    act_ws = np.full(act_bytes // 4 + 4, np.nan, np.float32)   # the padding rows' zeros must be written
    y, act = np.full((1, n), np.nan, np.float32), np.full((1, F), np.nan, np.float32)
    p = Params(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, ws.ctypes.data, x_bytes, 1, n, k, int(qtype), 0, 0, 0)
    assert lib.luce_matmul(C.byref(p), None) == 0
    p.flags = REUSE_X
    y.fill(np.nan)
    s = SwigluParams(y.ctypes.data, y.ctypes.data + 4 * F, act.ctypes.data, act_ws.ctypes.data, act_bytes, 1, F, n, n)
    before = lib.emu_launches()
    if fused:
        status = lib.luce_matmul_swiglu(C.byref(p), C.byref(s), counts.ctypes.data, None)
        assert status == 0, status
    else:
        assert lib.luce_matmul(C.byref(p), None) == 0
        assert lib.luce_swiglu_quant(C.byref(s), None) == 0
    return y, act, act_ws[:act_bytes // 4].view(np.uint32), lib.emu_launches() - before


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


@pytest.mark.parametrize("qtype, F, k", [(Q.Q4_K, 512, 256), (Q.Q5_K, 256, 512), (Q.Q6_K, 256, 256),
                                         (Q.Q8_0, 768, 512), (Q.Q5_0, 256, 896)])
def test_the_tail_is_one_launch_with_the_two_launches_bits(lib, qtype, F, k):
    raw = weights(qtype, 2 * F, k, seed=F + k)[0]
    x = activations(1, k, seed=k)
    counts = np.zeros(F // 256 + 1, np.uint32)
    want_y, want_act, want_ws, apart = gate_up_and_act(lib, x, raw, qtype, 2 * F, False, counts)
    assert apart == 2 and not np.isnan(want_act).any()
    for again in range(2):   # the counts the first call leaves serve the second
        y, act, ws, launches = gate_up_and_act(lib, x, raw, qtype, 2 * F, True, counts)
        assert launches == 1, f"call {again}: {launches} launches"
        assert same_bits(y, want_y) and same_bits(act, want_act), f"call {again}"
        assert np.array_equal(ws, want_ws), f"call {again}: the act's workspace differs"
        assert not counts.any(), f"call {again}: counts left {counts}"


@pytest.mark.parametrize("case", ["F of 320", "iq4_xs", "tune 5", "x not quantized", "up elsewhere"])
def test_calls_the_tail_does_not_take_launch_nothing(lib, case):
    qtype, F, k = Q.Q4_K, 256, 256
    if case == "F of 320":
        qtype, F = Q.Q8_0, 320
    elif case == "iq4_xs":
        qtype = Q.IQ4_XS
    n = 2 * F
    w = np.ascontiguousarray(weights(qtype, n, k, seed=3)[0].reshape(-1))
    x = activations(1, k, seed=5)
    x_bytes, act_bytes = lib.luce_matmul_workspace_bytes(1, k), lib.luce_matmul_workspace_bytes(1, F)
    ws, act_ws = np.zeros(x_bytes // 4 + 4, np.float32), np.zeros(act_bytes // 4 + 4, np.float32)
    y, act = np.zeros((1, n), np.float32), np.zeros((1, F), np.float32)
    p = Params(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, ws.ctypes.data, x_bytes, 1, n, k, int(qtype), 0,
               0 if case == "x not quantized" else REUSE_X, 5 if case == "tune 5" else 0)
    up = y.ctypes.data + 4 * F + (4 if case == "up elsewhere" else 0)
    s = SwigluParams(y.ctypes.data, up, act.ctypes.data, act_ws.ctypes.data, act_bytes, 1, F, n, n)
    counts = np.zeros(4, np.uint32)
    before = lib.emu_launches()
    assert lib.luce_matmul_swiglu(C.byref(p), C.byref(s), counts.ctypes.data, None) == -1   # NOT_TAKEN
    assert lib.emu_launches() == before and not y.any() and not act.any() and not counts.any()
