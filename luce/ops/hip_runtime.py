"""luce.ops.gpu_runtime.GpuRuntime over hip-python (`from hip import hip`, ROCm >= 6.0): the
calls of luce/ops/cuda_runtime.py, one HIP call per method. hip-python returns (err, *values)
tuples as cuda-python does; enum arguments must be its enum members (hipMemcpyKind,
hipStreamCaptureMode), handles are its Pointer objects (int() is the address) and it takes
ints for every pointer and stream argument. Where the HIP signature differs from CUDA's:
hipHostMalloc takes flags, and graphs are instantiated with hipGraphInstantiateWithFlags
(hipGraphInstantiate's arguments changed between hip-python 6 and 10).
hip-python is imported at the first call (luce imports without it)."""
from __future__ import annotations

from luce.ops.gpu_runtime import GpuRuntime, check


def _hip():
    from hip import hip

    return hip


class HipRuntime(GpuRuntime):
    name = "hip"

    def device_count(self) -> int:
        try:
            err, count = _hip().hipGetDeviceCount()
            return int(count) if int(err) == 0 else 0
        except Exception:  # noqa: BLE001 - no hip-python, no libamdhip64, no driver: no device
            return 0

    def mem_get_info(self) -> tuple[int, int]:
        free, total = check(_hip().hipMemGetInfo(), "hipMemGetInfo")
        return int(free), int(total)

    def device_synchronize(self) -> None:
        check(_hip().hipDeviceSynchronize(), "hipDeviceSynchronize")

    def clear_error(self) -> None:
        _hip().hipGetLastError()

    def malloc(self, nbytes: int) -> int:
        return int(check(_hip().hipMalloc(nbytes), "hipMalloc"))

    def free(self, ptr: int) -> None:
        check(_hip().hipFree(ptr), "hipFree")

    def malloc_host(self, nbytes: int) -> int:
        hip = _hip()
        return int(check(hip.hipHostMalloc(nbytes, hip.hipHostMallocDefault), "hipHostMalloc"))

    def free_host(self, ptr: int) -> None:
        check(_hip().hipHostFree(ptr), "hipHostFree")

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        check(_hip().hipMemsetAsync(ptr, value, nbytes, stream), "hipMemsetAsync")

    def _copy(self, dst: int, src: int, nbytes: int, kind: str, stream: int) -> None:
        hip = _hip()
        check(hip.hipMemcpyAsync(dst, src, nbytes, getattr(hip.hipMemcpyKind, f"hipMemcpy{kind}"), stream),
              f"hipMemcpyAsync {kind}")

    def copy_h2d_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._copy(dst, src, nbytes, "HostToDevice", stream)

    def copy_d2h_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._copy(dst, src, nbytes, "DeviceToHost", stream)

    def copy_d2d_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._copy(dst, src, nbytes, "DeviceToDevice", stream)

    def stream_create(self) -> int:
        hip = _hip()
        return int(check(hip.hipStreamCreateWithFlags(hip.hipStreamNonBlocking), "hipStreamCreateWithFlags"))

    def synchronize(self, stream: int) -> None:
        check(_hip().hipStreamSynchronize(stream), "hipStreamSynchronize")

    def event_create(self):
        hip = _hip()
        return check(hip.hipEventCreateWithFlags(hip.hipEventDisableTiming), "hipEventCreateWithFlags")

    def event_record(self, event, stream: int) -> None:
        check(_hip().hipEventRecord(event, stream), "hipEventRecord")

    def event_synchronize(self, event) -> None:
        check(_hip().hipEventSynchronize(event), "hipEventSynchronize")

    def begin_capture(self, stream: int) -> None:
        hip = _hip()
        check(hip.hipStreamBeginCapture(stream, hip.hipStreamCaptureMode.hipStreamCaptureModeRelaxed),
              "hipStreamBeginCapture")

    def end_capture(self, stream: int):
        return check(_hip().hipStreamEndCapture(stream), "hipStreamEndCapture")

    def graph_instantiate(self, graph):
        return check(_hip().hipGraphInstantiateWithFlags(graph, 0), "hipGraphInstantiateWithFlags")

    def graph_launch(self, graph_exec, stream: int) -> None:
        check(_hip().hipGraphLaunch(graph_exec, stream), "hipGraphLaunch")

    def graph_destroy(self, graph) -> None:
        _hip().hipGraphDestroy(graph)

    def graph_exec_destroy(self, graph_exec) -> None:
        _hip().hipGraphExecDestroy(graph_exec)

    def graph_node_types(self, graph) -> list[str]:
        hip = _hip()
        _, n = check(hip.hipGraphGetNodes(graph, None, 0), "hipGraphGetNodes")
        if n == 0:
            return []
        nodes, n = check(hip.hipGraphGetNodes(graph, None, n), "hipGraphGetNodes")
        return [getattr(t, "name", str(t)) for t in (check(hip.hipGraphNodeGetType(node), "hipGraphNodeGetType")
                                                     for node in list(nodes)[:n])]
