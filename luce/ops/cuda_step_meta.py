"""The metadata arena of one step on the CUDA backend (DESIGN.md section 4).

Everything a step's kernels read that changes from step to step (token ids, positions, the
paged-KV CSR, slots, KV destinations, logits rows, tree parents) is packed into one byte
buffer and copied to the device once per step, not once per layer. A captured graph keeps
its arena: replaying it with another step of the same graph key re-packs that step into the
same addresses (`pack` gives the same layout), one host-to-device copy.

Ops find the arena by the batch (`meta_of`), and host arrays of the batch by identity
(`Mirrors`): `backend.embedding(table, batch.token_ids)` reads the arena's copy, and so does
any numpy view of a mirrored array. What the arena holds is the batch's (ForwardBatch.
step_arrays): ops never import luce.models.
"""
from __future__ import annotations

import itertools
import math
import struct
import weakref
from dataclasses import dataclass

import numpy as np

ALIGN = 16


def step_arrays(batch) -> dict[str, np.ndarray]:
    """The per-step arrays of `batch` (a luce.models.batch.ForwardBatch, duck typed: its
    step_arrays()), in arena order and device dtypes."""
    return batch.step_arrays()


def pack(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, tuple[int, np.dtype, tuple]]]:
    """-> (bytes [n] uint8, layout {name: (byte offset, dtype, shape)}): each array's bytes at
    its offset, zeros up to the next multiple of ALIGN (an empty array takes ALIGN bytes)."""
    layout, parts, offset = {}, [], 0
    for name, a in arrays.items():
        data = a.tobytes()
        n = len(data)
        size = -(-n // ALIGN) * ALIGN or ALIGN
        layout[name] = (offset, a.dtype, a.shape)
        parts += (data, _ZEROS[:size - n])
        offset += size
    return np.frombuffer(b"".join(parts), np.uint8), layout


_ZEROS = bytes(ALIGN)


@dataclass
class StepMeta:
    """A step's arena on the device: `view(name)` is the CudaArray of one array."""

    device: object            # CudaArray uint8 [n]
    layout: dict
    max_kv: int               # attention grid span (bucketed: equal for steps of one graph key)
    has_kv_rows: bool         # some live row writes KV
    packer: struct.Struct | None = None   # the layout as a struct: `rewrite` packs a step's values with it
    host: np.ndarray | None = None        # [n] uint8 host buffer it packs into
    signature: tuple = ()                 # (names, element counts) of the layout

    def __post_init__(self):
        fmt, end = ["<"], 0
        for offset, dtype, shape in self.layout.values():
            if dtype.kind != "i" or dtype.itemsize not in (4, 8):
                return                        # not step values (rewrite_arrays packs these)
            n = math.prod(shape)
            fmt.append(f"{offset - end}x{n}{'i' if dtype.itemsize == 4 else 'q'}")
            end = offset + n * dtype.itemsize
        fmt.append(f"{self.device.shape[0] - end}x")
        self.packer = struct.Struct("".join(fmt))
        self.host = np.zeros(self.packer.size, np.uint8)
        self.signature = (tuple(self.layout), tuple(math.prod(shape) for _, _, shape in self.layout.values()))

    def view(self, name: str):
        from luce.ops.cuda_array import CudaArray

        offset, dtype, shape = self.layout[name]
        return CudaArray(self.device.block, self.device.ptr + offset, shape, dtype, self.device.backend)

    def ptr(self, name: str) -> int:
        return self.device.ptr + self.layout[name][0]


MIRRORED = ("token_ids", "positions", "logits_indices")   # batch arrays ops receive as host arrays


class Mirrors:
    """Host arrays of recent batches -> their arena copies, by identity (views resolve to the
    same rows of the copy)."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._map: dict[int, tuple] = {}

    def add(self, host: np.ndarray, device) -> None:
        if len(self._map) >= self.keep:
            self._map = {k: v for k, v in self._map.items() if v[0]() is not None}
            while len(self._map) >= self.keep:
                self._map.pop(next(iter(self._map)))
        self._map[id(host)] = (weakref.ref(host), device)

    def find(self, host):
        """The device array for `host` (a registered array or a contiguous view of one), or None."""
        if not isinstance(host, np.ndarray):
            return None
        base = host if host.base is None else host.base
        entry = self._map.get(id(base))
        if entry is None or entry[0]() is not base or not host.flags.c_contiguous:
            return None
        device = entry[1]
        elem = (host.ctypes.data - base.ctypes.data) // max(base.itemsize, 1)
        if base.ndim > 1 or host.size == 0:
            return device if host is base else None
        from luce.ops.cuda_array import CudaArray

        return CudaArray(device.block, device.ptr + elem * device.dtype.itemsize, host.shape, device.dtype,
                         device.backend)


def bind(backend, batch, allocator=None) -> StepMeta:
    """Upload `batch`'s arena (from `allocator`, a graph's pool, when given), remember it on
    the batch and register the batch's host arrays as mirrors."""
    from luce.ops.cuda_array import Block, CudaArray

    arrays = step_arrays(batch)
    buf, layout = pack(arrays)
    block = Block(allocator or backend.allocator, buf.nbytes)
    device = CudaArray(block, block.ptr, buf.shape, np.uint8, backend)
    backend.staging.upload(device.ptr, buf)
    live = [s for s in range(batch.n_segments) if batch.seq_slots[s] >= 0]
    meta = StepMeta(device, layout, batch.kv_span,
                    any(batch.qo_indptr[s + 1] > batch.qo_indptr[s] for s in live))
    batch.__dict__["_cuda_step_meta"] = meta
    for name in MIRRORED:
        backend.mirrors.add(getattr(batch, name), meta.view(name))
    return meta


def rewrite(backend, meta: StepMeta, batch) -> None:
    """Pack `batch` into an existing arena (a replayed graph's); the layout must match: the
    batch's step values (ForwardBatch.step_values, the lists step_arrays are made of) are the
    arena's names with its element counts, each name keeping its dtype."""
    values = batch.step_values()
    if (tuple(values), tuple(map(len, values.values()))) != meta.signature or batch.kv_span != meta.max_kv:
        raise ValueError("the step does not fit the graph's metadata arena (a graph key that does not fix "
                         "every shape)")
    meta.packer.pack_into(meta.host, 0, *itertools.chain.from_iterable(values.values()))
    backend.staging.upload(meta.device.ptr, meta.host)
    batch.__dict__["_cuda_step_meta"] = meta


def meta_of(backend, batch) -> StepMeta:
    """The batch's arena, uploaded on first use."""
    meta = batch.__dict__.get("_cuda_step_meta")
    if meta is None or meta.device.backend is not backend:
        meta = bind(backend, batch)
    return meta


def bind_arrays(backend, arrays: dict[str, np.ndarray], allocator=None) -> StepMeta:
    """An arena for a call's own host arrays (a tree commit's path and KV moves): uploaded
    once, each array registered as a mirror, so ops given these very arrays read the arena."""
    from luce.ops.cuda_array import Block, CudaArray

    buf, layout = pack(arrays)
    block = Block(allocator or backend.allocator, buf.nbytes)
    meta = StepMeta(CudaArray(block, block.ptr, buf.shape, np.uint8, backend), layout, 0, False)
    backend.staging.upload(meta.device.ptr, buf)
    for name, host in arrays.items():
        backend.mirrors.add(host, meta.view(name))
    return meta


def rewrite_arrays(backend, meta: StepMeta, arrays: dict[str, np.ndarray]) -> None:
    buf, layout = pack(arrays)
    if layout != meta.layout:    # same names, dtypes and shapes in order
        raise ValueError("the call's arrays do not fit the graph's arena")
    backend.staging.upload(meta.device.ptr, buf)
