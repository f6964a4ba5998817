"""cuda-python's `cuda.bindings.runtime`, for the calls luce makes, served by the HIP double
(tests/ops/fake_hip.py): CUDA names and signatures (those of cuda-bindings 13), the double's
device memory, streams and graphs behind them. With it the CUDA runtime implementation runs
the same tests as the HIP one, and both record into one call log in HIP names, so the two
runtimes' traffic can be compared call for call."""
from __future__ import annotations

import enum
import sys
import types

from tests.ops.fake_hip import FakeHip


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801 - cuda-python's names
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaStreamCaptureMode(enum.IntEnum):  # noqa: N801
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


class FakeCudart:
    """`cuda.bindings.runtime` over a FakeHip."""

    cudaMemcpyKind, cudaStreamCaptureMode = cudaMemcpyKind, cudaStreamCaptureMode
    cudaStreamNonBlocking, cudaEventDisableTiming = 1, 2

    def __init__(self, hip: FakeHip):
        self.hip = hip

    def cudaGetDeviceCount(self):
        return self.hip.hipGetDeviceCount()

    def cudaMemGetInfo(self):
        return self.hip.hipMemGetInfo()

    def cudaDeviceSynchronize(self):
        return self.hip.hipDeviceSynchronize()

    def cudaGetLastError(self):
        return self.hip.hipGetLastError()

    def cudaMalloc(self, size):
        return self.hip.hipMalloc(size)

    def cudaFree(self, devPtr):
        return self.hip.hipFree(devPtr)

    def cudaMallocHost(self, size):
        return self.hip.hipHostMalloc(size, self.hip.hipHostMallocDefault)

    def cudaFreeHost(self, ptr):
        return self.hip.hipHostFree(ptr)

    def cudaMemsetAsync(self, devPtr, value, count, stream):
        return self.hip.hipMemsetAsync(devPtr, value, count, stream)

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        if not isinstance(kind, cudaMemcpyKind):
            raise TypeError("Argument 'kind' is not instance of type (expected cudaMemcpyKind)")
        return self.hip.hipMemcpyAsync(dst, src, count, self.hip.hipMemcpyKind(int(kind)), stream)

    def cudaStreamCreateWithFlags(self, flags):
        return self.hip.hipStreamCreateWithFlags(flags)

    def cudaStreamSynchronize(self, stream):
        return self.hip.hipStreamSynchronize(stream)

    def cudaEventCreateWithFlags(self, flags):
        return self.hip.hipEventCreateWithFlags(flags)

    def cudaEventRecord(self, event, stream):
        return self.hip.hipEventRecord(event, stream)

    def cudaEventSynchronize(self, event):
        return self.hip.hipEventSynchronize(event)

    def cudaStreamBeginCapture(self, stream, mode):
        if not isinstance(mode, cudaStreamCaptureMode):
            raise TypeError("Argument 'mode' is not instance of type (expected cudaStreamCaptureMode)")
        return self.hip.hipStreamBeginCapture(stream, self.hip.hipStreamCaptureMode(int(mode)))

    def cudaStreamEndCapture(self, stream):
        return self.hip.hipStreamEndCapture(stream)

    def cudaGraphInstantiate(self, graph, flags):
        return self.hip.hipGraphInstantiateWithFlags(graph, flags)

    def cudaGraphLaunch(self, graphExec, stream):
        return self.hip.hipGraphLaunch(graphExec, stream)

    def cudaGraphDestroy(self, graph):
        return self.hip.hipGraphDestroy(graph)

    def cudaGraphExecDestroy(self, graphExec):
        return self.hip.hipGraphExecDestroy(graphExec)


def install(monkeypatch, hip: FakeHip) -> None:
    """Make `from cuda.bindings import runtime` give a FakeCudart over `hip`."""
    cuda, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    bindings.runtime = FakeCudart(hip)
    cuda.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
