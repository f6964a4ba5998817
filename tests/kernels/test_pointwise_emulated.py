"""cuda/pointwise.cu's own source on the CPU (tests/kernels/emu): the binary kernel's mul_sigmoid
(the gated attention's output gate, read in place from the q | gate projection as a strided view)
equals the unary sigmoid launch then the mul launch bit for bit, and the float64 reference within
the unary tolerance; an unknown op is refused. tests/kernels/test_pointwise.py runs it on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ref import pointwise as ref
from tests.kernels.emu import build as emu
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow
_P = C.c_void_p
OPS = {"add": 0, "mul": 1, "mul_sigmoid": 2}


class Binary(C.Structure):
    """luce_binary_params (cuda/luce_ops.h), field for field."""
    _fields_ = [("a", _P), ("b", _P), ("out", _P), ("shape", C.c_int64 * 4), ("a_strides", C.c_int64 * 4),
                ("b_strides", C.c_int64 * 4), ("b_scalar", C.c_float), ("op", C.c_int32)]


class Unary(C.Structure):
    """luce_unary_params (cuda/luce_ops.h), field for field."""
    _fields_ = [("x", _P), ("out", _P), ("n", C.c_int64), ("op", C.c_int32)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["pointwise.cu"], tmp_path_factory.mktemp("emu_pointwise"), "the pointwise kernels")
    lib.luce_binary.argtypes = [C.POINTER(Binary), _P]
    lib.luce_unary.argtypes = [C.POINTER(Unary), _P]
    return lib


def binary(lib, op, a, b_ptr, out, shape, a_strides, b_strides, status=0):
    p = Binary(a.ctypes.data, b_ptr, out.ctypes.data, (C.c_int64 * 4)(*shape), (C.c_int64 * 4)(*a_strides),
               (C.c_int64 * 4)(*b_strides), 0.0, OPS.get(op, 7))
    assert lib.luce_binary(C.byref(p), None) == status


@pytest.mark.parametrize("rows,heads,d", [(1, 3, 8), (5, 2, 7)])
def test_mul_sigmoid_of_a_strided_gate(lib, rows, heads, d):
    rng = np.random.default_rng(rows + d)
    a = rng.standard_normal((rows, heads, d)).astype(np.float32)
    qg = (rng.standard_normal((rows, heads, 2 * d)) * 8).astype(np.float32)
    qg[0, 0, d] = -200.0   # sigmoid underflows to 0 in f32
    gate = np.ascontiguousarray(qg[..., d:])
    shape, dense, strided = (1, rows, heads, d), (0, heads * d, d, 1), (0, 2 * heads * d, 2 * d, 1)
    fused = np.full((rows, heads, d), np.nan, np.float32)
    binary(lib, "mul_sigmoid", a, qg.ctypes.data + 4 * d, fused, shape, dense, strided)
    sig = np.full(gate.shape, np.nan, np.float32)
    assert lib.luce_unary(C.byref(Unary(gate.ctypes.data, sig.ctypes.data, gate.size, 1)), None) == 0
    apart = np.full((rows, heads, d), np.nan, np.float32)
    binary(lib, "mul", a, sig.ctypes.data, apart, shape, dense, dense)
    assert np.array_equal(fused, apart)
    assert fused[0, 0, 0] == 0.0 * a[0, 0, 0]
    rtol, atol = tolerance("pointwise_unary")
    np.testing.assert_allclose(fused, ref.mul_sigmoid(a, gate), rtol=rtol, atol=atol)


def test_an_unknown_op_is_refused(lib):
    a = np.ones(4, np.float32)
    out = np.full(4, np.nan, np.float32)
    binary(lib, "tanh", a, a.ctypes.data, out, (1, 1, 1, 4), (0, 0, 0, 1), (0, 0, 0, 1), status=1)
    assert np.isnan(out).all()
