"""SwiGLU (cuda/swiglu.cu) against luce/ref/swiglu.py: parity on awkward shapes, the fused
gate|up layout, in-place use, alignment and batch invariance."""
import numpy as np
import pytest

from luce.ref.swiglu import swiglu
from tests.kernels.tolerances import tolerance

ROWS = [1, 2, 63, 64, 65, 129]


def test_reference_values():
    gate = np.array([[0.0, 1.0, -1.0, 20.0]], np.float32)
    up = np.array([[5.0, 2.0, 2.0, 0.5]], np.float32)
    expect = gate / (1 + np.exp(-gate.astype(np.float64))) * up
    np.testing.assert_allclose(swiglu(gate, up), expect, rtol=1e-7)


def _run(gate, up, fused=False, in_place=False, misalign=False):
    """gate, up [rows, cols] -> kernel out. fused: one [rows, 2*cols] input buffer;
    in_place: out overwrites gate; misalign: up sits 4 bytes off a 16-byte boundary."""
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput, input_buffer

    k = load_kernels()
    rows, cols = gate.shape
    out = GuardedOutput(gate.shape)
    keep = []
    if fused:
        both = DeviceBuffer.from_numpy(np.concatenate([gate, up], axis=1))
        keep.append(both)
        ke.swiglu(both.ptr, both.ptr + 4 * cols, out.ptr, rows, cols, 2 * cols, 2 * cols, cols)
    else:
        off = 4 if misalign else 0
        dup = DeviceBuffer(up.nbytes + 16)
        dup.upload(up, off)
        keep.append(dup)
        dgate = input_buffer(gate, out, in_place)
        keep.append(dgate)
        ke.swiglu(dgate.ptr, dup.ptr + off, out.ptr, rows, cols)
    k.synchronize()
    return out.result()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", [1, 7, 1024, 17408])
def test_kernel_parity(rows, cols):
    rng = np.random.default_rng(rows * 13 + cols)
    gate, up = (rng.standard_normal((2, rows, cols)) * 4).astype(np.float32)
    rtol, atol = tolerance("swiglu")
    np.testing.assert_allclose(_run(gate, up), swiglu(gate, up), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [5, 17408])
def test_kernel_layouts_agree_bitwise(cols):
    rng = np.random.default_rng(cols)
    gate, up = (rng.standard_normal((2, 65, cols)) * 4).astype(np.float32)
    plain = _run(gate, up)
    assert np.array_equal(_run(gate, up, fused=True), plain)
    assert np.array_equal(_run(gate, up, in_place=True), plain)
    assert np.array_equal(_run(gate, up, misalign=True), plain)


@pytest.mark.gpu
def test_kernel_batch_invariance():
    rng = np.random.default_rng(3)
    gate, up = rng.standard_normal((2, 64, 17408)).astype(np.float32)
    together = _run(gate, up)
    for r in (0, 10, 63):
        assert np.array_equal(_run(gate[r:r + 1], up[r:r + 1])[0], together[r])
