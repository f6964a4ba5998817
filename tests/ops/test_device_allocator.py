"""The GPU backend's caching allocator (luce.ops.cuda_array.DeviceAllocator) against a fake
runtime, no GPU needed: blocks cached in one size class go back to the driver when another
allocation finds it full (the per-node-state ddtree's scratch changes size with every tree
count, gigabytes each on a 27B), and an allocation that still cannot be met raises
OutOfDeviceMemory naming what was asked and held; inside a capture (trim=False) nothing is
freed."""
from __future__ import annotations

import pytest

from luce.ops.cuda_array import DeviceAllocator, GraphAllocator
from luce.ops.cuda_memory import OutOfDeviceMemory
from luce.ops.gpu_runtime import GpuError

MB = 1 << 20


class FakeDriver:
    """The memory calls of a luce.ops.gpu_runtime.GpuRuntime over `capacity` bytes; a refused
    malloc raises GpuError (code 2, as cudaErrorMemoryAllocation) and leaves an error to clear."""

    def __init__(self, capacity: int):
        self.capacity, self.used, self.blocks, self.next, self.frees = capacity, 0, {}, 1 << 20, 0
        self.pending_error = False

    def malloc(self, size):
        if self.used + size > self.capacity:
            self.pending_error = True
            raise GpuError("cudaMalloc", 2)
        self.next += size
        self.blocks[self.next] = size
        self.used += size
        return self.next

    def free(self, ptr):
        self.used -= self.blocks.pop(ptr)
        self.frees += 1

    def clear_error(self):
        self.pending_error = False


@pytest.fixture
def driver():
    return FakeDriver(capacity=300 * MB)


def test_cached_blocks_of_another_size_go_back_when_the_driver_is_full(driver):
    alloc = DeviceAllocator(driver)
    blocks = [alloc.alloc(96 * MB) for _ in range(3)]          # 288 MiB: a step with one tree size
    for ptr, size in blocks:
        alloc.release(ptr, size)                                # cached, not returned
    ptr, size = alloc.alloc(192 * MB)                           # the next tree count's scratch
    assert size == 192 * MB and driver.frees == 3 and driver.used == 192 * MB
    assert alloc.reserved_bytes == 192 * MB and alloc.peak_reserved_bytes == 288 * MB


def test_an_allocation_the_device_cannot_hold_names_what_was_asked_and_held(driver):
    alloc = DeviceAllocator(driver)
    alloc.alloc(200 * MB)                                       # in use: cannot be freed
    with pytest.raises(OutOfDeviceMemory, match=rf"cudaMalloc of {128 * MB} bytes failed \(2\) with {200 * MB} bytes held"):
        alloc.alloc(128 * MB)
    assert not driver.pending_error                             # cleared: no later call sees it


def test_a_graph_pool_never_frees_during_capture(driver):
    alloc = DeviceAllocator(driver)
    ptr, size = alloc.alloc(200 * MB)
    alloc.release(ptr, size)                                    # cached
    with pytest.raises(OutOfDeviceMemory):
        GraphAllocator(alloc).alloc(128 * MB)                   # cudaFree may not run inside a capture
    assert driver.frees == 0 and alloc.alloc(200 * MB) == (ptr, size)
