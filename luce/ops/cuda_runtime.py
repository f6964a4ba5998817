"""luce.ops.gpu_runtime.GpuRuntime over cuda-python (`cuda.bindings.runtime`): what the CUDA
backend has always called, one call per method. cuda-python is imported at the first call,
so luce imports without it."""
from __future__ import annotations

import sys

from luce.ops.gpu_runtime import GpuRuntime, check


def _rt():
    """`cuda.bindings.runtime`. Every runtime call asks for it: once imported, the module is
    read from sys.modules (a `from ... import` of a package's submodule costs a Python-level
    importlib call each time); tests swap in a double there."""
    bindings = sys.modules.get("cuda.bindings")
    cudart = getattr(bindings, "runtime", None)
    if cudart is None:
        from cuda.bindings import runtime as cudart
    return cudart


class CudaRuntime(GpuRuntime):
    name = "cuda"

    def device_count(self) -> int:
        try:
            err, count = _rt().cudaGetDeviceCount()
            return int(count) if int(err) == 0 else 0
        except Exception:  # noqa: BLE001 - no cuda-python, no driver: no device
            return 0

    def mem_get_info(self) -> tuple[int, int]:
        free, total = check(_rt().cudaMemGetInfo(), "cudaMemGetInfo")
        return int(free), int(total)

    def device_synchronize(self) -> None:
        check(_rt().cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def clear_error(self) -> None:
        _rt().cudaGetLastError()

    def malloc(self, nbytes: int) -> int:
        return int(check(_rt().cudaMalloc(nbytes), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        check(_rt().cudaFree(ptr), "cudaFree")

    def malloc_host(self, nbytes: int) -> int:
        return int(check(_rt().cudaMallocHost(nbytes), "cudaMallocHost"))

    def free_host(self, ptr: int) -> None:
        check(_rt().cudaFreeHost(ptr), "cudaFreeHost")

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        check(_rt().cudaMemsetAsync(ptr, value, nbytes, stream), "cudaMemsetAsync")

    def _copy(self, dst: int, src: int, nbytes: int, kind: str, stream: int) -> None:
        rt = _rt()
        check(rt.cudaMemcpyAsync(dst, src, nbytes, getattr(rt.cudaMemcpyKind, f"cudaMemcpy{kind}"), stream),
              f"cudaMemcpyAsync {kind}")

    def copy_h2d_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._copy(dst, src, nbytes, "HostToDevice", stream)

    def copy_d2h_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._copy(dst, src, nbytes, "DeviceToHost", stream)

    def copy_d2d_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._copy(dst, src, nbytes, "DeviceToDevice", stream)

    def stream_create(self) -> int:
        rt = _rt()
        return int(check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags"))

    def synchronize(self, stream: int) -> None:
        check(_rt().cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def event_create(self):
        rt = _rt()
        return check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming), "cudaEventCreateWithFlags")

    def event_record(self, event, stream: int) -> None:
        check(_rt().cudaEventRecord(event, stream), "cudaEventRecord")

    def event_synchronize(self, event) -> None:
        check(_rt().cudaEventSynchronize(event), "cudaEventSynchronize")

    def begin_capture(self, stream: int) -> None:
        rt = _rt()
        check(rt.cudaStreamBeginCapture(stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed),
              "cudaStreamBeginCapture")

    def end_capture(self, stream: int):
        return check(_rt().cudaStreamEndCapture(stream), "cudaStreamEndCapture")

    def graph_instantiate(self, graph):
        return check(_rt().cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")

    def graph_launch(self, graph_exec, stream: int) -> None:
        check(_rt().cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch")

    def graph_destroy(self, graph) -> None:
        _rt().cudaGraphDestroy(graph)

    def graph_exec_destroy(self, graph_exec) -> None:
        _rt().cudaGraphExecDestroy(graph_exec)

    def graph_node_types(self, graph) -> list[str]:
        rt = _rt()
        _, n = check(rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")
        if n == 0:
            return []
        nodes, n = check(rt.cudaGraphGetNodes(graph, n), "cudaGraphGetNodes")
        return [getattr(t, "name", str(t)) for t in (check(rt.cudaGraphNodeGetType(node), "cudaGraphNodeGetType")
                                                     for node in nodes[:n])]
