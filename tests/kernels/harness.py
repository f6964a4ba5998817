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

    @property
    def ptr(self) -> int:
        return self.buf.ptr + GUARD_BYTES

    def result(self) -> np.ndarray:
        """The output, after checking both guard bands are intact and no NaN was written."""
        before = self.buf.download(GUARD_BYTES, np.uint8, 0)
        after = self.buf.download(GUARD_BYTES, np.uint8, GUARD_BYTES + self.nbytes)
        assert (before == GUARD_FILL).all(), "kernel wrote before its output"
        assert (after == GUARD_FILL).all(), "kernel wrote past its output"
        out = self.buf.download(self.shape, self.dtype, GUARD_BYTES)
        if out.dtype.kind == "f":
            assert not np.isnan(out).any(), "output holds NaN (unwritten or computed)"
        return out
