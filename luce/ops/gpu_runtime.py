"""The GPU runtime interface of the GPU backend: device memory, copies, streams, events,
graph capture and replay, the device count and the kernel library, over one vendor binding.

Two implementations, as thin as the bindings allow: `CudaRuntime` over cuda-python
(luce/ops/cuda_runtime.py, `cuda.bindings.runtime`) and `HipRuntime` over hip-python
(luce/ops/hip_runtime.py, `hip.hip`). Everything above (luce/ops/cuda_array.py,
cuda_graph.py, cuda_backend.py, ...) calls only this interface; the kernel wrappers
(luce/_cuda*.pyx) take raw addresses and streams as integers and load the library the
runtime names (`LIB_NAMES[runtime.name]`).

Conventions: device and pinned host addresses and streams are ints; events, graphs and
executable graphs are opaque handles of the binding, passed back as they came. Copies and
memsets are queued on a stream (`synchronize(stream)` waits). A call the binding refuses
raises GpuError (a RuntimeError) naming the call and the binding's error; the destroy calls
never raise (they run from __del__ and after failed captures).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import functools

RUNTIMES = ("cuda", "hip")


class GpuError(RuntimeError):
    """A runtime call failed: `what` the call, `code` the binding's error (an int enum),
    `reason` its name and number."""

    def __init__(self, what: str, code):
        self.what, self.code = what, code
        name = getattr(code, "name", None)
        self.reason = f"{name} ({int(code)})" if name else str(int(code))
        super().__init__(f"{what} failed: {self.reason}")


def check(result, what: str):
    """Unpack a binding's (err, *values) tuple: GpuError when err is not success, else None,
    the one value or a tuple of them."""
    err, *values = result
    if int(err) != 0:
        raise GpuError(what, err)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class GpuRuntime(ABC):
    """The interface (every implementation defines each method with this signature;
    tests/ops/test_gpu_runtime.py checks it)."""

    name = ""   # 'cuda' | 'hip': the backend's name and the kernel library's kind

    # ---- device ------------------------------------------------------------------------------
    @abstractmethod
    def device_count(self) -> int:
        """Visible devices; 0 when the binding, its driver or a device is missing (never raises)."""

    @abstractmethod
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""

    @abstractmethod
    def device_synchronize(self) -> None:
        """Wait until the current device is idle."""

    @abstractmethod
    def clear_error(self) -> None:
        """Reset the last error (a refused call must not surface at a later one)."""

    # ---- memory ------------------------------------------------------------------------------
    @abstractmethod
    def malloc(self, nbytes: int) -> int:
        """Device address of `nbytes` (> 0) new bytes; GpuError when the device has none."""

    @abstractmethod
    def free(self, ptr: int) -> None:
        """Give a malloc'ed block back (waits for the device; not allowed inside a capture)."""

    @abstractmethod
    def malloc_host(self, nbytes: int) -> int:
        """Address of `nbytes` of page-locked host memory (copies from it run asynchronously)."""

    @abstractmethod
    def free_host(self, ptr: int) -> None:
        """Give a malloc_host'ed block back."""

    @abstractmethod
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Set `nbytes` at device address ptr to the byte `value`, queued on `stream`."""

    @abstractmethod
    def copy_h2d_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Host address src -> device address dst, queued on `stream`."""

    @abstractmethod
    def copy_d2h_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Device address src -> host address dst, queued on `stream`."""

    @abstractmethod
    def copy_d2d_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Device address src -> device address dst, queued on `stream`."""

    # ---- streams and events ------------------------------------------------------------------
    @abstractmethod
    def stream_create(self) -> int:
        """A new stream that does not synchronize with the default stream."""

    @abstractmethod
    def synchronize(self, stream: int) -> None:
        """Wait until everything queued on `stream` has run."""

    @abstractmethod
    def event_create(self):
        """A new event without timing."""

    @abstractmethod
    def event_record(self, event, stream: int) -> None:
        """Record `event` on `stream` (it completes when the work queued before it has run)."""

    @abstractmethod
    def event_synchronize(self, event) -> None:
        """Wait until `event` has completed."""

    # ---- graphs ------------------------------------------------------------------------------
    @abstractmethod
    def begin_capture(self, stream: int) -> None:
        """Record, not run, what is queued on `stream` from now on (relaxed mode: other
        threads' calls are not checked)."""

    @abstractmethod
    def end_capture(self, stream: int):
        """Stop recording -> the captured graph (GpuError if the capture was invalidated)."""

    @abstractmethod
    def graph_instantiate(self, graph):
        """An executable graph of `graph`."""

    @abstractmethod
    def graph_launch(self, graph_exec, stream: int) -> None:
        """Queue one replay of an executable graph on `stream`."""

    @abstractmethod
    def graph_destroy(self, graph) -> None:
        """Free a captured graph."""

    @abstractmethod
    def graph_exec_destroy(self, graph_exec) -> None:
        """Free an executable graph."""

    @abstractmethod
    def graph_node_types(self, graph) -> list[str]:
        """The type name of every node of a captured graph, in the runtime's spelling
        (cudaGraphNodeTypeKernel, hipGraphNodeTypeMemset, ...): what one replay launches."""

    # ---- the kernel library ------------------------------------------------------------------
    def library_path(self):
        """Path of this runtime's kernel library (luce/lib/libluce_<name>.so), None if not built."""
        from luce.ops.native import kernel_library_path

        return kernel_library_path(self.name)

    def load_kernels(self):
        """Load this runtime's kernel library into the luce._cuda* launch modules -> luce._cuda."""
        from luce.ops.native import load_kernels

        return load_kernels(self.name)


@functools.lru_cache(maxsize=None)
def get_runtime(name: str) -> GpuRuntime:
    """The runtime called `name` (RUNTIMES), one per process. Importing its binding is
    deferred to the first call that needs it, so this never fails for a known name."""
    if name == "cuda":
        from luce.ops.cuda_runtime import CudaRuntime

        return CudaRuntime()
    if name == "hip":
        from luce.ops.hip_runtime import HipRuntime

        return HipRuntime()
    raise ValueError(f"unknown GPU runtime {name!r}: one of {', '.join(RUNTIMES)}")
