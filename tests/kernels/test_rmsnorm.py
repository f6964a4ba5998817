"""RMSNorm and the fused residual variant: reference properties on the CPU; kernel parity,
aliasing, alignment and batch invariance on the GPU."""
import numpy as np
import pytest

from luce.ref.rmsnorm import rmsnorm, rmsnorm_residual
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


def test_residual_reference_is_add_then_norm():
    rng = np.random.default_rng(2)
    x, res = rng.standard_normal((2, 4, 9)).astype(np.float32)
    w = rng.standard_normal(9).astype(np.float32)
    out, total = rmsnorm_residual(x, res, w, 1e-6)
    assert total.dtype == np.float32 and np.array_equal(total, x + res)
    assert np.array_equal(out, rmsnorm(x + res, w, 1e-6))
    with pytest.raises(ValueError, match="differ"):
        rmsnorm_residual(x, res[:2], w, 1e-6)


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


def _run_residual(x, res, w, eps, alias=None, misalign=False):
    """Runs luce_rmsnorm_residual; alias: None, 'sum_is_x' or 'out_is_residual'.
    misalign: x sits 4 bytes past a 16-byte boundary (scalar loads)."""
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GUARD_BYTES, GuardedOutput

    k = load_kernels()
    rows, cols = x.shape
    off = 4 if misalign else 0
    dx = DeviceBuffer(x.nbytes + 16)
    dx.upload(x, off)
    dres, dw = DeviceBuffer.from_numpy(res), DeviceBuffer.from_numpy(w)
    out, total = GuardedOutput(x.shape), GuardedOutput(x.shape)
    sum_ptr, out_ptr = total.ptr, out.ptr
    if alias == "sum_is_x":
        total.buf.upload(x, GUARD_BYTES)
        sum_ptr = total.ptr
        ke.rmsnorm_residual(sum_ptr, dres.ptr, dw.ptr, sum_ptr, out_ptr, rows, cols, eps)
    elif alias == "out_is_residual":
        out.buf.upload(res, GUARD_BYTES)
        ke.rmsnorm_residual(dx.ptr + off, out_ptr, dw.ptr, sum_ptr, out_ptr, rows, cols, eps)
    else:
        ke.rmsnorm_residual(dx.ptr + off, dres.ptr, dw.ptr, sum_ptr, out_ptr, rows, cols, eps)
    k.synchronize()
    return out.result(), total.result()


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
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", [3, 128, 5120])
def test_residual_kernel_parity(rows, cols):
    rng = np.random.default_rng(rows * 7 + cols)
    x, res = (rng.standard_normal((2, rows, cols)) * 2).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    out, total = _run_residual(x, res, w, 1e-6)
    ref_out, ref_total = rmsnorm_residual(x, res, w, 1e-6)
    assert np.array_equal(total, ref_total)  # one f32 add: exact
    rtol, atol = tolerance("rmsnorm_residual")
    np.testing.assert_allclose(out, ref_out, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("alias", ["sum_is_x", "out_is_residual"])
def test_residual_kernel_in_place(alias):
    rng = np.random.default_rng(3)
    x, res = rng.standard_normal((2, 65, 5120)).astype(np.float32)
    w = rng.standard_normal(5120).astype(np.float32)
    expect = _run_residual(x, res, w, 1e-6)
    got = _run_residual(x, res, w, 1e-6, alias=alias)
    assert np.array_equal(got[0], expect[0]) and np.array_equal(got[1], expect[1])


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [256, 5120])
def test_residual_kernel_alignment_and_batch_invariance(cols):
    rng = np.random.default_rng(4)
    x, res = rng.standard_normal((2, 64, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    out, _ = _run_residual(x, res, w, 1e-6)
    out_misaligned, _ = _run_residual(x, res, w, 1e-6, misalign=True)
    assert np.array_equal(out, out_misaligned)
    for r in (0, 40, 63):
        assert np.array_equal(out[r], _run_residual(x[r:r + 1], res[r:r + 1], w, 1e-6)[0][0])


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True])
def test_kernel_paths_agree_bitwise(residual):
    """Past 512 rows a 5120-wide launch takes the two-pass path instead of the in-register
    one; a row's bits must not change (same chunks, same order)."""
    rng = np.random.default_rng(8)
    x, res = rng.standard_normal((2, 600, 5120)).astype(np.float32)
    w = rng.standard_normal(5120).astype(np.float32)
    if residual:
        many = _run_residual(x, res, w, 1e-6)[0]
        few = _run_residual(x[590:], res[590:], w, 1e-6)[0]
    else:
        many = _run_kernel(x, w, 1e-6)
        few = _run_kernel(x[590:], w, 1e-6)
    assert np.array_equal(many[590:], few)

