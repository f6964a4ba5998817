"""Causal conv1d with carried state (cuda/conv1d.cu) against luce/ref/conv1d.py, per segment:
awkward segment lengths, padding segments, the largest slot, in-place state, kernel sizes,
batch invariance."""
import numpy as np
import pytest

from luce.ref.conv1d import causal_conv1d
from tests.kernels.tolerances import tolerance

SEGMENTS = [1, 2, 63, 64, 65, 129]


def test_reference_split_equals_whole():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    s0 = rng.standard_normal((3, 6)).astype(np.float32)
    y, s = causal_conv1d(x, w, s0)
    y1, s1 = causal_conv1d(x[:2], w, s0)
    y2, s2 = causal_conv1d(x[2:], w, s1)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-6)
    assert np.array_equal(s2, s)


def _run(x, w, states, lengths, in_slots, out_slots, in_place, silu=True):
    """x [T, C]; states [n_slots, K-1, C]; segments of `lengths` rows -> (y, new states)."""
    from luce import _cuda_conv1d as kc
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput, csr_indptr

    k = load_kernels()
    T, C = x.shape
    meta = [DeviceBuffer.from_numpy(np.asarray(a, np.int32)) for a in (csr_indptr(lengths), in_slots, out_slots)]
    dx, dw = DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(w)
    y = GuardedOutput(x.shape, fill=0.0)
    state_out = GuardedOutput.holding(states)  # slots nobody writes keep their values
    if in_place:
        state_in_ptr = state_out.ptr
    else:
        state_in = DeviceBuffer.from_numpy(states)
        state_in_ptr = state_in.ptr
    kc.conv1d(dx.ptr, dw.ptr, y.ptr, state_in_ptr, state_out.ptr, *(m.ptr for m in meta),
              len(lengths), C, w.shape[1], max(lengths), silu)
    k.synchronize()
    return y.result(), state_out.result()


def _reference(x, w, states, lengths, in_slots, out_slots, silu=True):
    y = np.zeros_like(x)
    new = states.copy()
    r = 0
    for n, si, so in zip(lengths, in_slots, out_slots):
        if si >= 0:
            y[r:r + n], new[so] = causal_conv1d(x[r:r + n], w, states[si], silu=silu)
        r += n
    return y, new


def conv_inputs(rng, T, C, K, n_slots):
    """x [T, C], w [C, K], states [n_slots, K-1, C] f32."""
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = (rng.standard_normal((C, K)) * 0.5).astype(np.float32)
    states = rng.standard_normal((n_slots, K - 1, C)).astype(np.float32)
    return x, w, states


@pytest.mark.gpu
@pytest.mark.parametrize("C,K", [(300, 4), (10240, 4), (5, 2), (129, 8)])
@pytest.mark.parametrize("in_place", [False, True])
def test_kernel_parity(C, K, in_place):
    rng = np.random.default_rng(C + K)
    lengths = SEGMENTS + [3]                       # last one is padding
    n_slots = 16
    in_slots = [15, 0, 7, 3, 9, 4, -1]             # 15: the largest slot index
    out_slots = in_slots if in_place else [1, 2, 5, 6, 8, 15, -1]
    x, w, states = conv_inputs(rng, sum(lengths), C, K, n_slots)
    y, new = _run(x, w, states, lengths, in_slots, out_slots, in_place)
    ry, rnew = _reference(x, w, states, lengths, in_slots, out_slots)
    rtol, atol = tolerance("conv1d")
    live = slice(0, sum(SEGMENTS))
    np.testing.assert_allclose(y[live], ry[live], rtol=rtol, atol=atol)
    assert np.array_equal(new, rnew)  # states are copied inputs: exact


@pytest.mark.gpu
def test_kernel_without_silu():
    rng = np.random.default_rng(2)
    x, w, states = conv_inputs(rng, 75, 96, 4, 2)
    y, new = _run(x, w, states, [5, 70], [0, 1], [0, 1], True, silu=False)
    ry, rnew = _reference(x, w, states, [5, 70], [0, 1], [0, 1], silu=False)
    rtol, atol = tolerance("conv1d")
    np.testing.assert_allclose(y, ry, rtol=rtol, atol=atol)
    assert np.array_equal(new, rnew)


@pytest.mark.gpu
def test_kernel_batch_invariance():
    """A decode row's output and state are bitwise the same alone or among 63 others and a
    prefill segment."""
    rng = np.random.default_rng(4)
    C, K = 10240, 4
    lengths = [1] * 64 + [129]
    x, w, states = conv_inputs(rng, sum(lengths), C, K, 65)
    slots = list(range(65))
    y, new = _run(x, w, states, lengths, slots, slots, True)
    for s in (0, 31, 63):
        y1, new1 = _run(x[s:s + 1], w, states[s:s + 1], [1], [0], [0], True)
        assert np.array_equal(y1[0], y[s]) and np.array_equal(new1[0], new[s])
    y1, new1 = _run(x[64:], w, states[64:], [129], [0], [0], True)
    assert np.array_equal(y1, y[64:]) and np.array_equal(new1[0], new[64])
