"""The CUDA backend's caching allocator (luce.ops.cuda_array.DeviceAllocator) against a fake
driver, no GPU needed: blocks cached in one size class go back to the driver when another
allocation finds it full (the per-node-state ddtree's scratch changes size with every tree
count, gigabytes each on a 27B), and an allocation that still cannot be met raises
OutOfDeviceMemory naming what was asked and held; inside a capture (trim=False) nothing is
freed."""
from __future__ import annotations

import pytest

from luce.ops import cuda_array
from luce.ops.cuda_array import DeviceAllocator, GraphAllocator
from luce.ops.cuda_memory import OutOfDeviceMemory

MB = 1 << 20


class FakeDriver:
    """cudaMalloc / cudaFree over `capacity` bytes; error 2 = cudaErrorMemoryAllocation."""

    def __init__(self, capacity: int):
        self.capacity, self.used, self.blocks, self.next, self.frees = capacity, 0, {}, 1 << 20, 0

    def cudaMalloc(self, size):
        if self.used + size > self.capacity:
            return 2, 0
        self.next += size
        self.blocks[self.next] = size
        self.used += size
        return 0, self.next

    def cudaFree(self, ptr):
        self.used -= self.blocks.pop(ptr)
        self.frees += 1
        return (0,)

    def cudaGetLastError(self):
        return (0,)


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver(capacity=300 * MB)
    monkeypatch.setattr(cuda_array, "_rt", lambda: fake)
    return fake


def test_cached_blocks_of_another_size_go_back_when_the_driver_is_full(driver):
    alloc = DeviceAllocator()
    blocks = [alloc.alloc(96 * MB) for _ in range(3)]          # 288 MiB: a step with one tree size
    for ptr, size in blocks:
        alloc.release(ptr, size)                                # cached, not returned
    ptr, size = alloc.alloc(192 * MB)                           # the next tree count's scratch
    assert size == 192 * MB and driver.frees == 3 and driver.used == 192 * MB
    assert alloc.reserved_bytes == 192 * MB and alloc.peak_reserved_bytes == 288 * MB


def test_an_allocation_the_device_cannot_hold_names_what_was_asked_and_held(driver):
    alloc = DeviceAllocator()
    alloc.alloc(200 * MB)                                       # in use: cannot be freed
    with pytest.raises(OutOfDeviceMemory, match=rf"cudaMalloc of {128 * MB} bytes failed .* {200 * MB} bytes held"):
        alloc.alloc(128 * MB)


def test_a_graph_pool_never_frees_during_capture(driver):
    alloc = DeviceAllocator()
    ptr, size = alloc.alloc(200 * MB)
    alloc.release(ptr, size)                                    # cached
    with pytest.raises(OutOfDeviceMemory):
        GraphAllocator(alloc).alloc(128 * MB)                   # cudaFree may not run inside a capture
    assert driver.frees == 0 and alloc.alloc(200 * MB) == (ptr, size)
