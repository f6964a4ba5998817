"""The cpu backend's elementwise maths and rotary (luce/cpu/pointwise.c, luce/cpu/rotary.c)
against luce/ref/pointwise.py, luce/ref/swiglu.py and luce/ref/rotary.py, including the
special values (inf, NaN, overflow, underflow, subnormals) and the double exp the kernels
share, and bitwise against themselves on 1, 2 or 4 threads."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref import pointwise as ref_pointwise
from luce.ref import rotary as ref_rotary
from luce.ref import swiglu as ref_swiglu
from tests.kernels.cpu_sequence_harness import cpu_backend, same_bits, under_threads
from tests.kernels.tolerances import tolerance

UNARY = ["silu", "sigmoid", "softplus", "exp"]
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 88.7, 88.8, -87.3, -103.9,
                    -104.0, -110.0, 700.0, -700.0, 710.0, -746.0, 3e38, -3e38, 0.5, -0.5, 20.0, -20.0],
                   dtype=np.float32)


@pytest.fixture(scope="module")
def cpu():
    return cpu_backend()


def reference(op, x):
    with np.errstate(all="ignore"):   # the float64 reference overflows where the result is inf or 0
        return ref_pointwise.unary(x, op)


@pytest.mark.parametrize("op", UNARY)
def test_unary_parity_over_the_range_and_special_values(cpu, op):
    rng = np.random.default_rng(len(op))
    x = np.concatenate([(rng.standard_normal(200_000) * 30).astype(np.float32),
                        rng.uniform(-1, 1, 10_000).astype(np.float32), SPECIAL])
    got, want = getattr(cpu, op)(x), reference(op, x)
    rtol, atol = tolerance("pointwise_unary")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)   # NaN exactly where the reference has NaN
    assert got.dtype == np.float32


@pytest.mark.parametrize("op", UNARY)
def test_unary_keeps_shape_and_is_thread_invariant(cpu, op):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 70_001)) * 8).astype(np.float32)   # above the serial threshold
    runs = under_threads(lambda: getattr(cpu, op)(x))
    assert runs[0].shape == x.shape
    assert all(same_bits(runs[0], r) for r in runs[1:])
    assert same_bits(getattr(cpu, op)(x[1:2, 5:9]), runs[0][1:2, 5:9])
    assert same_bits(getattr(cpu, op)(x[:, ::2]), runs[0][:, ::2])   # strided input


@pytest.mark.parametrize("shape", [(1, 8960), (63, 17), (129, 64), (2, 3, 5)])
def test_swiglu_parity_and_invariance(cpu, shape):
    rng = np.random.default_rng(sum(shape))
    gate = (rng.standard_normal(shape) * 6).astype(np.float32)
    up = rng.standard_normal(shape).astype(np.float32)
    gate.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, -200.0]
    with np.errstate(all="ignore"):
        got, want = cpu.swiglu(gate, up), ref_swiglu.swiglu(gate, up)
    rtol, atol = tolerance("swiglu")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert same_bits(cpu.swiglu(gate[:1], up[:1]), got[:1])
    with pytest.raises(ValueError, match="differ"):
        cpu.swiglu(gate, up[..., :-1])


ROPE_CASES = [  # (T, H, D, rope_dim, theta, sections)
    (1, 12, 128, 128, 1e6, ()), (63, 2, 128, 128, 1e6, ()), (65, 3, 64, 32, 1e4, ()),
    (129, 5, 256, 64, 1e7, (11, 11, 10, 0)), (2, 1, 40, 10, 500.0, ()), (64, 4, 16, 0, 1e4, ()),
    (7, 2, 32, 8, 1e7, (2, 1, 1, 0)),
]


@pytest.mark.parametrize("T,H,D,rope_dim,theta,sections", ROPE_CASES)
def test_rope_parity(cpu, T, H, D, rope_dim, theta, sections):
    rng = np.random.default_rng(T + D)
    x = (rng.standard_normal((T, H, D)) * 4).astype(np.float32)
    pos = rng.integers(0, 40_000, size=T)
    got, want = cpu.rope(x, pos, rope_dim, theta, sections), ref_rotary.rope(x, pos, rope_dim, theta, sections)
    rtol, atol = tolerance("rotary")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert same_bits(got[..., rope_dim:], x[..., rope_dim:])   # pass-through dims
    if sections:
        pos4 = np.stack([pos, pos // 2, pos // 3, pos + 5], axis=1)
        np.testing.assert_allclose(cpu.rope(x, pos4, rope_dim, theta, sections),
                                   ref_rotary.rope(x, pos4, rope_dim, theta, sections), rtol=rtol, atol=atol)


def test_rope_row_bitwise_alone_and_any_thread_count(cpu):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 12, 128)).astype(np.float32)
    pos = np.arange(1000, 1300)
    runs = under_threads(lambda: cpu.rope(x, pos, 128, 1e6))
    assert all(same_bits(runs[0], r) for r in runs[1:])
    assert same_bits(cpu.rope(x[123:124], pos[123:124], 128, 1e6), runs[0][123:124])


def test_rope_bad_arguments(cpu):
    x = np.ones((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="even"):
        cpu.rope(x, np.arange(3), 7, 1e4)
    with pytest.raises(ValueError, match="rope_dim <= D"):
        cpu.rope(x, np.arange(3), 10, 1e4)
    with pytest.raises(ValueError, match="positions"):
        cpu.rope(x, np.arange(4), 8, 1e4)
    with pytest.raises(ValueError, match="plain rotary"):
        cpu.rope(x, np.zeros((3, 4), np.int64), 8, 1e4)
    with pytest.raises(ValueError, match="4 section"):
        cpu.rope(x, np.arange(3), 8, 1e4, (1, 2))
