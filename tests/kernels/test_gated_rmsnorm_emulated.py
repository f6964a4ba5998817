"""cuda/gated_rmsnorm.cu's own source on the CPU (tests/kernels/emu) against
luce/ref/gated_rmsnorm.py: both forms of gated_rmsnorm_row (a chunk of 4 a lane at most, up to
128 columns, its x, z and weight loaded together; two passes past that), partial chunks, in
place over x, and a row's bits the same alone and among others. tests/kernels/test_gated_rmsnorm.py
runs the kernel on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ref.gated_rmsnorm import gated_rmsnorm
from tests.kernels.emu import build as emu
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow


class Params(C.Structure):
    """luce_gated_rmsnorm_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, C.c_void_p) for n in "x z weight out".split()] + \
               [("rows", C.c_int64), ("cols", C.c_int64), ("eps", C.c_float)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["gated_rmsnorm.cu"], tmp_path_factory.mktemp("emu_gated_rmsnorm"), "the gated RMSNorm")
    lib.luce_gated_rmsnorm.argtypes = [C.POINTER(Params), C.c_void_p]
    return lib


def run(lib, x, z, w, in_place=False):
    out = x if in_place else np.full(x.shape, np.nan, np.float32)
    p = Params(x.ctypes.data, z.ctypes.data, w.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1], 1e-6)
    assert lib.luce_gated_rmsnorm(C.byref(p), None) == 0
    return out


@pytest.mark.parametrize("cols", [1, 7, 64, 100, 128, 129, 256, 300])
def test_rows_match_the_reference_alone_and_together(lib, cols):
    rng = np.random.default_rng(cols)
    x, z = (rng.standard_normal((5, cols)).astype(np.float32) * 3 for _ in range(2))
    w = rng.standard_normal(cols).astype(np.float32)
    got = run(lib, x, z, w)
    np.testing.assert_allclose(got, gated_rmsnorm(x, z, w, 1e-6), *tolerance("gated_rmsnorm"))
    alone = run(lib, np.ascontiguousarray(x[3:4]), np.ascontiguousarray(z[3:4]), w)
    assert np.array_equal(alone[0], got[3])
    assert np.array_equal(run(lib, x.copy(), z, w, in_place=True), got)
