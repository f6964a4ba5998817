"""The cpu backend's row norms (luce/cpu/norms.c): rmsnorm, l2norm and gated_rmsnorm against
luce/ref/rmsnorm.py, luce/ref/pointwise.py and luce/ref/gated_rmsnorm.py, and bitwise against
themselves (a row alone or among others, on 1, 2 or 4 threads)."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref.gated_rmsnorm import gated_rmsnorm as ref_gated
from luce.ref.pointwise import l2norm as ref_l2norm
from luce.ref.rmsnorm import rmsnorm as ref_rmsnorm
from tests.kernels.cpu_sequence_harness import cpu_backend, same_bits, under_threads
from tests.kernels.tolerances import tolerance

ROWS = [1, 2, 63, 64, 65, 129]
DIMS = [1, 15, 16, 17, 128, 1536]


@pytest.fixture(scope="module")
def cpu():
    return cpu_backend()


def rows_of(rng, rows, d, scale=1.0):
    return (rng.standard_normal((rows, d)) * scale).astype(np.float32)


def run(cpu, name, x, z, w, eps):
    if name == "rmsnorm":
        return cpu.rmsnorm(x, w, eps), ref_rmsnorm(x, w, eps), tolerance("rmsnorm")
    if name == "l2norm":
        return cpu.l2norm(x, eps), ref_l2norm(x, eps), tolerance("l2norm")
    return cpu.gated_rmsnorm(x, z, w, eps), ref_gated(x, z, w, eps), tolerance("gated_rmsnorm")


NORMS = ["rmsnorm", "l2norm", "gated_rmsnorm"]


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("rows", ROWS)
def test_parity_with_reference(cpu, name, rows, d):
    rng = np.random.default_rng(rows * 31 + d)
    x, z = rows_of(rng, rows, d, 3.0), rows_of(rng, rows, d, 4.0)
    w = rng.standard_normal(d).astype(np.float32)
    got, want, (rtol, atol) = run(cpu, name, x, z, w, 1e-6)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", NORMS)
def test_heads_layout_and_extreme_scales(cpu, name):
    """[T, H, D] inputs (per-head q/k norms), tiny and huge magnitudes, eps 1e-6 and 0."""
    rng = np.random.default_rng(1)
    for scale, eps in ((1e-20, 1e-6), (1e-3, 0.0), (1e15, 1e-6)):
        x = (rng.standard_normal((5, 7, 128)) * scale).astype(np.float32)
        z = rng.standard_normal((5, 7, 128)).astype(np.float32)
        w = rng.standard_normal(128).astype(np.float32)
        got, want, (rtol, atol) = run(cpu, name, x, z, w, eps)
        assert got.shape == (5, 7, 128)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", NORMS)
def test_row_bitwise_alone_among_others_and_any_thread_count(cpu, name):
    rng = np.random.default_rng(2)
    d = 1536
    x, z = rows_of(rng, 600, d), rows_of(rng, 600, d)   # enough values to split over threads
    w = rng.standard_normal(d).astype(np.float32)
    alone = run(cpu, name, x[17:18], z[17:18], w, 1e-6)[0]
    for n in (1, 2, 64, 129, 600):
        lo = max(0, 17 - n // 2)
        got = run(cpu, name, x[lo:lo + n], z[lo:lo + n], w, 1e-6)[0]
        if lo <= 17 < lo + n:
            assert same_bits(got[17 - lo], alone[0]), n
    runs = under_threads(lambda: run(cpu, name, x, z, w, 1e-6)[0])
    assert all(same_bits(runs[0], r) for r in runs[1:])
    assert same_bits(runs[0][17], alone[0])


@pytest.mark.parametrize("name", NORMS)
def test_nan_and_inf_propagate_like_the_reference(cpu, name):
    rng = np.random.default_rng(3)
    x, z = rows_of(rng, 4, 64), rows_of(rng, 4, 64)
    w = rng.standard_normal(64).astype(np.float32)
    x[1, 5] = np.nan
    x[2, 9] = np.inf
    z[3, 0] = np.nan
    with np.errstate(invalid="ignore"):   # inf * 0 in the reference, as in the kernel
        got, want, (rtol, atol) = run(cpu, name, x, z, w, 1e-6)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1]).all() and np.isfinite(got[0]).all()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)   # NaN where the reference has NaN


def test_bad_shapes_raise(cpu):
    x = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError, match="weight"):
        cpu.rmsnorm(x, np.ones(7, np.float32), 1e-6)
    with pytest.raises(ValueError, match="one shape"):
        cpu.gated_rmsnorm(x, np.ones((3, 7), np.float32), np.ones(8, np.float32), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        cpu.gated_rmsnorm(x, x, np.ones(9, np.float32), 1e-6)
    with pytest.raises(ValueError, match="sizes"):
        cpu.l2norm(x, float("nan"))
    assert cpu.rmsnorm(np.ones((0, 8), np.float32), np.ones(8, np.float32), 1e-6).shape == (0, 8)
