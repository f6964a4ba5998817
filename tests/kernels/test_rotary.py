"""Rotary (cuda/rotary.cu) against luce/ref/rotary.py: plain and partial NEOX rotary, IMROPE
sections, large positions, strided in-place use and batch invariance."""
import numpy as np
import pytest

from luce.ref.rotary import rope
from tests.kernels.tolerances import tolerance

TOKENS = [1, 2, 63, 64, 65, 129]
QWEN35_SECTIONS = (11, 11, 10, 0)


def test_reference_text_positions_reduce_mrope_to_plain():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 7, 1000, 262143])
    assert np.array_equal(rope(x, pos, 64, 1e7, QWEN35_SECTIONS), rope(x, pos, 64, 1e7))


def _run(x, positions, rope_dim, theta, sections=(), in_place=False):
    """x [T, H, D] contiguous -> kernel output; positions [T] or [T, 4]."""
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput, input_buffer

    k = load_kernels()
    T, H, D = x.shape
    pos = np.ascontiguousarray(positions, dtype=np.int32)
    dpos = DeviceBuffer.from_numpy(pos)
    out = GuardedOutput(x.shape)
    src = input_buffer(x, out, in_place)
    ke.rotary(src.ptr, out.ptr, dpos.ptr, T, H, D, rope_dim, theta, sections,
              n_pos=1 if pos.ndim == 1 else 4)
    k.synchronize()
    return out.result()


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("heads,dim,rope_dim", [(24, 256, 64), (5, 128, 128), (3, 80, 40)])
def test_kernel_parity_plain(tokens, heads, dim, rope_dim):
    rng = np.random.default_rng(tokens + heads)
    x = (rng.standard_normal((tokens, heads, dim)) * 3).astype(np.float32)
    pos = rng.integers(0, 262144, tokens)
    rtol, atol = tolerance("rotary")
    np.testing.assert_allclose(_run(x, pos, rope_dim, 1e7), rope(x, pos, rope_dim, 1e7),
                               rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 65])
def test_kernel_parity_imrope(tokens):
    rng = np.random.default_rng(tokens)
    x = (rng.standard_normal((tokens, 7, 256)) * 3).astype(np.float32)
    pos4 = rng.integers(0, 40000, (tokens, 4))
    rtol, atol = tolerance("rotary")
    np.testing.assert_allclose(_run(x, pos4, 64, 1e7, QWEN35_SECTIONS),
                               rope(x, pos4, 64, 1e7, QWEN35_SECTIONS), rtol=rtol, atol=atol)
    pos = pos4[:, 0]  # text rows: one position for every section
    np.testing.assert_allclose(_run(x, pos, 64, 1e7, QWEN35_SECTIONS),
                               rope(x, pos, 64, 1e7), rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_kernel_in_place_and_batch_invariance():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 4, 256)).astype(np.float32)
    pos = np.arange(1000, 1064)
    together = _run(x, pos, 64, 1e7)
    assert np.array_equal(_run(x, pos, 64, 1e7, in_place=True), together)
    for t in (0, 33, 63):
        assert np.array_equal(_run(x[t:t + 1], pos[t:t + 1], 64, 1e7)[0], together[t])


@pytest.mark.gpu
def test_kernel_strided_q_inside_fused_projection():
    """q heads inside a [T, H, 2D] buffer (query | gate per head) rotate in place; the gate
    halves and the buffer's guard bands stay untouched."""
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    rng = np.random.default_rng(11)
    T, H, D = 65, 3, 256
    fused = rng.standard_normal((T, H, 2 * D)).astype(np.float32)
    pos = np.arange(T, dtype=np.int32) * 977
    buf = GuardedOutput.holding(fused)
    dpos = DeviceBuffer.from_numpy(pos)
    ke.rotary(buf.ptr, buf.ptr, dpos.ptr, T, H, D, 64, 1e7, (), x_row_stride=H * 2 * D,
              x_head_stride=2 * D, out_row_stride=H * 2 * D, out_head_stride=2 * D)
    k.synchronize()
    got = buf.result()
    assert np.array_equal(got[..., D:], fused[..., D:])
    rtol, atol = tolerance("rotary")
    np.testing.assert_allclose(got[..., :D], rope(fused[..., :D].copy(), pos, 64, 1e7), rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_kernel_rejects_bad_arguments():
    from luce._cuda import KernelError

    x = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(KernelError, match="luce_rotary"):
        _run(x, np.zeros(2), 3, 1e4)  # odd rope_dim
    with pytest.raises(KernelError, match="luce_rotary"):
        _run(x, np.zeros((2, 4)), 8, 1e4)  # four positions without sections
