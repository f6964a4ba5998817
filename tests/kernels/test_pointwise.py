"""Pointwise family (cuda/pointwise.cu) against luce/ref/pointwise.py: broadcast add/mul
(bitwise: one f32 rounding), unary maths in double, row l2norm, awkward sizes and batch
invariance."""
import numpy as np
import pytest

from luce.ref import pointwise as ref
from tests.kernels.tolerances import tolerance

SIZES = [1, 2, 63, 64, 65, 129]


def test_reference_values():
    x = np.array([-1000.0, -1.0, 0.0, 1.0, 1000.0], np.float32)
    assert np.array_equal(ref.softplus(x), np.array([0.0, np.log1p(np.exp(-1.0)), np.log(2.0),
                                                     1.0 + np.log1p(np.exp(-1.0)), 1000.0], np.float32))
    assert ref.sigmoid(np.float32([0.0]))[0] == 0.5 and ref.exp(np.float32([0.0]))[0] == 1.0
    np.testing.assert_allclose(ref.l2norm(np.float32([[3.0, 4.0]]), 0.0), [[0.6, 0.8]], rtol=1e-7)
    with pytest.raises(ValueError):
        ref.unary(x, "tanh")


def _dev(x):
    from luce.ops.cuda_memory import DeviceBuffer
    return DeviceBuffer.from_numpy(np.ascontiguousarray(x, np.float32))


def _strides(shape, full):
    """Element strides of a C-contiguous `shape` broadcast to `full` (both 4 dims)."""
    out, step = [0] * 4, 1
    for d in range(3, -1, -1):
        out[d] = 0 if shape[d] == 1 and full[d] != 1 else step
        step *= shape[d]
    return out


def _binary(op, a, b):
    from luce import _cuda_pointwise as kp
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    full = np.broadcast_shapes(np.shape(a), np.shape(b))
    pad = lambda s: (1,) * (4 - len(s)) + tuple(s)  # noqa: E731
    out = GuardedOutput(full)
    da = _dev(a)
    if np.ndim(b) == 0:
        kp.binary(op, da.ptr, 0, out.ptr, pad(full), _strides(pad(np.shape(a)), pad(full)), [0] * 4, float(b))
    else:
        db = _dev(b)
        kp.binary(op, da.ptr, db.ptr, out.ptr, pad(full), _strides(pad(np.shape(a)), pad(full)),
                  _strides(pad(np.shape(b)), pad(full)))
    k.synchronize()
    return out.result()


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("a_shape,b_shape", [((65, 3, 7), (65, 3, 7)), ((129, 48), (48,)), ((63, 4, 16), (1,)),
                                             ((2, 3, 5), (2, 1, 1)), ((3, 5), (4, 1, 1)), ((1,), (64, 9)),
                                             ((5, 6), ())])
def test_binary_bitwise_with_broadcasting(op, a_shape, b_shape):
    rng = np.random.default_rng(len(a_shape) * 7 + len(b_shape))
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = np.float32(1.7) if b_shape == () else rng.standard_normal(b_shape).astype(np.float32)
    expect = ref.add(a, b) if op == "add" else ref.mul(a, b)
    assert np.array_equal(_binary(op, a, b), expect)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["silu", "sigmoid", "softplus", "exp"])
@pytest.mark.parametrize("n", SIZES + [100_003])
def test_unary_matches_float64_reference(op, n):
    from luce import _cuda_pointwise as kp
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    x = (np.random.default_rng(n).standard_normal(n) * (3 if op == "exp" else 30)).astype(np.float32)
    x[0] = -80.0 if n > 1 else x[0]
    dx, out = _dev(x), GuardedOutput((n,))
    kp.unary(op, dx.ptr, out.ptr, n)
    k.synchronize()
    rtol, atol = tolerance("pointwise_unary")
    np.testing.assert_allclose(out.result(), ref.unary(x, op), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", SIZES)
@pytest.mark.parametrize("cols", [16, 64, 128, 100])
def test_l2norm_and_batch_invariance(rows, cols):
    from luce import _cuda_pointwise as kp
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    x = np.random.default_rng(rows + cols).standard_normal((rows, cols)).astype(np.float32)
    dx, out, one = _dev(x), GuardedOutput((rows, cols)), GuardedOutput((1, cols))
    kp.l2norm(dx.ptr, out.ptr, rows, cols, 1e-6)
    kp.l2norm(dx.ptr + 4 * cols * (rows - 1), one.ptr, 1, cols, 1e-6)
    k.synchronize()
    got = out.result()
    rtol, atol = tolerance("l2norm")
    np.testing.assert_allclose(got, ref.l2norm(x, 1e-6), rtol=rtol, atol=atol)
    assert np.array_equal(one.result()[0], got[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("rows,heads,d", [(1, 24, 256), (23, 24, 256), (5, 12, 128), (3, 2, 7)])
def test_mul_sigmoid_reads_the_gate_in_place(rows, heads, d):
    """a [rows, heads, d] * sigmoid(the gates of qg [rows, heads, 2d]), read as a strided view
    (the gated attention's output gate): the bits of the sigmoid launch then the mul launch on
    the gate copied out, and within the unary tolerance of the float64 reference."""
    from luce import _cuda_pointwise as kp
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    rng = np.random.default_rng(rows * heads + d)
    a = rng.standard_normal((rows, heads, d)).astype(np.float32)
    qg = (rng.standard_normal((rows, heads, 2 * d)) * 8).astype(np.float32)
    gate = np.ascontiguousarray(qg[..., d:])
    da, dqg, dgate = _dev(a), _dev(qg), _dev(gate)
    fused, sig = GuardedOutput((rows, heads, d)), GuardedOutput((rows, heads, d))
    kp.binary("mul_sigmoid", da.ptr, dqg.ptr + 4 * d, fused.ptr, (1, rows, heads, d), (0, heads * d, d, 1),
              (0, 2 * heads * d, 2 * d, 1))
    kp.unary("sigmoid", dgate.ptr, sig.ptr, gate.size)
    k.synchronize()
    dsig = _dev(sig.result())
    apart = GuardedOutput((rows, heads, d))
    kp.binary("mul", da.ptr, dsig.ptr, apart.ptr, (1, rows, heads, d), (0, heads * d, d, 1), (0, heads * d, d, 1))
    k.synchronize()
    got = fused.result()
    assert np.array_equal(got, apart.result())
    rtol, atol = tolerance("pointwise_unary")
    np.testing.assert_allclose(got, ref.mul_sigmoid(a, gate), rtol=rtol, atol=atol)
