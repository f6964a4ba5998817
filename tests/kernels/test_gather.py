"""Row gather/scatter copy (cuda/gather.cu) against luce/ref/gather.py: index arrays,
skipped copies, strides, every word size (16, 4 and 1 bytes) and the largest slot index."""
import numpy as np
import pytest

from luce.ref.gather import gather_rows


def test_reference_semantics():
    src = np.arange(12, dtype=np.float32).reshape(4, 3)
    dst = np.zeros((5, 3), np.float32)
    out = gather_rows(src, dst, np.array([3, 0, -1]), np.array([4, 1, 2]))
    assert np.array_equal(out[4], src[3]) and np.array_equal(out[1], src[0])
    assert not out[[0, 2, 3]].any() and not dst.any()
    with pytest.raises(IndexError):
        gather_rows(src, dst, np.array([4]), np.array([0]))
    with pytest.raises(ValueError):
        gather_rows(src, dst.astype(np.float64), None, None, n=1)


def _run(src, dst, src_rows, dst_rows, n, stride_pad=0):
    """src [Ns, R] uint8, dst [Nd, R] uint8; rows padded by stride_pad bytes on the device."""
    from luce import _cuda_gather as kg
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    pad = lambda a: np.pad(a, ((0, 0), (0, stride_pad)), constant_values=0x5A)  # noqa: E731
    dsrc = DeviceBuffer.from_numpy(pad(src))
    out = GuardedOutput.holding(pad(dst))
    idx = [DeviceBuffer.from_numpy(np.asarray(a, np.int64)) if a is not None else None
           for a in (src_rows, dst_rows)]
    stride = src.shape[1] + stride_pad
    kg.gather(dsrc.ptr, out.ptr, idx[0].ptr if idx[0] else 0, idx[1].ptr if idx[1] else 0, n,
              src.shape[1], stride, dst.shape[1] + stride_pad)
    k.synchronize()
    got = out.result()
    assert (got[:, src.shape[1]:] == 0x5A).all(), "padding between rows was written"
    return got[:, :src.shape[1]]


@pytest.mark.gpu
@pytest.mark.parametrize("row_bytes,stride_pad", [(16 * 1024, 0), (3 * 1024 * 1024, 16), (1028, 4), (37, 3)])
def test_kernel_matches_reference(row_bytes, stride_pad):
    rng = np.random.default_rng(row_bytes)
    n_src, n_dst = 9, 12
    src = rng.integers(0, 256, (n_src, row_bytes), dtype=np.uint8)
    dst = rng.integers(0, 256, (n_dst, row_bytes), dtype=np.uint8)
    src_rows = np.array([8, 0, 3, -1, 5, 2])
    dst_rows = np.array([11, 4, -1, 7, 0, 1])  # 11: the largest slot
    got = _run(src, dst, src_rows, dst_rows, len(src_rows), stride_pad)
    assert np.array_equal(got, gather_rows(src, dst, src_rows, dst_rows))


@pytest.mark.gpu
def test_kernel_identity_indices():
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, (6, 4096), dtype=np.uint8)
    dst = np.zeros((6, 4096), np.uint8)
    got = _run(src, dst, None, np.array([5, 4, 3]), 3)
    assert np.array_equal(got, gather_rows(src, dst, None, np.array([5, 4, 3])))
    got = _run(src, dst, None, None, 6)
    assert np.array_equal(got, src)
