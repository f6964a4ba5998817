"""The numpy reference backend: every op is a luce/ref function on host arrays.

Weights are dequantized to f32 once, at load (luce.gguf.quants). Slow and readable: what the
cpu and GPU backends are tested against, with tolerances. It promises no bitwise property (its
matmul and attention run on BLAS); the batch-invariant backends are cpu and cuda.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.ops.api import FusedOps
from luce.ops.host_step_ops import HostStepOps
from luce.ref import attention as ref_attention
from luce.ref import matmul as ref_matmul
from luce.ref import pointwise as ref_pointwise
from luce.ref import rotary as ref_rotary
from luce.ref import sampling as ref_sampling
from luce.ref import step_ids as ref_step_ids
from luce.ref import swiglu as ref_swiglu
from luce.ref.rmsnorm import rmsnorm as ref_rmsnorm
from luce.ref.tree_attention import paged_attention_with_trees


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _live_segments(batch):
    """(s, first row, end row, slot) of each live segment with rows."""
    for s in range(batch.n_segments):
        r0, r1 = batch.segment_rows(s)
        if batch.seq_slots[s] >= 0 and r1 > r0:
            yield s, r0, r1, int(batch.seq_slots[s])


class NumpyBackend(FusedOps, HostStepOps):
    """luce.ops.api.Backend on numpy; Array = np.ndarray, Weight = f32 np.ndarray [N, K]."""

    name = "numpy"

    def fit_to_model(self, config) -> None:
        """Nothing here depends on the models' size."""

    # ---- memory -------------------------------------------------------------------------
    def asarray(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, copy=True)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def copy_into(self, dst: np.ndarray, src) -> None:
        src = np.asarray(src)
        if src.shape != dst.shape:
            raise ValueError(f"copy_into: {src.shape} into {dst.shape}")
        if src is not dst:
            dst[...] = src

    def zeros(self, shape: Sequence[int], dtype=np.float32) -> np.ndarray:
        return np.zeros(tuple(shape), dtype=dtype)

    def load_weight(self, gguf, name: str) -> np.ndarray:
        return self.load_tensor(gguf, name)

    def weight_rows(self, w: np.ndarray, n: int) -> np.ndarray:
        if not 1 <= n <= w.shape[0]:
            raise ValueError(f"weight_rows: need 1 <= n <= {w.shape[0]}, got {n}")
        return w[:n]

    def weight_from_array(self, w: np.ndarray) -> np.ndarray:
        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.ndim != 2:
            raise ValueError(f"a Weight is a matrix [N, K], got shape {w.shape}")
        return w

    def load_tensor(self, gguf, name: str) -> np.ndarray:
        from luce.gguf import quants

        info = gguf.tensor_info(name)
        out = quants.dequantize(gguf.raw(name), info.qtype, tuple(info.shape))
        return np.ascontiguousarray(out, dtype=np.float32).reshape(tuple(info.shape))

    # ---- dense maths --------------------------------------------------------------------
    def embedding(self, table: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise IndexError(f"token id out of range [0, {table.shape[0]}): {ids.min()}..{ids.max()}")
        return table[ids].astype(np.float32)

    def matmul(self, x, w, bias=None, prefill_spans=()) -> np.ndarray:  # every row alike
        return ref_matmul.matmul(_f32(x), w, None if bias is None else _f32(bias))

    def matmuls(self, x, weights, biases=None, prefill_spans=()) -> list[np.ndarray]:
        biases = list(biases) if biases is not None else [None] * len(weights)
        return [self.matmul(x, w, b) for w, b in zip(weights, biases)]

    def add(self, a, b) -> np.ndarray:
        return ref_pointwise.add(a, b)

    def mul(self, a, b) -> np.ndarray:
        return ref_pointwise.mul(a, b)

    def split(self, x, sizes: Sequence[int]) -> list[np.ndarray]:
        if sum(sizes) != x.shape[-1]:
            raise ValueError(f"split sizes {list(sizes)} do not add up to the last axis {x.shape[-1]}")
        bounds = np.cumsum([0, *sizes])
        return [np.ascontiguousarray(x[..., a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def concat_rows(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        if not parts:
            raise ValueError("concat_rows needs at least one array")
        return np.concatenate([np.asarray(p) for p in parts], axis=0)

    def concat_cols(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        if not parts:
            raise ValueError("concat_cols needs at least one array")
        return np.ascontiguousarray(np.concatenate([_f32(p) for p in parts], axis=-1))

    def take_rows(self, x, rows: np.ndarray, out=None) -> np.ndarray:
        taken = np.ascontiguousarray(x[np.asarray(rows, dtype=np.int64)])
        if out is None:
            return taken
        if out.shape != taken.shape or out.dtype != taken.dtype:
            raise ValueError(f"take_rows: out {out.shape} {out.dtype} is not {taken.shape} {taken.dtype}")
        out[...] = taken
        return out

    def put_rows(self, dst: np.ndarray, rows: np.ndarray, src) -> None:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        src = np.asarray(src)
        if src.shape != (rows.size,) + dst.shape[1:] or src.dtype != dst.dtype:
            raise ValueError(f"put_rows: src {src.shape} {src.dtype} is not {rows.size} rows of dst {dst.shape} {dst.dtype}")
        if rows.size and (rows.min() < 0 or rows.max() >= dst.shape[0]):
            raise IndexError(f"put_rows: row ids {rows.min()}..{rows.max()} outside [0, {dst.shape[0]})")
        dst[rows] = src

    def rmsnorm(self, x, weight, eps: float) -> np.ndarray:
        return ref_rmsnorm(_f32(x), _f32(weight), eps)

    def rope(self, x, positions, rope_dim: int, theta: float, sections: Sequence[int] = ()) -> np.ndarray:
        return ref_rotary.rope(_f32(x), positions, rope_dim, theta, sections)

    def swiglu(self, gate, up) -> np.ndarray:
        return ref_swiglu.swiglu(_f32(gate), _f32(up))

    def silu(self, x) -> np.ndarray:
        return ref_swiglu.silu(_f32(x))

    def sigmoid(self, x) -> np.ndarray:
        return ref_pointwise.sigmoid(x)

    def softplus(self, x) -> np.ndarray:
        return ref_pointwise.softplus(x)

    def exp(self, x) -> np.ndarray:
        return ref_pointwise.exp(x)

    def l2norm(self, x, eps: float) -> np.ndarray:
        return ref_pointwise.l2norm(x, eps)

    # ---- attention ----------------------------------------------------------------------
    def kv_write(self, kv, batch, k, v) -> None:
        pages, offsets, _ = batch.row_kv_locations()
        live = pages >= 0
        kv.k[pages[live], offsets[live]] = _f32(k)[live]
        kv.v[pages[live], offsets[live]] = _f32(v)[live]

    def kv_move_rows(self, kv, src_rows, dst_rows) -> None:
        src = np.asarray(src_rows, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst_rows, dtype=np.int64).reshape(-1)
        keep = (src >= 0) & (dst >= 0)
        src, dst = src[keep], dst[keep]
        for pool in (kv.k, kv.v):
            flat = pool.reshape(-1, *pool.shape[2:])   # a view: rows page * PAGE_SIZE + offset
            flat[dst] = flat[src].copy()               # every source read before any write

    def attention(self, q, kv, batch, scale: float, causal: bool = True) -> np.ndarray:
        """Tree rows (batch.tree_parents) attend to the committed prefix plus their root path."""
        parents = getattr(batch, "tree_parents", None)
        if parents is not None:
            return paged_attention_with_trees(
                _f32(q), kv.k, kv.v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                batch.kv_last_page_len, batch.seq_slots, parents, scale, causal)
        return ref_attention.paged_attention(
            _f32(q), kv.k, kv.v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
            batch.kv_last_page_len, batch.seq_slots, scale, causal)

    # ---- hybrid ops (step ops and tree primitives: luce/ops/host_step_ops.py) ---------------
    def causal_conv1d(self, x, weight, state, silu: bool = True):
        from luce.ref.conv1d import causal_conv1d

        return causal_conv1d(x, weight, state, silu=silu)

    def gdn_recurrent(self, q, k, v, g, beta, state):
        from luce.ref.gdn_recurrent import gdn_recurrent

        return gdn_recurrent(q, k, v, g, beta, state)

    def conv1d_segments(self, x, weight, pool, batch, silu: bool = True):
        from luce.ref.conv1d import causal_conv1d

        y = np.zeros(np.shape(x), np.float32)
        for s, r0, r1, slot in _live_segments(batch):
            y[r0:r1], pool[slot] = causal_conv1d(x[r0:r1], weight, pool[slot], silu=silu)
        return y

    def gdn_recurrent_segments(self, q, k, v, g, beta, pool, batch):
        from luce.ref.gdn_recurrent import gdn_recurrent

        o = np.zeros(np.shape(v), np.float32)
        for s, r0, r1, slot in _live_segments(batch):
            o[r0:r1], pool[slot] = gdn_recurrent(q[r0:r1], k[r0:r1], v[r0:r1], g[r0:r1], beta[r0:r1], pool[slot])
        return o

    def gdn_chunked(self, q, k, v, g, beta, state, chunk: int = 64):
        from luce.ref.gdn_chunked import gdn_chunked

        return gdn_chunked(q, k, v, g, beta, state, chunk=chunk)

    def gated_rmsnorm(self, x, z, weight, eps: float):
        from luce.ref.gated_rmsnorm import gated_rmsnorm

        return gated_rmsnorm(x, z, weight, eps)

    # ---- sampling -----------------------------------------------------------------------
    def argmax(self, logits) -> np.ndarray:
        return ref_sampling.argmax(logits)

    def argmax_ids(self, logits) -> np.ndarray:
        return ref_sampling.argmax(logits)

    def ids_to_host(self, ids) -> np.ndarray:
        return np.asarray(ids)

    # ---- ids between steps (luce.engine.ahead; here each call runs to its end) ------------
    def ids_store(self, n_slots: int) -> np.ndarray:
        return np.zeros(n_slots, np.int32)

    def keep_ids(self, ids, batch, last_ids, every_segment: bool = False) -> None:
        slots = batch.seq_slots if every_segment else batch.ar_slots
        ref_step_ids.keep_ids(np.asarray(ids), batch.logits_indices, batch.qo_indptr, slots, last_ids)

    def put_ids(self, batch, last_ids) -> None:
        ref_step_ids.put_ids(batch.token_ids, batch.qo_indptr, batch.ar_slots, last_ids)

    def feed_ids(self, batch, last_ids, vocab: int) -> None:
        ref_step_ids.feed_ids(batch.token_ids, batch.qo_indptr, batch.ar_slots, last_ids, vocab)

    def ids_start(self, ids) -> np.ndarray:
        return np.array(ids, np.int64)

    def ids_wait(self, handle) -> np.ndarray:
        return handle

    def top_k_logprobs(self, logits, k: int):
        return ref_sampling.top_k_logprobs(logits, k)

    def top_k_logprobs_start(self, logits, k: int):
        return self.top_k_logprobs(logits, k)

    def top_k_logprobs_wait(self, handle):
        return handle

    def sample(self, logits, temperature, top_k, top_p, min_p, seed, position) -> np.ndarray:
        from luce.ref.sample_rng import sample_rng

        ids = sample_rng(logits, temperature, top_k, top_p, min_p, seed, position)
        ref_sampling.reject_nan_rows(ids)
        return ids

    def sample_ids(self, logits, temperature, top_k, top_p, min_p, seed, position) -> np.ndarray:
        return self.sample(logits, temperature, top_k, top_p, min_p, seed, position)
