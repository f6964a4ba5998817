"""The CUDA backend's step ops (luce.ops.api conv1d_step, gdn_step, tree_commit, concat_cols):
every segment of a step in one launch per op per layer, slots and offsets read from the step's
metadata arena (luce/ops/cuda_step_meta.py), so mixed steps [prefill][AR][tree] capture and
replay like decode steps (mixed into CudaBackend).

Per GDN layer: conv1d over the ordinary segments (in place) and conv_tree over the tree
segments, both into one output; the recurrent step over AR segments, the chunked form over
prefill segments (chunks cut at absolute multiples of 64 from each segment's start_pos) and
the tree verify over the tree block (rows tree_start.. as a batch of its own: block_qo,
block_slots, block_parents), factor capture ('factor') or per-node stored states
('baseline'), both bitwise the AR kernel along every path. Commit: conv_tree_commit and
gdn_tree_commit (or one gather of the accepted leaves' states) over every slot at once.
What the commit reads (TreeStage: conv inputs, factors or per-node states) lies in one
scratch per layer (`_stage`), so the commit's captured graph repeats with the topology.
"""
from __future__ import annotations

import numpy as np

from luce.ops.api import SEG_AR, SEG_PREFILL, TREE_MODES
from luce.ops.cuda_step_meta import meta_of
from luce.ref.gdn_tree import TreeFactors

GDN_KEY_DIMS = (64, 128, 256)


class StepOps:
    """Mixin of CudaBackend (uses its empty/zeros/_f32/_dev/_gdn_args/stream)."""

    def _init_step_ops(self) -> None:
        self._scratch_allocator = self.allocator     # the backend's, not a graph's pool
        self._stage_buffers: dict = {}               # (state pool address, name) -> stage scratch [rows, row]
        self._stage_outgrown: list = []

    def _step_output(self, shape, batch):
        """An output [T, ...] of a step op: rows of the tree block zeroed (its padding rows
        reach the LM head, so they must hold finite values; no kernel writes them). Other
        padding rows never reach it and stay as they are."""
        out = self.empty(shape)
        t0 = batch.tree_start
        if batch.has_trees and out.nbytes:
            row = out.nbytes // shape[0]
            self.runtime.memset_async(out.ptr + t0 * row, 0, (shape[0] - t0) * row, self.stream)
        return out

    def _stage(self, pool, name: str, shape, capacity: int = 0):
        """[n, ...] f32 of what a GDN layer's tree verify keeps for the commit (ForwardOutput.staged:
        'conv_inputs', the factors 'k' 'g' 'beta' 'u', or 'node_states'): the first n rows of a
        scratch of the layer (keyed by its state pool) and name, at one address for every
        captured graph and eager step. So a tree commit's graph, which reads them at fixed
        addresses, repeats whether the verify ran eagerly, was captured or replayed (an address
        in each graph's pool made the commit's key new after every capture), and the graphs
        hold no copy each (per-node states: up to 18 GiB a key at the 27B shape with 4 trees).
        Only one forward's stage is live at a time: the commit reads it before the next
        forward. The factors and conv inputs are first made `capacity` rows (a tree of the
        step's width on every slot), so their address stays put when later steps carry more
        trees (a buffer grown after the warm-up makes the commits' keys new again); per-node
        states (~60x a factor row: 3 MiB a row and layer at 27B) start at what the step needs,
        so a commit topology met only before they grew meets a new key once. Past that it
        grows by doubling; an outgrown buffer is kept, as a captured graph may still write it."""
        from luce.ops.cuda_array import Block, CudaArray

        n, row = shape[0], int(np.prod(shape[1:], dtype=np.int64))
        key = (pool.ptr, name)
        buf = self._stage_buffers.get(key)
        if buf is None or buf.shape[0] < n or buf.shape[1] != row:
            if buf is not None:
                self._stage_outgrown.append(buf)
            rows = max(n, capacity, 2 * buf.shape[0] if buf is not None and buf.shape[1] == row else 0, 1)
            block = Block(_Untrimmed(self._scratch_allocator) if self.capturing else self._scratch_allocator,
                          rows * row * 4)   # in a capture no cudaFree may run: out of memory is a MemoryError
            buf = self._stage_buffers[key] = CudaArray(block, block.ptr, (rows, row), np.float32, self)
        return CudaArray(buf.block, buf.ptr, tuple(shape), np.float32, self)

    def stage_tree_rows(self, x, batch, pool):
        from luce import _cuda_gather as kg

        x = self._f32(x)
        t0, (T, W), C = batch.tree_start, x.shape, pool.shape[-1]
        out = self._stage(pool, "conv_inputs", (T - t0, C), stage_capacity(pool, batch))
        if out.nbytes and W == C:
            self.memcpy(out.ptr, x.ptr + t0 * 4 * W, out.nbytes)
        elif out.nbytes:   # the qkv block of a merged projection: one strided copy, as the memcpy
            kg.gather(x.ptr + t0 * 4 * W, out.ptr, 0, 0, T - t0, 4 * C, 4 * W, 4 * C, self.stream)
        return out

    def concat_cols(self, parts):
        from luce import _cuda_gather as kg

        parts = [self._f32(p) for p in parts]
        if not parts or any(p.ndim != 2 or p.shape[0] != parts[0].shape[0] for p in parts):
            raise ValueError(f"concat_cols wants arrays [n, w_i] of one row count, got {[p.shape for p in parts]}")
        n, width = parts[0].shape[0], sum(p.shape[1] for p in parts)
        out = self.empty((n, width))
        col = 0
        for p in parts:
            if n and p.shape[1]:
                kg.gather(p.ptr, out.ptr + 4 * col, 0, 0, n, 4 * p.shape[1], 4 * p.shape[1], 4 * width, self.stream)
            col += p.shape[1]
        return out

    def conv1d_step(self, x, weight, pool, batch, silu: bool = True):
        from luce import _cuda_conv1d as kc
        from luce import _cuda_tree_conv as kt

        x, weight = self._f32(x), self._f32(weight)
        T, C = x.shape
        K = weight.shape[1]
        if weight.shape[0] != C or pool.ndim != 3 or pool.shape[1:] != (K - 1, C) or not 2 <= K <= 8:
            raise ValueError(f"conv1d_step: x {x.shape}, weight {weight.shape}, pool {pool.shape}")
        y = self._step_output((T, C), batch)
        if T == 0:
            return y
        meta, kinds = meta_of(self, batch), batch.kinds
        S = batch.n_segments
        if ((kinds == SEG_PREFILL) | (kinds == SEG_AR)).any():
            slots = meta.ptr("ordinary_slots")
            kc.conv1d(x.ptr, weight.ptr, y.ptr, pool.ptr, pool.ptr, meta.ptr("qo_indptr"), slots, slots, S, C, K,
                      batch.max_rows, silu, stream=self.stream)
        if batch.has_trees:
            kt.conv_tree(x.ptr, weight.ptr, y.ptr, pool.ptr, meta.ptr("qo_indptr"), meta.ptr("tree_slots"),
                         meta.ptr("tree_parents"), S, C, K, batch.max_tree_rows, silu, stream=self.stream)
        return y

    def gdn_step(self, q, k, v, g, beta, pool, batch, mode: str = "factor", norm=None):
        """luce.ops.api gdn_step; norm (a step of tree rows only, mode 'factor'; the fused tree chain
        of cuda_fused_ops): (z address, z row stride, norm weight, rms_eps, normed [T, Hv, Dv],
        arrivals [S, Hv] int32 zeroed) - the tree verify also writes normed = gated_rmsnorm(out, z)
        of the tree rows (out's rows then stay unzeroed: nothing reads them)."""
        from luce import _cuda_gdn as kg
        from luce import _cuda_gdn_tree as kt

        if mode not in TREE_MODES:
            raise ValueError(f"GDN tree mode must be one of {TREE_MODES}, got {mode!r}")
        args, (T, H, dk, dv) = self._gdn_args(q, k, v, g, beta, pool[0])
        if dk not in GDN_KEY_DIMS or dv % 32:
            raise ValueError(f"gdn_step: Dk {dk}, Dv {dv} (kernels: Dk {GDN_KEY_DIMS}, Dv % 32 == 0)")
        if norm is not None and (mode != "factor" or not batch.has_trees or (batch.kinds == SEG_AR).any()
                                 or (batch.kinds == SEG_PREFILL).any()):
            raise ValueError("gdn_step: the norm epilogue is for steps of tree rows only, mode 'factor'")
        out = self._step_output((T, H, dv), batch) if norm is None else self.empty((T, H, dv))
        if T == 0:
            return out, None
        meta, kinds, S, n_slots = meta_of(self, batch), batch.kinds, batch.n_segments, pool.shape[0]
        ptrs = [a.ptr for a in args[:5]]
        if (kinds == SEG_AR).any():
            kg.gdn_recurrent(*ptrs, pool.ptr, out.ptr, meta.ptr("qo_indptr"), meta.ptr("ar_slots"), n_slots, S,
                             H, dk, dv, self.stream)
        if (kinds == SEG_PREFILL).any():
            kg.gdn_chunked(*ptrs, pool.ptr, out.ptr, meta.ptr("qo_indptr"), meta.ptr("prefill_slots"),
                           meta.ptr("start_pos"), n_slots, S, H, dk, dv, self.stream)
        if not batch.has_trees:
            return out, None
        t0 = batch.tree_start
        n, n_seg = T - t0, len(batch.step_values()["block_slots"])
        row = lambda a, width: a.ptr + 4 * t0 * width  # noqa: E731 - the tree block's first row
        q_, k_, v_, g_, b_ = (row(args[0], H * dk), row(args[1], H * dk), row(args[2], H * dv), row(args[3], H),
                              row(args[4], H))
        block = (meta.ptr("block_qo"), meta.ptr("block_slots"), meta.ptr("block_parents"))
        if mode == "baseline":
            states = self._stage(pool, "node_states", (n, H, dk, dv))   # ~60x a factor row: what the step needs
            kt.gdn_tree_verify_states(q_, k_, v_, g_, b_, pool.ptr, row(out, H * dv), states.ptr, *block, n_slots,
                                      n_seg, H, dk, dv, self.stream)
            return out, {"node_states": states}
        width = batch.max_tree_rows
        stage = lambda name, shape: self._stage(pool, name, shape, stage_capacity(pool, batch))  # noqa: E731
        u, k_f, g_f, beta_f = stage("u", (n, H, dv)), stage("k", (n, H, dk)), stage("g", (n, H)), stage("beta", (n, H))
        ws_bytes = kt.verify_workspace_bytes(n_seg, H, dk, dv, width)
        workspace = self.empty((max(ws_bytes, 4) // 4,))
        z, z_stride, weight, eps, normed, arrivals = norm if norm is not None else (0, 0, None, 0.0, None, None)
        kt.gdn_tree_verify(q_, k_, v_, g_, b_, pool.ptr, row(out, H * dv), u.ptr, *block, n_slots, n_seg, H, dk, dv,
                           width, workspace.ptr, ws_bytes, k_f.ptr, g_f.ptr, beta_f.ptr, self.stream,
                           z=z + 4 * t0 * z_stride if z else 0, z_stride=z_stride,
                           norm_weight=weight.ptr if weight is not None else 0,
                           normed=row(normed, H * dv) if normed is not None else 0,
                           arrivals=arrivals.ptr if arrivals is not None else 0, rms_eps=eps)
        return out, {"factors": TreeFactors(k=k_f, g=g_f, beta=beta_f, u=u)}

    def tree_commit(self, conv_pool, gdn_pool, stage, commit) -> None:
        from luce import _cuda_gather as kga
        from luce import _cuda_gdn_tree as kt
        from luce import _cuda_tree_conv as kc

        P = len(commit.slots)
        if P == 0:
            return
        slots = self._dev(commit.slots, np.int32)       # the commit graph's arena copies when graphed
        indptr = self._dev(commit.path_indptr, np.int32)
        rows = self._dev(commit.path_rows, np.int32)
        x = self._f32(stage.conv_inputs)
        C = x.shape[1]
        if conv_pool.shape[2] != C:
            raise ValueError(f"tree commit: conv inputs {x.shape} do not match the pool {conv_pool.shape}")
        kc.conv_tree_commit(x.ptr, conv_pool.ptr, conv_pool.ptr, indptr.ptr, rows.ptr, slots.ptr, slots.ptr, P, C,
                            conv_pool.shape[1] + 1, stream=self.stream)
        n_slots, H, dk, dv = gdn_pool.shape
        if stage.mode == "factor":
            f = stage.factors
            kt.gdn_tree_commit(f.k.ptr, f.g.ptr, f.u.ptr, gdn_pool.ptr, indptr.ptr, rows.ptr, slots.ptr, n_slots, P,
                               H, dk, dv, self.stream)
            return
        leaf, dst = self._dev(commit.path_last, np.int64), self._dev(commit.state_rows, np.int64)
        state_bytes = 4 * H * dk * dv
        kga.gather(self._f32(stage.node_states).ptr, gdn_pool.ptr, leaf.ptr, dst.ptr, P, state_bytes, state_bytes,
                   state_bytes, self.stream)


def stage_capacity(pool, batch) -> int:
    """Tree block rows a stage scratch is first made for: a tree of the step's width on every slot."""
    return int(pool.shape[0]) * int(batch.max_tree_rows)


class _Untrimmed:
    """A DeviceAllocator that does not give cached blocks back on a failed allocation."""

    def __init__(self, allocator):
        self.allocator = allocator

    def alloc(self, nbytes: int):
        return self.allocator.alloc(nbytes, trim=False)

    def release(self, ptr: int, size: int) -> None:
        self.allocator.release(ptr, size)
