"""A recording test double of hip-python (`from hip import hip`) and of the HIP kernel library,
for running the GPU backend's HIP runtime (luce/ops/hip_runtime.py) on a machine without an
AMD GPU.

What it models, after hip-python (the real one's signatures are compared in
tests/ops/test_hip_runtime.py when it is installed):
- every call returns a (hipError_t, *values) tuple and is recorded in `calls`; a refused call
  leaves its error for hipGetLastError;
- device memory: hipMalloc hands out fake addresses (a range no host pointer has, 256-byte
  aligned, a guard gap between blocks) backed by zeroed numpy buffers; a copy, memset or
  kernel argument that falls outside a live block is a fault (FakeFault); frees of an unknown
  address are refused; a `capacity` limits the bytes held (hipErrorOutOfMemory past it);
- pinned host memory (hipHostMalloc) is real host memory (luce writes it through ctypes);
  copies between host and device move real bytes, so values round-trip;
- enum arguments must be the enum members (hip-python raises TypeError on a plain int);
- streams run their work at once (in order), except a stream being captured: its copies,
  memsets and kernel launches become graph nodes, run only by hipGraphLaunch; a stream
  synchronisation or a hipFree during a capture is refused and invalidates it, as on a GPU;
- kernels (install_kernels): every launch entry point of the luce._cuda* modules is replaced
  by a recorder that checks the stream and every device address argument and runs nothing:
  a kernel's outputs keep whatever their memory held. The size helpers (row_bytes,
  workspace_bytes) answer from the GGUF block sizes.
"""
from __future__ import annotations

import bisect
import ctypes
import enum
import importlib
import inspect
import itertools
import sys
import types

import numpy as np

# Fake device addresses. Linux places host mmaps top-down from a base randomized over ~1 TiB
# below the stack (0x7Exx.. to 0x7Fxx..) and PIE images at 0x55..-0x56..: 16 TiB from 2^44 up
# is below both and above any brk heap, so no host allocation lives here.
DEVICE_BASE = 0x1000_0000_0000
DEVICE_END = 0x2000_0000_0000
HANDLE_BASE = 0x5000_0000_0000        # streams, events, graphs: opaque
# Each FakeHip takes its own slice of both ranges: graphs and memory an earlier test left to the
# garbage collector may be freed while a later test's fake is installed, and must not free that
# fake's handles or blocks that happen to have the same address (the slice of instance n).
INSTANCE_SLICES = 256
_instances = itertools.count()
# Pinned host memory is real host memory, so it cannot take a slice: every fake's blocks are kept
# for the process instead, so that no host address is handed out twice. An earlier test's
# luce.ops.cuda_ids_ops.PinnedIds, freed by the garbage collector during a later test, frees its
# block through the runtime's module functions, i.e. through the fake installed then; had numpy
# given that address to the later fake again, its live block would go (a step's ids copy then
# faults on "freed pinned memory" and a test fails at random). Untouched zero pages cost nothing.
_PINNED_EVER: list[np.ndarray] = []


class hipError_t(enum.IntEnum):  # noqa: N801 - hip-python's names
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorInvalidDevice = 101
    hipErrorInvalidResourceHandle = 400
    hipErrorStreamCaptureUnsupported = 900
    hipErrorStreamCaptureInvalidated = 901


class hipMemcpyKind(enum.IntEnum):  # noqa: N801
    hipMemcpyHostToHost = 0
    hipMemcpyHostToDevice = 1
    hipMemcpyDeviceToHost = 2
    hipMemcpyDeviceToDevice = 3
    hipMemcpyDefault = 4


class hipStreamCaptureMode(enum.IntEnum):  # noqa: N801
    hipStreamCaptureModeGlobal = 0
    hipStreamCaptureModeThreadLocal = 1
    hipStreamCaptureModeRelaxed = 2


class FakeFault(AssertionError):
    """luce handed the runtime or a kernel an address or handle a GPU would fault on."""


class Handle:
    """An opaque hip-python handle (ihipStream_t, ihipEvent_t, ihipGraph, hipGraphExec):
    int() is its address."""

    def __init__(self, kind: str, address: int):
        self.kind, self.address = kind, address

    def __int__(self) -> int:
        return self.address

    def __repr__(self) -> str:
        return f"<{self.kind} 0x{self.address:x}>"


S = hipError_t.hipSuccess


class FakeHip:
    """The `hip.hip` module of hip-python, for the calls luce makes."""

    hipError_t, hipMemcpyKind, hipStreamCaptureMode = hipError_t, hipMemcpyKind, hipStreamCaptureMode
    hipStreamNonBlocking, hipEventDisableTiming, hipHostMallocDefault = 1, 2, 0

    def __init__(self, devices: int = 1, capacity: int = 1 << 30):
        self.devices, self.capacity = devices, capacity
        instance = next(_instances) % INSTANCE_SLICES
        self._handle_base = HANDLE_BASE + (instance << 32)
        self.calls: list[tuple] = []
        self.blocks: dict[int, np.ndarray] = {}     # device address -> backing bytes
        self._starts: list[int] = []
        self._next = DEVICE_BASE + instance * ((DEVICE_END - DEVICE_BASE) // INSTANCE_SLICES)
        self.pinned: dict[int, np.ndarray] = {}
        self.freed_pinned: list[np.ndarray] = []  # kept alive: a late copy must not write freed memory
        self.handles: dict[int, Handle] = {}
        self.captures: dict[int, list] = {}         # stream address -> nodes (while captured)
        self.invalidated: set[int] = set()
        self.last_error = S
        self.launches: list[tuple] = []             # (kernel, stream, captured)
        self.prefill_split_k = 1                    # luce_matmul_prefill_split_k's answer (1: no split)
        self.graph_launches = 0

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _record(self, name, *args):
        self.calls.append((name, args))

    def _fail(self, err):
        self.last_error = err
        return err

    def _handle(self, kind: str) -> Handle:
        h = Handle(kind, self._handle_base + 64 * (len(self.handles) + 1))
        self.handles[h.address] = h
        return h

    def _stream(self, stream) -> int:
        address = int(stream) if stream is not None else 0
        if address and self.handles.get(address, Handle("", 0)).kind != "ihipStream_t":
            raise FakeFault(f"0x{address:x} is not a stream")
        return address

    def _device(self, address: int, nbytes: int) -> np.ndarray:
        """The backing bytes [address, address + nbytes) of one live block (a fault otherwise)."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            start = self._starts[i]
            block = self.blocks[start]
            if address + nbytes <= start + block.nbytes:
                return block[address - start:address - start + nbytes]
        raise FakeFault(f"device access [0x{address:x}, +{nbytes}) outside every live block")

    def is_device(self, address: int) -> bool:
        return DEVICE_BASE <= int(address) < DEVICE_END

    def capturing(self) -> bool:
        return bool(self.captures)

    def _enqueue(self, stream, node) -> None:
        address = self._stream(stream)
        if address in self.captures:
            self.captures[address].append(node)
        else:
            node()

    # ---- device ------------------------------------------------------------------------------
    def hipGetDeviceCount(self):
        self._record("hipGetDeviceCount")
        return (S, self.devices)

    def hipMemGetInfo(self):
        self._record("hipMemGetInfo")
        return (S, self.capacity - self.used, self.capacity)

    def hipDeviceSynchronize(self):
        self._record("hipDeviceSynchronize")
        return (self._fail(hipError_t.hipErrorStreamCaptureUnsupported) if self.capturing() else S,)

    def hipGetLastError(self):
        self._record("hipGetLastError")
        err, self.last_error = self.last_error, S
        return (err,)

    @property
    def used(self) -> int:
        return sum(b.nbytes for b in self.blocks.values())

    # ---- memory ------------------------------------------------------------------------------
    def hipMalloc(self, size):
        self._record("hipMalloc", size)
        if size <= 0 or self.used + size > self.capacity:
            return (self._fail(hipError_t.hipErrorOutOfMemory if size > 0 else hipError_t.hipErrorInvalidValue), None)
        address = self._next
        self._next += -(-size // 256) * 256 + 256            # a guard gap: an overrun faults
        self.blocks[address] = np.zeros(size, np.uint8)
        bisect.insort(self._starts, address)
        return (S, address)

    def hipFree(self, ptr):
        self._record("hipFree", int(ptr))
        if self.capturing():
            self.invalidated.update(self.captures)
            return (self._fail(hipError_t.hipErrorStreamCaptureUnsupported),)
        if int(ptr) not in self.blocks:
            return (self._fail(hipError_t.hipErrorInvalidValue),)
        del self.blocks[int(ptr)]
        self._starts.remove(int(ptr))
        return (S,)

    def hipHostMalloc(self, size, flags):
        self._record("hipHostMalloc", size, flags)
        host = np.zeros(size, np.uint8)
        if self.is_device(host.ctypes.data):
            raise FakeFault(f"host memory at 0x{host.ctypes.data:x} lies in the fake device range: move DEVICE_BASE")
        self.pinned[host.ctypes.data] = host
        _PINNED_EVER.append(host)
        return (S, host.ctypes.data)

    def hipHostFree(self, ptr):
        self._record("hipHostFree", int(ptr))
        host = self.pinned.pop(int(ptr), None)
        if host is None:
            return (self._fail(hipError_t.hipErrorInvalidValue),)
        self.freed_pinned.append(host)
        return (S,)

    def _check_host(self, address: int, nbytes: int) -> None:
        """A host copy must not touch pinned memory freed before it runs (a graph replayed after
        hipHostFree): real memory would be corrupted."""
        for host in self.freed_pinned:
            start = host.ctypes.data
            if start < address + nbytes and address < start + host.nbytes:
                raise FakeFault(f"host copy [0x{address:x}, +{nbytes}) touches freed pinned memory")

    def hipMemcpyAsync(self, dst, src, sizeBytes, kind, stream):
        if not isinstance(kind, hipMemcpyKind):
            raise TypeError("argument 'kind' must be of type '_hipMemcpyKind__Base'")
        dst, src = int(dst), int(src)
        self._record("hipMemcpyAsync", dst, src, sizeBytes, kind, int(stream))
        want = {hipMemcpyKind.hipMemcpyHostToDevice: (True, False), hipMemcpyKind.hipMemcpyDeviceToHost: (False, True),
                hipMemcpyKind.hipMemcpyDeviceToDevice: (True, True)}[kind]
        if (self.is_device(dst), self.is_device(src)) != want:
            raise FakeFault(f"{kind.name} from 0x{src:x} to 0x{dst:x}")
        for address, on_device in ((dst, want[0]), (src, want[1])):
            if on_device:
                self._device(address, sizeBytes)                # a bad range faults at the call

        def copy():
            if want != (True, True):
                self._check_host(src if want[0] else dst, sizeBytes)
            source = self._device(src, sizeBytes) if want[1] else np.ctypeslib.as_array(
                (ctypes.c_uint8 * sizeBytes).from_address(src))
            if want[0]:
                self._device(dst, sizeBytes)[:] = source
            else:
                ctypes.memmove(dst, source.ctypes.data, sizeBytes)
        self._enqueue(stream, copy)
        return (S,)

    def hipMemsetAsync(self, dst, value, sizeBytes, stream):
        self._record("hipMemsetAsync", int(dst), value, sizeBytes, int(stream))
        self._device(int(dst), sizeBytes)
        self._enqueue(stream, lambda: self._device(int(dst), sizeBytes).fill(value))
        return (S,)

    # ---- streams and events ------------------------------------------------------------------
    def hipStreamCreateWithFlags(self, flags):
        self._record("hipStreamCreateWithFlags", flags)
        return (S, self._handle("ihipStream_t"))

    def hipStreamSynchronize(self, stream):
        address = self._stream(stream)
        self._record("hipStreamSynchronize", address)
        if address in self.captures:
            self.invalidated.add(address)
            return (self._fail(hipError_t.hipErrorStreamCaptureUnsupported),)
        return (S,)

    def hipEventCreateWithFlags(self, flags):
        self._record("hipEventCreateWithFlags", flags)
        return (S, self._handle("ihipEvent_t"))

    def hipEventRecord(self, event, stream):
        self._record("hipEventRecord", int(event), self._stream(stream))
        return (S,)

    def hipEventSynchronize(self, event):
        self._record("hipEventSynchronize", int(event))
        return (S,)

    # ---- graphs ------------------------------------------------------------------------------
    def hipStreamBeginCapture(self, stream, mode):
        if not isinstance(mode, hipStreamCaptureMode):
            raise TypeError("argument 'mode' must be of type '_hipStreamCaptureMode__Base'")
        address = self._stream(stream)
        self._record("hipStreamBeginCapture", address, mode)
        if not address or address in self.captures:
            return (self._fail(hipError_t.hipErrorInvalidValue),)
        self.captures[address] = []
        return (S,)

    def hipStreamEndCapture(self, stream):
        address = self._stream(stream)
        self._record("hipStreamEndCapture", address)
        if address not in self.captures:
            return (self._fail(hipError_t.hipErrorInvalidValue), None)
        nodes = self.captures.pop(address)
        if address in self.invalidated:
            self.invalidated.discard(address)
            return (self._fail(hipError_t.hipErrorStreamCaptureInvalidated), None)
        graph = self._handle("ihipGraph")
        graph.nodes = nodes
        return (S, graph)

    def hipGraphInstantiateWithFlags(self, graph, flags):
        self._record("hipGraphInstantiateWithFlags", int(graph), flags)
        if getattr(graph, "kind", None) != "ihipGraph":
            raise FakeFault(f"{graph!r} is not a graph")
        graph_exec = self._handle("hipGraphExec")
        graph_exec.nodes = list(graph.nodes)
        return (S, graph_exec)

    def hipGraphLaunch(self, graphExec, stream):
        self._record("hipGraphLaunch", int(graphExec), self._stream(stream))
        if getattr(graphExec, "kind", None) != "hipGraphExec" or int(graphExec) not in self.handles:
            raise FakeFault(f"{graphExec!r} is not a live executable graph")
        self.graph_launches += 1
        for node in graphExec.nodes:
            self._enqueue(stream, node)
        return (S,)

    def hipGraphDestroy(self, graph):
        self._record("hipGraphDestroy", int(graph))
        return (S,) if self.handles.pop(int(graph), None) else (self._fail(hipError_t.hipErrorInvalidValue),)

    def hipGraphExecDestroy(self, graphExec):
        self._record("hipGraphExecDestroy", int(graphExec))
        return (S,) if self.handles.pop(int(graphExec), None) else (self._fail(hipError_t.hipErrorInvalidValue),)

    # ---- the kernel library ------------------------------------------------------------------
    def launch(self, kernel: str, stream, pointers) -> None:
        """A kernel launch: every device address argument must lie in a live block."""
        for p in pointers:
            self._device(p, 0)
        address = self._stream(stream)
        self.launches.append((kernel, address, address in self.captures))
        self._enqueue(stream, lambda: None)


def install(monkeypatch, fake: FakeHip) -> None:
    """Make `from hip import hip` give `fake` (the real hip-python, if any, is shadowed)."""
    package = types.ModuleType("hip")
    package.hip = fake
    package.__version__ = "fake"
    monkeypatch.setitem(sys.modules, "hip", package)


def _row_bytes(qtype: int, k: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(int(qtype))]
    return k // block * size


def install_kernels(monkeypatch, fake: FakeHip, library: str) -> None:
    """Replace the luce._cuda* entry points: `load` records the library path (it must be
    `library`), launches go to fake.launch, size helpers answer without a library."""
    from luce.ops.native import family_modules

    loaded = {}

    def load(path):
        assert path == library, f"loaded {path}, expected {library}"
        loaded["path"] = path

    for name in ["_cuda"] + family_modules():
        module = importlib.import_module(f"luce.{name}")
        monkeypatch.setattr(module, "load", load)
        for attr in dir(module):
            fn = getattr(module, attr)
            if attr.startswith("_") or not callable(fn) or isinstance(fn, type):
                continue
            if attr in ("workspace_bytes", "verify_workspace_bytes", "prefill_workspace_bytes"):
                monkeypatch.setattr(module, attr, lambda *args: 4096)
            elif attr == "row_bytes":
                monkeypatch.setattr(module, attr, _row_bytes)
            elif attr == "prefill_split_k":
                monkeypatch.setattr(module, attr, lambda qtype, n, k: fake.prefill_split_k)
            elif "stream" in inspect.signature(fn).parameters:
                monkeypatch.setattr(module, attr, _recorder(fake, f"{name}.{attr}", inspect.signature(fn)))
    import luce._cuda as core

    monkeypatch.setattr(core, "loaded_path", lambda: loaded.get("path"))
    monkeypatch.setattr(core, "synchronize", lambda: fake.hipDeviceSynchronize())
    fake.decode_overlap = []    # luce_set_decode_overlap's arguments, in order
    monkeypatch.setattr(core, "set_decode_overlap", lambda every_kind: fake.decode_overlap.append(bool(every_kind)))


def _recorder(fake: FakeHip, kernel: str, signature: inspect.Signature):
    def launch(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        stream = values.pop("stream")
        pointers = [v for v in values.values() if isinstance(v, (int, np.integer)) and fake.is_device(v)]
        fake.launch(kernel, stream, [int(p) for p in pointers])
    return launch


def spy_calls(monkeypatch, module, name: str, signature: inspect.Signature) -> list[dict]:
    """Wrap module.name (a recorder of install_kernels) so that each call's arguments, bound to
    `signature` (the real wrapper's, taken before install_kernels replaced it), are appended to
    the list returned."""
    recorded, calls = getattr(module, name), []

    def spy(*args, **kwargs):
        calls.append(dict(signature.bind(*args, **kwargs).arguments))
        return recorded(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls
