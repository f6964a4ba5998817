"""Device buffers through cuda-python (cuda.bindings.runtime): allocate, copy, free.

Used by the CUDA backend and the kernel tests. Imports cuda-python lazily so the package
imports without it.
"""
from __future__ import annotations

import numpy as np


def _rt():
    from cuda.bindings import runtime as cudart

    return cudart


class OutOfDeviceMemory(MemoryError):
    """The device has no memory left for an allocation, even after the caches were emptied."""


def check(result, what: str):
    """Unpack a cuda-python (err, *values) tuple, raising on a non-success code."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class DeviceBuffer:
    """`nbytes` of device memory; `ptr` is its raw address."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.ptr = int(check(_rt().cudaMalloc(max(self.nbytes, 1)), "cudaMalloc"))

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> "DeviceBuffer":
        host = np.ascontiguousarray(array)
        buf = cls(host.nbytes)
        buf.upload(host)
        return buf

    def upload(self, host: np.ndarray, offset: int = 0) -> None:
        host = np.ascontiguousarray(host)
        if offset + host.nbytes > self.nbytes:
            raise ValueError(f"upload of {host.nbytes} bytes at {offset} overflows {self.nbytes}")
        rt = _rt()
        check(rt.cudaMemcpy(self.ptr + offset, host.ctypes.data, host.nbytes,
                            rt.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy H2D")

    def download(self, shape, dtype, offset: int = 0) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        if offset + out.nbytes > self.nbytes:
            raise ValueError(f"download of {out.nbytes} bytes at {offset} overflows {self.nbytes}")
        rt = _rt()
        check(rt.cudaMemcpy(out.ctypes.data, self.ptr + offset, out.nbytes,
                            rt.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy D2H")
        return out

    def free(self) -> None:
        if self.ptr:
            check(_rt().cudaFree(self.ptr), "cudaFree")
            self.ptr = 0

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass
