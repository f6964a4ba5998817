"""Device buffers through a GPU runtime (luce.ops.gpu_runtime; CUDA unless told): allocate,
copy, free. Used by the kernel tests and benches. The runtime's binding is imported at the
first allocation, so the package imports without it.
"""
from __future__ import annotations

import numpy as np

from luce.ops.gpu_runtime import get_runtime


class OutOfDeviceMemory(MemoryError):
    """The device has no memory left for an allocation, even after the caches were emptied."""


class DeviceBuffer:
    """`nbytes` of device memory; `ptr` is its raw address. Copies go through the default
    stream and wait for it."""

    def __init__(self, nbytes: int, runtime=None):
        self.runtime = runtime or get_runtime("cuda")
        self.nbytes = int(nbytes)
        self.ptr = self.runtime.malloc(max(self.nbytes, 1))

    @classmethod
    def from_numpy(cls, array: np.ndarray, runtime=None) -> "DeviceBuffer":
        host = np.ascontiguousarray(array)
        buf = cls(host.nbytes, runtime)
        buf.upload(host)
        return buf

    def upload(self, host: np.ndarray, offset: int = 0) -> None:
        host = np.ascontiguousarray(host)
        if offset + host.nbytes > self.nbytes:
            raise ValueError(f"upload of {host.nbytes} bytes at {offset} overflows {self.nbytes}")
        self.runtime.copy_h2d_async(self.ptr + offset, host.ctypes.data, host.nbytes, 0)
        self.runtime.synchronize(0)

    def download(self, shape, dtype, offset: int = 0) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        if offset + out.nbytes > self.nbytes:
            raise ValueError(f"download of {out.nbytes} bytes at {offset} overflows {self.nbytes}")
        self.runtime.copy_d2h_async(out.ctypes.data, self.ptr + offset, out.nbytes, 0)
        self.runtime.synchronize(0)
        return out

    def free(self) -> None:
        if self.ptr:
            self.runtime.free(self.ptr)
            self.ptr = 0

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass
