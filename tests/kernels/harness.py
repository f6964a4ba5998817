"""GPU test harness: outputs live between guard bands whose bytes must survive the launch."""
from __future__ import annotations

import numpy as np

GUARD_BYTES = 4096
GUARD_FILL = 0xA5


class GuardedOutput:
    """A device output of `shape`/`dtype` with GUARD_BYTES of sentinel before and after."""

    def __init__(self, shape, dtype=np.float32, fill=np.nan):
        from luce.ops.cuda_memory import DeviceBuffer

        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.buf = DeviceBuffer(self.nbytes + 2 * GUARD_BYTES)
        self.buf.upload(np.full(GUARD_BYTES, GUARD_FILL, np.uint8), 0)
        self.buf.upload(np.full(self.shape, fill, self.dtype), GUARD_BYTES)
        self.buf.upload(np.full(GUARD_BYTES, GUARD_FILL, np.uint8), GUARD_BYTES + self.nbytes)

    @classmethod
    def holding(cls, host: np.ndarray) -> "GuardedOutput":
        """An output that starts as a copy of `host` (in-place kernels; state pools whose
        rows nobody writes must keep their values)."""
        out = cls(host.shape, host.dtype, fill=0)
        out.buf.upload(host, GUARD_BYTES)
        return out

    @property
    def ptr(self) -> int:
        return self.buf.ptr + GUARD_BYTES

    def raw(self) -> np.ndarray:
        """The output as the kernel left it, unchecked (for outputs that must hold NaN)."""
        return self.buf.download(self.shape, self.dtype, GUARD_BYTES)

    def result(self) -> np.ndarray:
        """The output, after checking both guard bands are intact and no NaN was written."""
        before = self.buf.download(GUARD_BYTES, np.uint8, 0)
        after = self.buf.download(GUARD_BYTES, np.uint8, GUARD_BYTES + self.nbytes)
        assert (before == GUARD_FILL).all(), "kernel wrote before its output"
        assert (after == GUARD_FILL).all(), "kernel wrote past its output"
        out = self.raw()
        if out.dtype.kind == "f":
            assert not np.isnan(out).any(), "output holds NaN (unwritten or computed)"
        return out


def input_buffer(host: np.ndarray, out: GuardedOutput, in_place: bool):
    """Where a kernel reads `host` from: `out` itself, preloaded with host, when in_place (the
    kernel overwrites its input), else a fresh device copy. Either has .ptr."""
    from luce.ops.cuda_memory import DeviceBuffer

    if in_place:
        out.buf.upload(host, GUARD_BYTES)
        return out
    return DeviceBuffer.from_numpy(host)


def csr_indptr(lengths) -> np.ndarray:
    """[0, l0, l0+l1, ...] int32 [len(lengths)+1]: segment row offsets."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
