"""Gated RMSNorm (cuda/gated_rmsnorm.cu) against luce/ref/gated_rmsnorm.py: reference
properties on the CPU; kernel parity, in-place use, alignment and batch invariance on GPU."""
import numpy as np
import pytest

from luce.ref.gated_rmsnorm import gated_rmsnorm
from luce.ref.rmsnorm import rmsnorm
from tests.kernels.tolerances import tolerance

TOKENS = [1, 2, 63, 64, 65, 129]


def test_reference_is_rmsnorm_times_silu_gate():
    rng = np.random.default_rng(0)
    x, z = rng.standard_normal((2, 6, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    silu = z.astype(np.float64) / (1 + np.exp(-z.astype(np.float64)))
    np.testing.assert_allclose(gated_rmsnorm(x, z, w, 1e-6), rmsnorm(x, w, 1e-6) * silu, rtol=1e-6)


def _run(x, z, w, eps, in_place=False, misalign=False):
    """x, z [rows, cols] -> kernel output; in_place writes over x; misalign offsets z by 4 B."""
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput, input_buffer

    k = load_kernels()
    rows, cols = x.shape
    off = 4 if misalign else 0
    dz = DeviceBuffer(z.nbytes + 16)
    dz.upload(z, off)
    dw = DeviceBuffer.from_numpy(w)
    out = GuardedOutput(x.shape)
    dx = input_buffer(x, out, in_place)
    ke.gated_rmsnorm(dx.ptr, dz.ptr + off, dw.ptr, out.ptr, rows, cols, eps)
    k.synchronize()
    return out.result()


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("heads,dim", [(48, 128), (5, 128), (3, 7), (1, 5120)])
def test_kernel_parity(tokens, heads, dim):
    rng = np.random.default_rng(tokens * 31 + heads * dim)
    x, z = (rng.standard_normal((2, tokens * heads, dim)) * 3).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    rtol, atol = tolerance("gated_rmsnorm")
    np.testing.assert_allclose(_run(x, z, w, 1e-6), gated_rmsnorm(x, z, w, 1e-6), rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_kernel_extreme_gates_stay_finite():
    x = np.ones((2, 128), np.float32)
    z = np.full((2, 128), -200.0, np.float32)
    z[1] = 200.0
    w = np.ones(128, np.float32)
    got = _run(x, z, w, 1e-6)
    assert np.all(got[0] == 0.0)
    np.testing.assert_allclose(got[1], gated_rmsnorm(x, z, w, 1e-6)[1], rtol=1e-6)


@pytest.mark.gpu
def test_kernel_in_place_alignment_and_batch_invariance():
    rng = np.random.default_rng(5)
    x, z = rng.standard_normal((2, 64 * 48, 128)).astype(np.float32)
    w = rng.standard_normal(128).astype(np.float32)
    together = _run(x, z, w, 1e-6)
    assert np.array_equal(_run(x, z, w, 1e-6, in_place=True), together)
    assert np.array_equal(_run(x, z, w, 1e-6, misalign=True), together)
    for t in (0, 21, 63):
        rows = slice(t * 48, (t + 1) * 48)
        assert np.array_equal(_run(x[rows], z[rows], w, 1e-6), together[rows])
