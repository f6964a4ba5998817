"""The CUDA backend's fused ops (mixed into CudaBackend; kernels in cuda/norm_quant.cu and
cuda/rope_kv.cu, references in luce/ref/norm_quant.py and rope_kv.py): residual add + RMSNorm + the next matmul's
activation quantization in one launch, SwiGLU + quantization in one launch, q/k norm +
rotary + KV write in one launch, and merged weights so q/k/v or gate/up go through one
matmul launch. Every result is bitwise the unfused ops'
(the fused kernels share the unfused kernels' device code). The fused quantization is the
decode family's: a step whose matmuls send rows to the prompt-row GEMM (prefill_spans,
CudaBackend.has_prompt_rows) takes the unfused composition, whose add / norm / SwiGLU bits
are the same, so a row's result never depends on what else is in the step.
"""
from __future__ import annotations

import numpy as np

from luce.ops.api import FusedOps
from luce.ops.cuda_array import Block


class CudaFusedOps(FusedOps):
    """Mixin of CudaBackend (uses its empty / _f32 / memcpy / _matmuls / has_prompt_rows / stream)."""

    def _quant_workspace(self, rows: int, k: int, weights):
        """(workspace, bytes) for x [rows, k] quantized once for the block-type weights, or
        (None, 0) where the fused kernels cannot quantize (float weights only, k % 32)."""
        from luce import _cuda_matmul as km

        if rows == 0 or k % 32 or all(w.qtype in km.FLOAT_QTYPES for w in weights):
            return None, 0
        ws_bytes = km.workspace_bytes(rows, k)
        return self.empty((ws_bytes,), np.uint8), ws_bytes

    def add_rmsnorm_matmuls(self, x, residual, weight, eps: float, weights, biases=None, prefill_spans=()):
        from luce import _cuda_fused as kf

        x, weight = self._f32(x), self._f32(weight)
        if x.ndim != 2 or weight.shape != (x.shape[1],):
            raise ValueError(f"add_rmsnorm_matmuls: x {x.shape} with norm weight {weight.shape}: want [T, D] and [D]")
        if residual is not None:
            residual = self._f32(residual)
            if residual.shape != x.shape:
                raise ValueError(f"add_rmsnorm_matmuls: residual {residual.shape} differs from x {x.shape}")
        T, D = x.shape
        if self.has_prompt_rows(T, prefill_spans):
            return super().add_rmsnorm_matmuls(x, residual, weight, eps, weights, biases, prefill_spans)
        s = x if residual is None else self.empty(x.shape)
        normed = self.empty(x.shape)
        workspace, ws_bytes = self._quant_workspace(T, D, weights)
        if T:
            kf.add_rmsnorm(x.ptr, 0 if residual is None else residual.ptr, weight.ptr,
                           0 if residual is None else s.ptr, normed.ptr, 0 if workspace is None else workspace.ptr,
                           ws_bytes, T, D, eps, self.stream)
        return s, self._matmuls(normed, weights, biases, (), _quantized(workspace, ws_bytes))

    def swiglu_matmul(self, gate, up, w, prefill_spans=()):
        from luce import _cuda_fused as kf

        gate = self._f32(gate)
        if gate.ndim != 2:
            raise ValueError(f"swiglu_matmul: gate {gate.shape}, want [T, F] (or [T, 2F] with up None)")
        T = gate.shape[0]
        if up is None:
            if gate.shape[1] % 2:
                raise ValueError(f"swiglu_matmul: a fused gate|up projection has an even width, got {gate.shape}")
            F = gate.shape[1] // 2
            gate_ptr, up_ptr, stride = gate.ptr, gate.ptr + 4 * F, 2 * F
        else:
            up = self._f32(up)
            if up.shape != gate.shape:
                raise ValueError(f"swiglu_matmul: gate {gate.shape} and up {up.shape} differ")
            F = gate.shape[1]
            gate_ptr, up_ptr, stride = gate.ptr, up.ptr, F
        if w.k != F:
            raise ValueError(f"swiglu_matmul: {F} columns into a weight [{w.n}, {w.k}]")
        if self.has_prompt_rows(T, prefill_spans):
            return super().swiglu_matmul(gate, up, w, prefill_spans)
        workspace, ws_bytes = self._quant_workspace(T, F, [w])
        if workspace is None:
            return super().swiglu_matmul(gate, up, w)
        act = self.empty((T, F))
        kf.swiglu_quant(gate_ptr, up_ptr, act.ptr, workspace.ptr, ws_bytes, T, F, stride, stride, self.stream)
        return self._matmuls(act, [w], None, (), (workspace, ws_bytes))[0]

    def rope_kv_write(self, parts, kv, batch, n_head: int, rope_dim: int, theta: float, sections=(),
                      q_norm=None, k_norm=None, eps: float = 0.0):
        from luce import _cuda_fused as kf
        from luce.ops.cuda_step_meta import meta_of

        Hkv, D = kv.k.shape[2], kv.k.shape[3]
        parts = [self._f32(p) for p in parts]
        T = parts[0].shape[0]
        widths = [n_head * D, Hkv * D, Hkv * D]
        if any(p.ndim != 2 or p.shape[0] != T for p in parts) or sum(p.shape[1] for p in parts) != sum(widths):
            raise ValueError(f"rope_kv_write: parts {[p.shape for p in parts]} are not [T, q | k | v] columns "
                             f"{widths} for {n_head} query / {Hkv} KV heads of {D}")
        views = _column_views(parts, widths)
        pos = np.asarray(batch.positions, dtype=np.int32)
        n_pos = 1 if pos.ndim == 1 else pos.shape[-1]
        meta = meta_of(self, batch)
        if views is None or D > 1024 or T == 0 or not meta.has_kv_rows:
            return super().rope_kv_write(parts, kv, batch, n_head, rope_dim, theta, sections, q_norm, k_norm, eps)
        if rope_dim > D or rope_dim % 2 or pos.shape[0] != T or n_pos not in (1, 4) or (n_pos == 4 and not sections):
            raise ValueError(f"rope_kv_write: rope_dim {rope_dim} of head_dim {D}, positions {pos.shape} for {T} rows "
                             f"(sections {tuple(sections)})")
        q_norm = None if q_norm is None else self._f32(q_norm)
        k_norm = None if k_norm is None else self._f32(k_norm)
        q_out = self.empty((T, n_head, D))
        (q, q_stride), (k, k_stride), (v, v_stride) = views
        kf.rope_kv(q, k, v, 0 if q_norm is None else q_norm.ptr, 0 if k_norm is None else k_norm.ptr, q_out.ptr,
                   kv.k.ptr, kv.v.ptr, meta.ptr("kv_dst"), self._dev(batch.positions, np.int32).ptr, T,
                   q_stride, k_stride, v_stride, n_head, Hkv, D, rope_dim, theta, tuple(sections), n_pos, eps,
                   self.stream)
        return q_out

    def merge_weights(self, weights):
        """Block-type weights of one ggml type and width -> one QuantWeight [sum n, k] (their
        rows copied in turn; a row's products do not depend on the matrix it sits in)."""
        from luce import _cuda_matmul as km
        from luce.ops.cuda_backend import QuantWeight

        first = weights[0]
        if len(weights) < 2 or first.qtype in km.FLOAT_QTYPES or any(
                (w.qtype, w.k, w.row_bytes) != (first.qtype, first.k, first.row_bytes) for w in weights):
            return None
        n = sum(w.n for w in weights)
        block = Block(self.allocator, n * first.row_bytes)
        offset = 0
        for w in weights:
            self.memcpy(block.ptr + offset, w.ptr, w.n * w.row_bytes)
            offset += w.n * w.row_bytes
        return QuantWeight(block, block.ptr, first.qtype, n, first.k, first.row_bytes)


def _quantized(workspace, ws_bytes: int):
    """_matmuls' `quantized` from a fused producer's workspace (None: x is not quantized)."""
    return None if workspace is None else (workspace, ws_bytes)


def _column_views(parts, widths):
    """(device address, row stride in elements) of each of the column blocks `widths` laid
    side by side over `parts` [T, w_i]; None when a block straddles two parts."""
    views, i, col = [], 0, 0
    for width in widths:
        if col == parts[i].shape[1]:
            i, col = i + 1, 0
        if col + width > parts[i].shape[1]:
            return None
        views.append((parts[i].ptr + 4 * col, parts[i].shape[1]))
        col += width
    return views
