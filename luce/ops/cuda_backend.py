"""The GPU backend: luce.ops.api.Backend on device arrays (luce/ops/cuda_array.py) and the
kernel library (cuda/*.cu through the luce._cuda_<family> launch modules), over a GPU runtime
(luce/ops/gpu_runtime.py): CUDA (libluce_cuda.so) or HIP (libluce_hip.so); `name` is the
runtime's.

Weights stay in their GGUF blocks on the device (`QuantWeight`); matmul and embedding decode
them on the fly. Every launch and copy goes to one stream (`self.stream`); ops never
synchronize with the host except those returning host arrays (`to_numpy`, `argmax`,
`top_k_logprobs`). Ops never modify their inputs (the recurrent state keeps references:
a snapshot is the arrays of a slot); `kv_write` / `kv_move_rows` write the KV pages in place.
Attention, KV and the Gated DeltaNet ops are in luce/ops/cuda_sequence_ops.py, the step ops
over every segment (and the tree commit) in luce/ops/cuda_step_ops.py, argmax and
top-k in luce/ops/cuda_sampling_ops.py, elementwise ops in luce/ops/cuda_pointwise_ops.py,
row copies (split, concat_rows, take_rows, put_rows) in luce/ops/cuda_row_ops.py, graph
capture in luce/ops/cuda_graph.py.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np

from luce.gguf.quants import qtype_name
from luce.ops.cuda_array import Block, CudaArray, DeviceAllocator, StagingRing
from luce.ops.cuda_fused_ops import CudaFusedOps
from luce.ops.cuda_graph import GraphMixin
from luce.ops.cuda_ids_ops import IdsOps
from luce.ops.cuda_pointwise_ops import PointwiseOps
from luce.ops.cuda_row_ops import RowOps
from luce.ops.cuda_sampling_ops import SamplingOps
from luce.ops.cuda_sequence_ops import SequenceOps
from luce.ops.cuda_step_meta import Mirrors
from luce.ops.cuda_step_ops import StepOps
from luce.ops.quant_weight import QuantWeight

DTYPES = (np.float32, np.int32, np.int64)
X_ONCE_ON = os.environ.get("LUCE_MATMUL_X_ONCE", "1") != "0"   # CudaBackend._matmuls (A/B runs: "0")
# X_ONCE only for small matrices: every block of the one-row kernel quantizes the whole x itself.
# On the H200 the 27B's out projections (k = 6,144) ran 2-3.5% slower a step with it (docs/PERF.md,
# session 16: four calls), the 0.5B's LM head (n = 151,936, a thousand blocks) 1% slower in one
# run; the Coder models' out projections (k = 896, 1,536) keep it.
X_ONCE_MAX_N = int(os.environ.get("LUCE_MATMUL_X_ONCE_MAX_N", "65536"))
X_ONCE_MAX_K = int(os.environ.get("LUCE_MATMUL_X_ONCE_MAX_K", "4096"))
# Every decode-chain launch overlapping the kernel ahead (fit_to_model): on the H200 the Coder-0.5B
# (hidden 896) and 1.5B (1,536) ran at 1,054 / 752 tok/s with it against 1,038 / 733 without
# (+1.6% / +2.6%, two calls on two machines: docs/PERF.md, session 22, where the A/B in one call
# is still to run), and the 27B (5,120) lost 4-5% (session 15): small models' steps are short
# kernels, launch-bound.
SMALL_MODEL_HIDDEN = 2048
widest_model_hidden = 0   # of the models this process loaded, on any backend (the library's choice is per process)


def row_runs(rows: int, prefill_spans) -> list[tuple[int, int, bool]]:
    """[(start, end, is_prompt)] covering rows 0..rows-1 in order: the prefill spans (clipped,
    in order, not overlapping) and the decode rows between them."""
    runs, at = [], 0
    for r0, r1 in prefill_spans:
        r0, r1 = max(int(r0), at), min(int(r1), rows)
        if r1 <= r0:
            continue
        if r0 > at:
            runs.append((at, r0, False))
        runs.append((r0, r1, True))
        at = r1
    if at < rows:
        runs.append((at, rows, False))
    return runs


class CudaBackend(CudaFusedOps, StepOps, SequenceOps, SamplingOps, IdsOps, PointwiseOps, RowOps, GraphMixin):
    """luce.ops.api.Backend on one GPU; Array = CudaArray, Weight = QuantWeight. `runtime`:
    a luce.ops.gpu_runtime.GpuRuntime (default CUDA's)."""

    name = "cuda"
    supports_graphs = True
    launches_async = True     # kernels queue on a stream: the host may run a step ahead (luce.engine.ahead)

    def __init__(self, runtime=None):
        from luce import _cuda_matmul
        from luce.ops.gpu_runtime import get_runtime

        self.runtime = runtime or get_runtime("cuda")
        self.name = self.runtime.name
        self.lib = self.runtime.load_kernels()
        self.stream = self.runtime.stream_create()
        self.allocator = DeviceAllocator(self.runtime)
        self.staging = StagingRing(self.runtime, self.stream)
        self.matmul_qtypes = dict(_cuda_matmul.QTYPES)
        self.prefill_gemm = os.environ.get("LUCE_PREFILL_GEMM", "1") != "0"  # prompt rows: matmul_prefill
        self.mirrors = Mirrors()
        self._init_sequence_ops()
        self._init_step_ops()
        self._init_row_ops()
        self._init_graphs()

    def fit_to_model(self, config) -> None:
        """Backend.fit_to_model: while every model this process loaded is small (hidden size <=
        SMALL_MODEL_HIDDEN), every decode-chain launch may overlap the kernel ahead, not only the
        matmuls and the decode attention (luce._cuda.set_decode_overlap; LUCE_PDL, when set,
        decides instead). Results never depend on it."""
        from luce import _cuda

        global widest_model_hidden
        widest_model_hidden = max(widest_model_hidden, int(config.hidden))
        _cuda.set_decode_overlap(widest_model_hidden <= SMALL_MODEL_HIDDEN)

    # ---- memory ---------------------------------------------------------------------------
    def empty(self, shape: Sequence[int], dtype=np.float32) -> CudaArray:
        """Uninitialized device array (contents are whatever the block held)."""
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        block = Block(self.allocator, math.prod(shape) * dtype.itemsize)
        return CudaArray(block, block.ptr, shape, dtype, self)

    def upload(self, host: np.ndarray) -> CudaArray:
        """Host array (f32, int32 or int64) -> device copy, queued on the stream."""
        host = np.ascontiguousarray(host)
        if host.dtype not in DTYPES:
            raise TypeError(f"device arrays are float32, int32 or int64, got {host.dtype}")
        if self.capturing:
            return self._captured_upload(host)
        out = self.empty(host.shape, host.dtype)
        self.staging.upload(out.ptr, host)
        self._recorded(host, out)
        return out

    def _dev(self, host, dtype) -> CudaArray:
        """A host index array as a device array of `dtype`: the step arena's copy when `host`
        is (a view of) a mirrored batch array, else an upload."""
        found = self.mirrors.find(host)
        if found is not None and found.dtype == np.dtype(dtype):
            return found
        return self.upload(np.asarray(host, dtype=dtype))

    def copy_into(self, dst: CudaArray, src) -> None:
        src = src if isinstance(src, CudaArray) else self.upload(np.asarray(src, dtype=dst.dtype))
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValueError(f"copy_into: {src.shape} {src.dtype} into {dst.shape} {dst.dtype}")
        if src.ptr != dst.ptr:
            self.memcpy(dst.ptr, src.ptr, dst.nbytes)

    def asarray(self, x) -> CudaArray:
        if isinstance(x, CudaArray):
            return self.copy(x)
        x = np.asarray(x)
        if x.dtype.kind == "f":
            x = x.astype(np.float32, copy=False)
        elif x.dtype.kind in "iub" and x.dtype not in (np.int32, np.int64):
            x = x.astype(np.int64)
        return self.upload(x)

    def copy(self, x: CudaArray) -> CudaArray:
        out = self.empty(x.shape, x.dtype)
        self.memcpy(out.ptr, x.ptr, x.nbytes)
        return out

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy on the stream."""
        if nbytes:
            self.runtime.copy_d2d_async(dst, src, nbytes, self.stream)

    def to_numpy(self, x) -> np.ndarray:
        if not isinstance(x, CudaArray):
            return np.asarray(x)
        out = np.empty(x.shape, x.dtype)
        if out.nbytes:
            self.runtime.copy_d2h_async(out.ctypes.data, x.ptr, out.nbytes, self.stream)
        self.synchronize()
        return out

    def synchronize(self) -> None:
        self.runtime.synchronize(self.stream)

    def zeros(self, shape: Sequence[int], dtype=np.float32) -> CudaArray:
        out = self.empty(shape, dtype)
        if out.nbytes:
            self.runtime.memset_async(out.ptr, 0, out.nbytes, self.stream)
        return out

    def _f32(self, x) -> CudaArray:
        """x as a device f32 array (host arrays are uploaded: tests and tools pass them)."""
        if isinstance(x, CudaArray):
            if x.dtype != np.float32:
                raise TypeError(f"expected a float32 array, got {x.dtype} {x.shape}")
            return x
        return self.upload(np.asarray(x, dtype=np.float32))

    # ---- weights ------------------------------------------------------------------------------
    def load_weight(self, gguf, name: str) -> QuantWeight:
        info = gguf.tensor_info(name)
        shape = tuple(int(s) for s in info.shape)
        if len(shape) != 2:
            raise ValueError(f"{name}: a Weight is a matrix [N, K], the tensor has shape {shape}")
        return self._upload_weight(np.asarray(gguf.raw(name)), int(info.qtype), shape, name)

    def weight_rows(self, w: QuantWeight, n: int) -> QuantWeight:
        if not 1 <= n <= w.n:
            raise ValueError(f"weight_rows: need 1 <= n <= {w.n}, got {n}")
        return dataclasses.replace(w, n=n)   # rows are row_bytes apart from ptr: a prefix is a view

    def weight_from_array(self, w: np.ndarray) -> QuantWeight:
        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.ndim != 2:
            raise ValueError(f"a Weight is a matrix [N, K], got shape {w.shape}")
        return self._upload_weight(w.view(np.uint8).reshape(w.shape[0], -1), 0, w.shape, "array")

    def _upload_weight(self, raw: np.ndarray, qtype: int, shape, name: str) -> QuantWeight:
        from luce import _cuda_matmul

        if qtype not in self.matmul_qtypes.values():
            raise ValueError(f"{name}: weights of type {qtype_name(qtype)} are not supported by the CUDA "
                             f"backend; supported: {', '.join(sorted(self.matmul_qtypes))} "
                             "(re-quantize the model, or use --backend numpy)")
        n, k = shape
        row_bytes = _cuda_matmul.row_bytes(qtype, k)
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        if raw.nbytes != n * row_bytes:
            raise ValueError(f"{name}: {raw.nbytes} bytes for a {qtype_name(qtype)} matrix {shape} "
                             f"that needs {n * row_bytes}")
        block = Block(self.allocator, raw.nbytes)
        self.staging.upload(block.ptr, raw)
        return QuantWeight(block, block.ptr, qtype, n, k, row_bytes)

    def load_tensor(self, gguf, name: str) -> CudaArray:
        from luce.gguf import quants

        info = gguf.tensor_info(name)
        out = quants.dequantize(gguf.raw(name), info.qtype, tuple(info.shape))
        return self.upload(np.ascontiguousarray(out, dtype=np.float32).reshape(tuple(info.shape)))

    # ---- dense maths --------------------------------------------------------------------------
    def embedding(self, table: QuantWeight, token_ids: np.ndarray) -> CudaArray:
        from luce import _cuda_embedding as ke

        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= table.n):
            raise IndexError(f"token id out of range [0, {table.n}): {ids.min()}..{ids.max()}")
        out = self.empty((ids.size, table.k))
        dev_ids = self._dev(token_ids, np.int32)
        for t0 in range(0, ids.size, ke.MAX_TOKENS):
            t = min(ke.MAX_TOKENS, ids.size - t0)
            ke.embedding(table.ptr, dev_ids.ptr + 4 * t0, out.ptr + 4 * t0 * table.k, table.n, table.k,
                         table.row_bytes, t, table.qtype, stream=self.stream)
        return out

    def matmul(self, x, w: QuantWeight, bias=None, prefill_spans=()) -> CudaArray:
        return self.matmuls(x, [w], [bias], prefill_spans)[0]

    def prompt_split_k(self, w: QuantWeight) -> int:
        """The k parts the prompt GEMM's tune 81 runs for w on this device (1: it does not split)."""
        from luce import _cuda_matmul as km

        return 1 if w.qtype in km.FLOAT_QTYPES else km.prefill_split_k(w.qtype, w.n, w.k)

    def matmuls(self, x, weights: Sequence[QuantWeight], biases=None, prefill_spans=()) -> list[CudaArray]:
        """[x @ w^T (+ b)] for each weight: block-type weights share one quantization of x
        (LUCE_MATMUL_REUSE_X), so the activation pass runs once for q/k/v or gate/up. Block
        types multiply the rows of prefill_spans (prompt rows, DESIGN 5 rule 1) with the
        prompt-row GEMM (8-bit x, cuda/matmul_prefill.cu) and the others with the decode
        family; with LUCE_PREFILL_GEMM=0 in the environment at start every row takes the
        decode family."""
        return self._matmuls(self._f32(x), weights, biases, prefill_spans)

    def has_prompt_rows(self, rows: int, prefill_spans) -> bool:
        """Whether matmuls of `rows` rows sends any of prefill_spans to the prompt-row GEMM."""
        return any(prompt for _, _, prompt in self._row_runs(rows, prefill_spans))

    def _row_runs(self, rows: int, prefill_spans) -> list[tuple[int, int, bool]]:
        return row_runs(rows, prefill_spans if self.prefill_gemm else ())

    def _matmuls(self, x: CudaArray, weights, biases, prefill_spans=(), quantized=None) -> list[CudaArray]:
        """matmuls; `quantized` None, or (workspace, bytes) holding all of x already quantized
        for the decode family (a fused producer, luce/ops/cuda_fused_ops.py; no prompt rows
        then) for every block-type weight."""
        from luce import _cuda_matmul as km

        biases = list(biases) if biases is not None else [None] * len(weights)
        rows = x.shape[0] if x.ndim == 2 else -1
        runs = self._row_runs(rows, prefill_spans)
        outs, workspaces = [], {}
        # X_ONCE where no REUSE_X call follows the call that quantizes a run's x: one block-type
        # weight (the out projection, the LM head); its one-row decode calls then quantize x in
        # lane (cuda/matmul_gemv_x.cuh), one launch fewer. LUCE_MATMUL_X_ONCE=0: never (A/B runs).
        once = km.X_ONCE if self.quantizes_in_lane(weights) else 0
        if quantized is not None:
            if runs != [(0, rows, False)]:
                raise ValueError(f"matmul: x quantized for the decode family, but the rows run {runs}")
            workspaces[0] = quantized
        pair = self._matmul_pair(x, weights, biases, runs, workspaces)   # one launch (cuda_fused_ops)
        if pair is not None:
            return pair
        for w, bias in zip(weights, biases):
            if x.ndim != 2 or x.shape[1] != w.k:
                raise ValueError(f"matmul: x {x.shape} does not match the weight [{w.n}, {w.k}]")
            y = self.empty((rows, w.n))
            outs.append(y)
            if rows == 0:
                continue
            bias_ptr = self._bias_ptr(bias, w)
            if w.qtype in km.FLOAT_QTYPES:
                km.matmul(x.ptr, w.ptr, bias_ptr, y.ptr, 0, 0, rows, w.n, w.k, w.qtype, km.PATH_DECODE, 0, 0,
                          self.stream)
                continue
            for r0, r1, prompt in runs:   # x and y from row r0 on (k % 32 == 0 keeps x 16-byte aligned)
                size_of = km.prefill_workspace_bytes if prompt else km.workspace_bytes
                ws, nb, flags = self._matmul_workspace(workspaces, r0, r1 - r0, w.k, size_of)
                xr, yr = x.ptr + 4 * r0 * w.k, y.ptr + 4 * r0 * w.n
                if prompt:
                    km.matmul_prefill(xr, w.ptr, bias_ptr, yr, ws.ptr, nb, r1 - r0, w.n, w.k, w.qtype, flags,
                                      self.stream, w.prompt_tune)
                else:
                    if flags == 0:
                        flags = once
                    tune = w.decode_tune if r1 - r0 > 16 else 0
                    km.matmul(xr, w.ptr, bias_ptr, yr, ws.ptr, nb, r1 - r0, w.n, w.k, w.qtype, km.PATH_DECODE, flags,
                              tune, self.stream)
        return outs

    def quantizes_in_lane(self, weights) -> bool:
        """Whether a decode-family matmuls call over `weights` takes X_ONCE: one block-type weight
        small enough (X_ONCE_MAX_N, X_ONCE_MAX_K) that its one-row calls quantize x in lane."""
        from luce import _cuda_matmul as km

        blocks = [w for w in weights if w.qtype not in km.FLOAT_QTYPES]
        return X_ONCE_ON and len(blocks) == 1 and blocks[0].n <= X_ONCE_MAX_N and blocks[0].k <= X_ONCE_MAX_K

    def _bias_ptr(self, bias, w) -> int:
        """Device address of a matmul's bias [w.n] (0: none)."""
        if bias is None:
            return 0
        bias = self._f32(bias)
        if bias.shape != (w.n,):
            raise ValueError(f"matmul: bias {bias.shape}, expected ({w.n},)")
        return bias.ptr

    def _matmul_workspace(self, workspaces: dict, run: int, rows: int, k: int, size_of):
        """(buffer, bytes, flags) of the quantized x of the run of rows starting at `run` for
        one matmuls call: allocated by its first weight (flags 0: quantize x), REUSE_X after."""
        from luce import _cuda_matmul as km

        if run in workspaces:
            return (*workspaces[run], km.REUSE_X)
        nb = size_of(rows, k)
        workspaces[run] = (self.empty((max(nb, 16),), np.uint8), nb)
        return (*workspaces[run], 0)

    def rmsnorm(self, x, weight, eps: float) -> CudaArray:
        from luce import _cuda

        x, weight = self._f32(x), self._f32(weight)
        out = self.empty(x.shape)
        if x.size:
            _cuda.rmsnorm(x.ptr, weight.ptr, out.ptr, x.size // x.shape[-1], x.shape[-1], eps, self.stream)
        return out

    def rope(self, x, positions, rope_dim: int, theta: float, sections: Sequence[int] = ()) -> CudaArray:
        from luce import _cuda_elementwise as ke

        x = self._f32(x)
        if x.ndim != 3 or rope_dim > x.shape[2] or rope_dim % 2:
            raise ValueError(f"rope wants x [T, H, D] and an even rope_dim <= D, got {x.shape}, rope_dim={rope_dim}")
        pos = np.asarray(positions, dtype=np.int32)
        n_pos = 1 if pos.ndim == 1 else pos.shape[-1]
        if pos.shape[0] != x.shape[0] or n_pos not in (1, 4) or (n_pos == 4 and not sections):
            raise ValueError(f"rope: positions {pos.shape} do not fit x {x.shape} (sections {tuple(sections)})")
        out = self.empty(x.shape)
        if x.size:
            ke.rotary(x.ptr, out.ptr, self._dev(positions, np.int32).ptr, x.shape[0], x.shape[1], x.shape[2], rope_dim, theta,
                      tuple(sections), n_pos, stream=self.stream)
        return out

    def swiglu(self, gate, up) -> CudaArray:
        from luce import _cuda_elementwise as ke

        gate, up = self._f32(gate), self._f32(up)
        if gate.shape != up.shape:
            raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} differ")
        out = self.empty(gate.shape)
        if gate.size:
            ke.swiglu(gate.ptr, up.ptr, out.ptr, gate.size // gate.shape[-1], gate.shape[-1], stream=self.stream)
        return out

    def gated_rmsnorm(self, x, z, weight, eps: float) -> CudaArray:
        from luce import _cuda_elementwise as ke

        x, z, weight = self._f32(x), self._f32(z), self._f32(weight)
        if x.shape != z.shape:
            raise ValueError(f"gated_rmsnorm: x {x.shape} and z {z.shape} differ")
        out = self.empty(x.shape)
        if x.size:
            ke.gated_rmsnorm(x.ptr, z.ptr, weight.ptr, out.ptr, x.size // x.shape[-1], x.shape[-1], eps,
                             self.stream)
        return out
