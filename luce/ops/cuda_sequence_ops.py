"""The CUDA backend's sequence ops: paged KV writes and moves, attention over the batch's
CSR (prefill, AR and tree rows), causal conv1d and the Gated DeltaNet delta rule (mixed into
CudaBackend; the step ops over every segment are luce/ops/cuda_step_ops.py).

The ForwardBatch metadata (CSR, slots, KV destinations, parents) is read from the step's
arena (luce/ops/cuda_step_meta.py: one upload per step, fixed addresses in a graph). Tree
rows run on the attention kernel's tree path, bitwise equal to AR decoding. Shapes the
kernels do not take (attention head_dim not 64/128/256 or more than 16 query heads per KV
head; GDN Dk not 64/128/256 or Dv not a multiple of 32) run the numpy references on a host
round trip, counted in `host_fallbacks`; `host_work(model)` names them before a model is
served, so an engine refuses it at start rather than fall back in silence.
"""
from __future__ import annotations

import warnings

import numpy as np

from luce.ops.cuda_step_meta import meta_of

ATTENTION_HEAD_DIMS = (64, 128, 256)
ATTENTION_MAX_GROUP = 16
ATTENTION_COUNTERS = 1 << 16   # rows x KV heads x head groups a launch merges without a combine launch
GDN_KEY_DIMS = (64, 128, 256)
GDN_CHUNK = 64


def prompt_rows(batch) -> int:
    """Rows 0..n-1 that take the prompt-row attention kernel (TF32 tensor cores, its own
    arithmetic: DESIGN 5 rule 1): the run of prefill segments the packer puts first (never
    tree rows), so every prefill row takes it and no other row does. A prompt row's bits do
    not depend on its chunk or on the rows beside it."""
    spans = getattr(batch, "prefill_spans", ())   # a ForwardBatch's; other batch views: none
    return spans[0][1] if spans and spans[0][0] == 0 else 0


class SequenceOps:
    """Mixin of CudaBackend (uses its empty/upload/to_numpy/_f32/memcpy/stream)."""

    def _init_sequence_ops(self) -> None:
        self.host_fallbacks: dict[str, int] = {}   # op -> calls that ran on the host
        # attention's merge counters: zero between launches (each launch leaves them zero);
        # allocated here, never inside a graph capture
        self.attention_counters = self.zeros((ATTENTION_COUNTERS,), np.int32)

    def device_limits(self, op: str, **dims) -> str | None:
        """Why `op` at these dims would run on the host here (None: on the device); ops:
        'attention' (head_dim, n_heads, n_kv_heads), 'gdn' (dk, dv), 'windowed attention'."""
        if op == "attention":
            D, Hq, Hkv = dims["head_dim"], dims["n_heads"], dims["n_kv_heads"]
            if D not in ATTENTION_HEAD_DIMS or Hq % Hkv or Hq // Hkv > ATTENTION_MAX_GROUP:
                return (f"attention with head_dim {D}, {Hq} query / {Hkv} KV heads (kernel: head_dim in "
                        f"{ATTENTION_HEAD_DIMS}, at most {ATTENTION_MAX_GROUP} query heads per KV head)")
        elif op == "gdn":
            if dims["dk"] not in GDN_KEY_DIMS or dims["dv"] % 32:
                return f"Gated DeltaNet with Dk {dims['dk']}, Dv {dims['dv']} (kernel: Dk in {GDN_KEY_DIMS}, Dv % 32 == 0)"
        elif op == "windowed attention":
            return "sliding-window attention of the draft (no window in the attention kernel yet)"
        return None

    def _host_fallback(self, op: str, why: str) -> None:
        if op not in self.host_fallbacks:
            warnings.warn(f"CUDA backend: {op} runs on the host ({why})", RuntimeWarning, stacklevel=3)
        self.host_fallbacks[op] = self.host_fallbacks.get(op, 0) + 1

    def _upload_i32(self, *arrays):
        """Pack int32 arrays into one upload -> (keep-alive array, [device address of each])."""
        parts = [np.asarray(a, dtype=np.int32).reshape(-1) for a in arrays]
        dev = self.upload(np.concatenate(parts) if parts else np.zeros(0, np.int32))
        ptrs, offset = [], 0
        for p in parts:
            ptrs.append(dev.ptr + 4 * offset)
            offset += p.size
        return dev, ptrs

    # ---- paged KV -------------------------------------------------------------------------------
    def kv_write(self, kv, batch, k, v) -> None:
        from luce import _cuda_gather as kg

        meta = meta_of(self, batch)
        if not meta.has_kv_rows:
            return
        k, v = self._f32(k), self._f32(v)
        T = batch.n_rows
        row_bytes = 4 * kv.k.shape[2] * kv.k.shape[3]
        if k.nbytes != T * row_bytes or v.nbytes != k.nbytes:
            raise ValueError(f"kv_write: k {k.shape}, v {v.shape} do not fit {T} rows of the pages {kv.k.shape}")
        dst = meta.ptr("kv_dst")   # [T] int64 flat KV row of each row, -1 on padding
        for src, pool in ((k, kv.k), (v, kv.v)):
            kg.gather(src.ptr, pool.ptr, 0, dst, T, row_bytes, row_bytes, row_bytes, self.stream)

    def kv_move_rows(self, kv, src_rows: np.ndarray, dst_rows: np.ndarray) -> None:
        """KV rows (flat: page * PAGE_SIZE + offset) src_rows[i] -> dst_rows[i] in k and v,
        every source read before any destination is written; pairs (-1, -1) are skipped (the
        gather kernel skips negative rows)."""
        from luce import _cuda_gather as kg

        src = np.asarray(src_rows, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst_rows, dtype=np.int64).reshape(-1)
        n_rows = kv.k.shape[0] * kv.k.shape[1]
        used = (src >= 0) & (dst >= 0) if src.shape == dst.shape else None   # (-1, -1): padding
        bad = used is None or ((src < 0) != (dst < 0)).any()
        if bad or (used.any() and max(src[used].max(), dst[used].max()) >= n_rows):
            raise IndexError(f"kv_move_rows: rows {src.tolist()} -> {dst.tolist()} outside [0, {n_rows})")
        if src.size == 0:
            return
        row_bytes = 4 * kv.k.shape[2] * kv.k.shape[3]
        src_dev, dst_dev = self._dev(src_rows, np.int64), self._dev(dst_rows, np.int64)  # arena copies in a graph
        scratch = self.empty((src.size, row_bytes // 4))
        for pool in (kv.k, kv.v):
            kg.gather(pool.ptr, scratch.ptr, src_dev.ptr, 0, src.size, row_bytes, row_bytes, row_bytes, self.stream)
            kg.gather(scratch.ptr, pool.ptr, 0, dst_dev.ptr, src.size, row_bytes, row_bytes, row_bytes, self.stream)

    # ---- attention --------------------------------------------------------------------------------
    def attention(self, q, kv, batch, scale: float, causal: bool = True):
        q = self._f32(q)
        return self._attention(q.shape, q, kv, batch, scale, causal)

    def _attention(self, shape, q, kv, batch, scale: float, causal: bool, rope=None):
        """attention of q [T, Hq, D] (shape), or with rope (q None) of the input fused into
        the launch (luce._cuda_attention.attention's rope; CudaFusedOps.rope_kv_attention)."""
        from luce import _cuda_attention as ka

        T, Hq, D = shape
        Hkv = kv.k.shape[2]
        parents = getattr(batch, "tree_parents", None) if batch.has_trees else None
        if D not in ATTENTION_HEAD_DIMS or Hq % Hkv or Hq // Hkv > ATTENTION_MAX_GROUP:
            self._host_fallback("attention", f"head_dim {D} (kernel: {ATTENTION_HEAD_DIMS}), "
                                             f"{Hq} query / {Hkv} KV heads (kernel: group <= {ATTENTION_MAX_GROUP})")
            return self._host_attention(q, kv, batch, scale, causal)
        S = batch.n_segments
        meta = meta_of(self, batch)
        max_kv = meta.max_kv   # sizes the grid only: a row's result depends on its own keys
        # rows of no live segment (padding) are zeroed; the kernels write every other row
        out = self.zeros((T, Hq, D)) if batch.has_padding_rows or not max_kv else self.empty((T, Hq, D))
        if T == 0 or max_kv == 0:
            return out
        n_prompt = prompt_rows(batch)
        # prompt rows: an entry per 1,024 keys, and their segments' keys staged as f16 (bounded by
        # every kv_indices entry: the array's length is fixed for steps of one graph key)
        n_kv_indices = len(batch.kv_indices)
        page_size = kv.k.shape[1]
        ws_bytes = ka.workspace_bytes(T, Hq, D, max_kv, n_prompt, Hkv, page_size, n_kv_indices)
        workspace = self.empty((max(ws_bytes, 4) // 4,))
        extra = {"tree_parents": meta.ptr("tree_parents")} if parents is not None else {}
        extra["prompt_rows"] = n_prompt
        extra["counters"], extra["n_counters"] = self.attention_counters.ptr, self.attention_counters.size
        extra["n_kv_indices"] = n_kv_indices
        if rope is not None:
            extra["rope"] = rope
        ka.attention(0 if q is None else q.ptr, kv.k.ptr, kv.v.ptr, out.ptr, workspace.ptr, ws_bytes,
                     meta.ptr("qo_indptr"), meta.ptr("kv_indptr"), meta.ptr("kv_indices"), meta.ptr("kv_last_page_len"),
                     meta.ptr("seq_slots"), T, S, Hq, Hkv, D, page_size, max_kv, scale, causal, self.stream,
                     **extra)
        return out

    def _host_attention(self, q, kv, batch, scale: float, causal: bool):
        """The reference on the host over q and only the pages the batch reads."""
        from luce import _cuda_gather as kg
        from luce.ref import attention as ref_attention
        from luce.ref.tree_attention import paged_attention_with_trees

        live = [s for s in range(batch.n_segments) if batch.seq_slots[s] >= 0]
        used = np.unique(np.concatenate([batch.segment_pages(s) for s in live] or [np.zeros(0, np.int32)]))
        page_shape = kv.k.shape[1:]
        k_host = np.zeros((max(used.size, 1),) + page_shape, np.float32)
        v_host = np.zeros_like(k_host)
        if used.size:
            page_bytes = 4 * int(np.prod(page_shape))
            idx = self.upload(used.astype(np.int64))
            for pool, host in ((kv.k, k_host), (kv.v, v_host)):
                compact = self.empty((used.size,) + page_shape)
                kg.gather(pool.ptr, compact.ptr, idx.ptr, 0, used.size, page_bytes, page_bytes, page_bytes, self.stream)
                host[:] = self.to_numpy(compact)
        indices = np.searchsorted(used, batch.kv_indices).astype(np.int32) if used.size else batch.kv_indices
        qh = self.to_numpy(q)
        args = (batch.qo_indptr, batch.kv_indptr, indices, batch.kv_last_page_len, batch.seq_slots)
        parents = getattr(batch, "tree_parents", None)
        if parents is not None:
            out = paged_attention_with_trees(qh, k_host, v_host, *args, parents, scale, causal)
        else:
            out = ref_attention.paged_attention(qh, k_host, v_host, *args, scale, causal)
        return self.upload(np.ascontiguousarray(out, dtype=np.float32))

    # ---- Gated DeltaNet -----------------------------------------------------------------------------
    def causal_conv1d(self, x, weight, state, silu: bool = True):
        from luce import _cuda_conv1d as kc

        x, weight, state = self._f32(x), self._f32(weight), self._f32(state)
        T, C = x.shape
        K = weight.shape[1]
        if weight.shape[0] != C or state.shape != (K - 1, C) or not 2 <= K <= 8:
            raise ValueError(f"causal_conv1d: x {x.shape}, weight {weight.shape}, state {state.shape} "
                             "(weight [C, K] with 2 <= K <= 8, state [K-1, C])")
        y, new_state = self.empty((T, C)), self.empty(state.shape)
        if T == 0:
            self.memcpy(new_state.ptr, state.ptr, state.nbytes)
            return y, new_state
        meta, (qo, slot) = self._upload_i32([0, T], [0])
        kc.conv1d(x.ptr, weight.ptr, y.ptr, state.ptr, new_state.ptr, qo, slot, slot, 1, C, K, T, silu,
                  stream=self.stream)
        return y, new_state

    def _gdn_args(self, q, k, v, g, beta, state):
        q, k, v, g, beta, state = (self._f32(a) for a in (q, k, v, g, beta, state))
        T, H, dk = q.shape
        dv = v.shape[2]
        if k.shape != q.shape or v.shape[:2] != (T, H) or g.shape != (T, H) or beta.shape != (T, H) \
                or state.shape != (H, dk, dv):
            raise ValueError(f"GDN: q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, beta {beta.shape}, "
                             f"state {state.shape} (want q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H], state [H, Dk, Dv])")
        return (q, k, v, g, beta, state), (T, H, dk, dv)

    def _gdn_host(self, name: str, args, **kw):
        from luce.ref.gdn_chunked import gdn_chunked
        from luce.ref.gdn_recurrent import gdn_recurrent

        fn = gdn_chunked if name == "gdn_chunked" else gdn_recurrent
        o, h = fn(*(self.to_numpy(a) for a in args), **kw)
        return self.upload(np.asarray(o, np.float32)), self.upload(np.asarray(h, np.float32))

    def _gdn(self, name: str, q, k, v, g, beta, state, **kw):
        from luce import _cuda_gdn as kg

        args, (T, H, dk, dv) = self._gdn_args(q, k, v, g, beta, state)
        if dk not in GDN_KEY_DIMS or dv % 32:
            self._host_fallback(name, f"Dk {dk} (kernel: {GDN_KEY_DIMS}), Dv {dv} (kernel: multiples of 32)")
            return self._gdn_host(name, args, **kw)
        new_state = self.copy(args[5])  # updated in place by the kernel: the input stays as it was
        out = self.empty((T, H, dv))
        if T == 0:
            return out, new_state
        meta, (qo, slot, start) = self._upload_i32([0, T], [0], [0])
        ptrs = [a.ptr for a in args[:5]]
        if name == "gdn_chunked":
            kg.gdn_chunked(*ptrs, new_state.ptr, out.ptr, qo, slot, start, 1, 1, H, dk, dv, self.stream)
        else:
            kg.gdn_recurrent(*ptrs, new_state.ptr, out.ptr, qo, slot, 1, 1, H, dk, dv, self.stream)
        return out, new_state

    def gdn_recurrent(self, q, k, v, g, beta, state):
        return self._gdn("gdn_recurrent", q, k, v, g, beta, state)

    # ---- one launch over every segment, state pools updated in place ---------------------------
    def conv1d_segments(self, x, weight, pool, batch, silu: bool = True):
        """x [T, C] rows of the batch's segments, weight [C, K], pool [slots, K-1, C]: each
        live segment convolves from pool[slot] and leaves its new window there -> y [T, C]."""
        from luce import _cuda_conv1d as kc

        x, weight = self._f32(x), self._f32(weight)
        T, C = x.shape
        K = weight.shape[1]
        if weight.shape[0] != C or pool.ndim != 3 or pool.shape[1:] != (K - 1, C) or not 2 <= K <= 8:
            raise ValueError(f"conv1d_segments: x {x.shape}, weight {weight.shape}, pool {pool.shape}")
        meta = meta_of(self, batch)
        y = self.empty((T, C))
        slots = meta.ptr("seq_slots")
        kc.conv1d(x.ptr, weight.ptr, y.ptr, pool.ptr, pool.ptr, meta.ptr("qo_indptr"), slots, slots,
                  batch.n_segments, C, K, T, silu, stream=self.stream)
        return y

    def gdn_recurrent_segments(self, q, k, v, g, beta, pool, batch):
        """The recurrent step over each live segment's rows from pool[slot] [slots, Hv, Dk, Dv],
        updated in place -> o [T, Hv, Dv]."""
        from luce import _cuda_gdn as kg

        args, (T, H, dk, dv) = self._gdn_args(q, k, v, g, beta, pool[0])
        if dk not in GDN_KEY_DIMS or dv % 32:
            raise ValueError(f"gdn_recurrent_segments: Dk {dk}, Dv {dv} (kernel: Dk {GDN_KEY_DIMS}, Dv % 32 == 0)")
        meta = meta_of(self, batch)
        out = self.empty((T, H, dv))
        kg.gdn_recurrent(*(a.ptr for a in args[:5]), pool.ptr, out.ptr, meta.ptr("qo_indptr"), meta.ptr("seq_slots"),
                         pool.shape[0], batch.n_segments, H, dk, dv, self.stream)
        return out

    def gdn_chunked(self, q, k, v, g, beta, state, chunk: int = GDN_CHUNK):
        """Chunks cut at multiples of 64 from the call's first row (as the numpy reference;
        the model calls it with groups that start on absolute multiples or stay inside one
        chunk, luce.ref.gdn_chunked.delta_rule_groups)."""
        if chunk != GDN_CHUNK:
            raise ValueError(f"the CUDA gdn_chunked kernel cuts chunks of {GDN_CHUNK} tokens, got chunk={chunk}")
        return self._gdn("gdn_chunked", q, k, v, g, beta, state, chunk=chunk)
