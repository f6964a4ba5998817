"""RMSNorm: reference properties on the CPU; kernel parity and batch invariance on the GPU."""
import numpy as np
import pytest

from luce.ref.rmsnorm import rmsnorm
from tests.kernels.tolerances import tolerance

ROWS = [1, 2, 63, 64, 65, 129]
COLS = [1, 5, 128, 1536, 5120]


def test_reference_matches_definition():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7)).astype(np.float32)
    w = rng.standard_normal(7).astype(np.float32)
    expect = [row / np.sqrt(np.mean(row.astype(np.float64) ** 2) + 1e-6) * w for row in x]
    np.testing.assert_allclose(rmsnorm(x, w, 1e-6), np.array(expect), rtol=1e-6)


def test_reference_is_batch_invariant():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((65, 1536)).astype(np.float32)
    w = rng.standard_normal(1536).astype(np.float32)
    together = rmsnorm(x, w, 1e-6)
    for r in (0, 31, 64):
        assert np.array_equal(together[r], rmsnorm(x[r:r + 1], w, 1e-6)[0])


def _run_kernel(x, w, eps):
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    dx, dw = DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(w)
    out = GuardedOutput(x.shape)
    k.rmsnorm(dx.ptr, dw.ptr, out.ptr, x.shape[0], x.shape[1], eps)
    k.synchronize()
    return out.result()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", COLS)
def test_kernel_parity(rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    rtol, atol = tolerance("rmsnorm")
    np.testing.assert_allclose(_run_kernel(x, w, 1e-6), rmsnorm(x, w, 1e-6), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [256, 5120])  # one warp per row / one block per row
def test_kernel_batch_invariance(cols):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64 * 3, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    together = _run_kernel(x, w, 1e-6)
    for r in (0, 17, 64 * 3 - 1):
        assert np.array_equal(together[r], _run_kernel(x[r:r + 1], w, 1e-6)[0])


@pytest.mark.gpu
def test_kernel_paths_agree_bitwise():
    """Past 512 rows a 5120-wide launch takes the two-pass path instead of the in-register
    one; a row's bits must not change (same chunks, same order)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((600, 5120)).astype(np.float32)
    w = rng.standard_normal(5120).astype(np.float32)
    many = _run_kernel(x, w, 1e-6)
    few = _run_kernel(x[590:], w, 1e-6)
    assert np.array_equal(many[590:], few)

