"""Graphs of the GPU backend (DESIGN.md section 4): capture one step's launches on the
backend stream, replay them with one call (through the backend's runtime, CUDA or HIP).

The life of a graph key (luce.models.graphed_forward decides keys):
1. first step with the key: eager, with `record_constants()` on, so every host upload that
   is not step metadata (head-repeat row ids, segment pointers of a fixed topology, scalars)
   keeps a device copy, and every kernel configuration is launched once (shared-memory
   limits are raised outside any capture);
2. second step: `capture()` runs the forward with launches recorded, not executed, its
   allocations from the graph's own pool (`GraphAllocator`: eager work never reuses them),
   step metadata read from the graph's arena, constants from step 1's copies; any other
   upload or host synchronisation raises GraphUnsafe and the key stays eager;
3. then `launch()`: one graph launch after one arena copy.
"""
from __future__ import annotations

import numpy as np

from luce.ops.cuda_array import GraphAllocator
from luce.ops.gpu_runtime import GpuError
from luce.ops.launch_count import count_graph_nodes


class GraphUnsafe(RuntimeError):
    """The forward did something a captured graph cannot repeat (a per-step upload that is not
    in the metadata arena, a host synchronisation, a host fallback)."""


def constant_key(host: np.ndarray) -> tuple:
    return (host.dtype.str, host.shape, host.tobytes())


class Constants:
    """Device copies of the uploads of a recorded eager step, by content."""

    def __init__(self):
        self.arrays: dict[tuple, object] = {}

    def keep(self, host: np.ndarray, device) -> None:
        self.arrays.setdefault(constant_key(host), device)

    def get(self, host: np.ndarray):
        found = self.arrays.get(constant_key(host))
        if found is None:
            raise GraphUnsafe(f"an upload of {host.dtype} {host.shape} during capture is neither step metadata nor "
                              "a constant of the recorded step")
        return found


class StepGraph:
    """One captured graph: its executable, pool, arena and what the captured forward returned."""

    def __init__(self, backend, allocator: GraphAllocator, constants: Constants):
        self.backend = backend
        self.allocator = allocator
        self.constants = constants
        self.graph = None
        self.exec = None
        self.meta = None          # luce.ops.cuda_step_meta.StepMeta in the pool
        self.output = None        # what the captured call returned (arrays in the pool)
        self.extra: dict = {}     # the caller's (host side effects to repeat on replay)
        self.nodes = None         # luce.ops.launch_count.NodeCounts: the launches one replay runs

    def launch(self) -> None:
        self.backend.runtime.graph_launch(self.exec, self.backend.stream)

    def __del__(self):
        try:
            self.drop()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def drop(self) -> None:
        if self.allocator.closed:
            return
        runtime = self.backend.runtime
        if self.exec is not None:
            runtime.graph_exec_destroy(self.exec)
        if self.graph is not None:
            runtime.graph_destroy(self.graph)
        self.exec = self.graph = self.output = self.meta = None
        self.constants = Constants()
        self.allocator.close()


class GraphMixin:
    """Mixed into CudaBackend: recording constants, capturing, the capture-aware upload."""

    def _init_graphs(self) -> None:
        self._recording: Constants | None = None
        self._capturing: StepGraph | None = None

    @property
    def capturing(self) -> bool:
        return self._capturing is not None

    def record_constants(self, constants: Constants | None) -> None:
        """Keep a device copy of every upload while `constants` is set (None stops)."""
        self._recording = constants

    def _captured_upload(self, host: np.ndarray):
        """upload() during a capture: the recorded step's device copy of `host` (GraphUnsafe if
        there is none)."""
        return self._capturing.constants.get(host)

    def _recorded(self, host: np.ndarray, device) -> None:
        if self._recording is not None:
            self._recording.keep(host, device)

    def capture(self, constants: Constants, run, bind_meta):
        """Capture `run()` into a new StepGraph -> graph (run's result in graph.output).
        bind_meta(allocator) uploads the step's arena into the graph's pool (before capture).
        Raises GraphUnsafe (the stream is left usable) when the forward cannot be captured."""
        rt = self.runtime
        graph = StepGraph(self, GraphAllocator(self.allocator), constants)
        graph.meta = bind_meta(graph.allocator)
        self.synchronize()
        rt.begin_capture(self.stream)
        saved = self.allocator
        self.allocator = graph.allocator
        self._capturing = graph
        self.staging.forbidden = True
        failure, captured, end_error = None, None, None
        try:
            graph.output = run()
        except Exception as exc:  # noqa: BLE001 - every failure ends the capture first
            failure = exc
        finally:
            self.allocator = saved
            self._capturing = None
            self.staging.forbidden = False
            try:
                captured = rt.end_capture(self.stream)
            except GpuError as e:
                end_error = e
        if failure is None and end_error is not None:
            failure = GraphUnsafe(str(end_error))
        if failure is None:
            graph.graph = captured
            try:
                graph.nodes = count_graph_nodes(rt, captured)
            except Exception:  # noqa: BLE001 - a count is a report, never a reason to lose the graph
                graph.nodes = None
            try:
                graph.exec = rt.graph_instantiate(captured)
            except GpuError as e:
                failure = GraphUnsafe(str(e))
        elif captured is not None:
            rt.graph_destroy(captured)
        if failure is not None:
            rt.clear_error()  # clear the (non-sticky) error a call refused during capture left behind
            graph.drop()
            if isinstance(failure, GraphUnsafe):
                raise failure
            raise GraphUnsafe(f"capture failed: {type(failure).__name__}: {failure}") from failure
        return graph
