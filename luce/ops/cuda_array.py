"""Device arrays of the GPU backend: a caching allocator on one stream, a pinned upload
ring and `CudaArray` (pointer, shape, dtype; always C-contiguous). Device calls go through
the backend's runtime (luce.ops.gpu_runtime: CUDA or HIP).

Memory is stream-ordered: every launch and copy of the backend goes to its one stream, so a
block freed by Python (the last array viewing it died) can be handed to the next allocation
at once; the work queued before on the stream finishes with it first. Steady-state steps
then allocate nothing from the driver (blocks are kept per size bucket). When the driver
has no memory left, every cached free block goes back to it and the allocation is tried
once more (blocks cached in one size class must not starve another: per-node GDN states of
varying tree blocks take gigabytes each); then OutOfDeviceMemory (a MemoryError) says how
much was asked and held.
Uploads go through a pinned staging ring (no host sync unless the ring laps the GPU); only
`download` waits for the stream.
"""
from __future__ import annotations

import ctypes
import math
from collections import defaultdict
from typing import Sequence

import numpy as np

from luce.ops.cuda_memory import OutOfDeviceMemory
from luce.ops.gpu_runtime import GpuError, GpuRuntime

ALIGN = 256                 # every block starts on 256 bytes (kernels want 16)
STAGING_BYTES = 8 << 20     # pinned ring for uploads, two halves


def bucket_bytes(nbytes: int) -> int:
    """Size class of an allocation: powers of two up to 64 MiB, then 2 MiB multiples."""
    n = max(int(nbytes), ALIGN)
    if n <= 64 << 20:
        return 1 << (n - 1).bit_length()
    return -(-n // (2 << 20)) * (2 << 20)


class DeviceAllocator:
    """Size-bucketed free lists of device blocks, reused in stream order."""

    def __init__(self, runtime: GpuRuntime):
        self.runtime = runtime
        self._free: dict[int, list[int]] = defaultdict(list)
        self.reserved_bytes = 0     # held from the driver now (in use or cached)
        self.peak_reserved_bytes = 0
        self.driver_allocs = 0      # runtime.malloc calls (a steady-state step adds none)

    def alloc(self, nbytes: int, trim: bool = True) -> tuple[int, int]:
        """-> (ptr, bucket) of at least nbytes. trim False (inside a stream capture, where
        no free may run): OutOfDeviceMemory at once when the driver has none."""
        size = bucket_bytes(nbytes)
        free = self._free[size]
        if free:
            return free.pop(), size
        ptr, error = self._malloc(size)
        if error is not None and trim:
            self.trim()
            ptr, error = self._malloc(size)
        if error is not None:
            self.runtime.clear_error()   # the failed allocation's error must not surface at a later call
            raise OutOfDeviceMemory(f"{error.what} of {size} bytes failed ({error.reason}) with "
                                    f"{self.reserved_bytes} bytes held by this backend's arrays and graphs: "
                                    "lower the slots, context or tree budget")
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        self.driver_allocs += 1
        return ptr, size

    def _malloc(self, size: int) -> tuple[int, GpuError | None]:
        try:
            return self.runtime.malloc(size), None
        except GpuError as error:
            return 0, error

    def release(self, ptr: int, size: int) -> None:
        self._free[size].append(ptr)

    def trim(self) -> int:
        """Give every cached free block back to the driver (a free waits for the device, so
        no queued work still uses one); returns the bytes freed."""
        freed = 0
        for size, ptrs in self._free.items():
            for ptr in ptrs:
                self.runtime.free(ptr)
                freed += size
        self._free.clear()
        self.reserved_bytes -= freed
        return freed


class GraphAllocator:
    """The blocks of one captured graph: taken from `parent`, reused only by this graph's own
    capture (stream order inside one graph is its node order), handed back to `parent` when
    the graph is dropped (`close`; blocks still referenced go back when they die)."""

    def __init__(self, parent: DeviceAllocator):
        self.parent = parent
        self._free: dict[int, list[int]] = defaultdict(list)
        self.owned_bytes = 0
        self.closed = False

    def alloc(self, nbytes: int) -> tuple[int, int]:
        if self.closed:
            raise RuntimeError("allocation from a dropped graph's pool")
        size = bucket_bytes(nbytes)
        free = self._free[size]
        if free:
            return free.pop(), size
        ptr, size = self.parent.alloc(nbytes, trim=False)   # graph pools are taken during capture
        self.owned_bytes += size
        return ptr, size

    def release(self, ptr: int, size: int) -> None:
        if self.closed:
            self.parent.release(ptr, size)
        else:
            self._free[size].append(ptr)

    def close(self) -> None:
        """Give every free block back to the parent (the graph will not run again)."""
        self.closed = True
        for size, ptrs in self._free.items():
            for ptr in ptrs:
                self.parent.release(ptr, size)
        self._free.clear()


class Block:
    """One allocation; returned to its allocator when the last array using it dies."""

    __slots__ = ("ptr", "size", "allocator")

    def __init__(self, allocator, nbytes: int):
        self.allocator = allocator
        self.ptr, self.size = allocator.alloc(nbytes)

    def __del__(self):
        try:
            self.allocator.release(self.ptr, self.size)
        except Exception:
            pass


class StagingRing:
    """Pinned host memory for host -> device copies on `stream`, in two halves: a half is
    refilled only after the copies queued from it have run (an event per half)."""

    def __init__(self, runtime: GpuRuntime, stream: int, nbytes: int = STAGING_BYTES):
        self.runtime = runtime
        self.stream, self.half = stream, nbytes // 2
        self.base = runtime.malloc_host(nbytes)
        self.host = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.base))
        self.events = [runtime.event_create() for _ in range(2)]
        self.recorded = [False, False]
        self.current, self.offset = 0, 0
        self.forbidden = False   # set while a graph is captured: a copy from the ring would replay stale bytes

    def _switch(self) -> None:
        self.runtime.event_record(self.events[self.current], self.stream)
        self.recorded[self.current] = True
        self.current ^= 1
        if self.recorded[self.current]:
            self.runtime.event_synchronize(self.events[self.current])
        self.offset = 0

    def upload(self, dst: int, host: np.ndarray) -> None:
        """Queue a copy of `host` (contiguous) to device address dst."""
        n = host.nbytes
        if n == 0:
            return
        if self.forbidden:
            from luce.ops.cuda_graph import GraphUnsafe

            raise GraphUnsafe("a host upload inside a graph capture")
        if n > self.half:  # big (weights, large inputs): pageable copy, then wait for it
            self.runtime.copy_h2d_async(dst, host.ctypes.data, n, self.stream)
            self.runtime.synchronize(self.stream)
            return
        if self.offset + n > self.half:
            self._switch()
        start = self.current * self.half + self.offset
        self.host[start:start + n] = host.reshape(-1).view(np.uint8)
        self.runtime.copy_h2d_async(dst, self.base + start, n, self.stream)
        self.offset += -(-n // ALIGN) * ALIGN


class CudaArray:
    """A C-contiguous device array. `reshape` gives views sharing the memory; everything
    else goes through the backend (`backend.to_numpy(x)` or `x.to_numpy()` for the host)."""

    __slots__ = ("block", "ptr", "shape", "dtype", "backend", "__weakref__")

    def __init__(self, block: Block, ptr: int, shape: Sequence[int], dtype, backend):
        self.block, self.ptr = block, int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.backend = backend

    contiguous = True

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def reshape(self, *shape) -> "CudaArray":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = [int(s) for s in shape]
        if shape.count(-1) > 1:
            raise ValueError(f"reshape {tuple(shape)}: at most one -1")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"cannot reshape {self.shape} into {tuple(shape)}")
            shape[shape.index(-1)] = self.size // known
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} {self.shape} into {tuple(shape)}")
        return CudaArray(self.block, self.ptr, shape, self.dtype, self.backend)

    def __getitem__(self, i) -> "CudaArray":
        """x[i] for an int i: a view of row i (what a per-slot state pool hands out)."""
        if not isinstance(i, (int, np.integer)) or not self.shape:
            raise TypeError(f"CudaArray supports x[int] row views only, got {i!r}")
        n = self.shape[0]
        i = int(i) + n if i < 0 else int(i)
        if not 0 <= i < n:
            raise IndexError(f"row {i} outside [0, {n})")
        row = self.nbytes // n if n else 0
        return CudaArray(self.block, self.ptr + i * row, self.shape[1:], self.dtype, self.backend)

    def to_numpy(self) -> np.ndarray:
        return self.backend.to_numpy(self)

    def __array__(self, *args, **kwargs):
        raise TypeError("a CudaArray lives on the GPU: copy it with backend.to_numpy(x) (or x.to_numpy()); "
                        "models must touch activations only through the backend")

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x})"
