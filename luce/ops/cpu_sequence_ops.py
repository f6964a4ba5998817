"""The cpu backend's sequence ops (attention, norms, rotary, pointwise, Gated DeltaNet) on the
C kernels of luce/cpu/ (wrappers in luce/_cpu_sequence.pxi): a mixin of CpuBackend.

Every method here checks its shapes (ValueError naming them) and hands C-contiguous f32
arrays to one C call; the C kernels compute each output row in an order fixed by the row's
own sizes, whatever the batch, the row's position or the thread count (luce/cpu/
cpu_sequence_ops.h). Tree rows: attention reads `batch.tree_parents` (a node attends like the
AR row at its position once its path is committed); the one-tree GDN primitives the host
step ops route tree segments to (luce/ops/host_step_ops.py: `gdn_tree_verify`,
`gdn_tree_commit`) run the AR step's C function for 'factor' and 'baseline' modes, so node
outputs and committed states are bitwise AR decoding's. Still on the numpy references (no
reduction a test compares bitwise): add, mul, conv1d ops (float64 elementwise), KV row moves.

`gdn_chunked` runs the per-token recurrence (the AR step, state f32 after every token), not
the chunk form: prefill, AR rows and tree rows are then bitwise consistent whatever the
chunking, and the chunk size changes nothing.
"""
from __future__ import annotations

import numpy as np

from luce.ref import gdn_tree as ref_tree


def _f32(x) -> np.ndarray:
    """x as a C-contiguous f32 array (no copy when it already is one)."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x, dtype=np.float32)


def _inplace_f32(x, what: str) -> np.ndarray:
    if type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise TypeError(f"{what} must be a C-contiguous float32 numpy array (it is updated in place)")
    return x


def _gdn_shapes(q, k, v, g, beta, state_shape) -> tuple[int, int, int, int]:
    """(T, H, Dk, Dv) of q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H], state [H, Dk, Dv]."""
    if q.ndim != 3 or q.shape != k.shape:
        raise ValueError(f"gdn: q {q.shape} and k {k.shape} must both be [T, Hv, Dk]")
    T, H, dk = q.shape
    if v.ndim != 3 or v.shape[:2] != (T, H):
        raise ValueError(f"gdn: v must be [T={T}, Hv={H}, Dv], got {v.shape}")
    dv = v.shape[2]
    if g.shape != (T, H) or beta.shape != (T, H):
        raise ValueError(f"gdn: g {g.shape} and beta {beta.shape} must be [T={T}, Hv={H}]")
    if tuple(state_shape) != (H, dk, dv):
        raise ValueError(f"gdn: state must be [Hv={H}, Dk={dk}, Dv={dv}], got {tuple(state_shape)}")
    return T, H, dk, dv


class CpuSequenceOps:
    """Mixin of luce.ops.cpu_backend.CpuBackend (self._k is luce._cpu)."""

    # ---- norms ------------------------------------------------------------------------------
    def _row_norm(self, name: str, x, weight, z, eps: float) -> np.ndarray:
        x = _f32(x)
        if x.ndim == 0:
            raise ValueError(f"{name} wants x [..., D], got a scalar")
        D = x.shape[-1]
        if weight is not None:
            weight = _f32(weight)
            if weight.shape != (D,):
                raise ValueError(f"{name}: weight {weight.shape} must be [D={D}] for x {x.shape}")
        y = np.empty(x.shape, np.float32)
        rows = x.size // D if D else 0
        if x.size == 0:
            return y
        if name == "gated_rmsnorm":
            self._k.gated_rmsnorm(x, z, weight, y, rows, D, eps)
        elif name == "rmsnorm":
            self._k.rmsnorm(x, weight, y, rows, D, eps)
        else:
            self._k.l2norm(x, y, rows, D, eps)
        return y

    def rmsnorm(self, x, weight, eps: float) -> np.ndarray:
        """x [..., D], weight [D] -> x / sqrt(mean(x^2) + eps) * weight."""
        return self._row_norm("rmsnorm", x, weight, None, eps)

    def l2norm(self, x, eps: float) -> np.ndarray:
        """x [..., D] -> x / sqrt(sum(x^2) + eps)."""
        return self._row_norm("l2norm", x, None, None, eps)

    def gated_rmsnorm(self, x, z, weight, eps: float) -> np.ndarray:
        """x, z [..., D], weight [D] -> rmsnorm(x) * weight * silu(z)."""
        z = _f32(z)
        if np.shape(x) != z.shape:
            raise ValueError(f"gated_rmsnorm: x {np.shape(x)} and gate z {z.shape} must have one shape")
        return self._row_norm("gated_rmsnorm", x, weight, z, eps)

    # ---- rotary -----------------------------------------------------------------------------
    def rope(self, x, positions, rope_dim: int, theta: float, sections=()) -> np.ndarray:
        """x [T, H, D]; positions [T] int, or [T, 4] with M-RoPE sections -> [T, H, D]."""
        x = _f32(x)
        if x.ndim != 3 or not 0 <= rope_dim <= x.shape[2]:
            raise ValueError(f"rope wants x [T, H, D] with rope_dim <= D, got {x.shape}, rope_dim={rope_dim}")
        if rope_dim % 2:
            raise ValueError(f"rope_dim must be even, got {rope_dim}")
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        sec = None
        if sections:
            if len(sections) != 4 or sum(sections) <= 0:
                raise ValueError(f"M-RoPE needs 4 section sizes with a positive sum, got {list(sections)}")
            sec = np.asarray(sections, dtype=np.int64)
            if not (pos.ndim == 1 or (pos.ndim == 2 and pos.shape[1] == 4)):
                raise ValueError(f"M-RoPE wants positions [T] or [T, 4], got {pos.shape}")
        elif pos.ndim != 1:
            raise ValueError(f"plain rotary wants positions [T], got {pos.shape}")
        if pos.shape[0] != x.shape[0]:
            raise ValueError(f"rope: {x.shape[0]} rows but {pos.shape[0]} positions")
        y = np.empty(x.shape, np.float32)
        self._k.rope(x, y, pos, int(rope_dim), float(theta), sec)
        return y

    # ---- pointwise --------------------------------------------------------------------------
    def _unary(self, x, op: str) -> np.ndarray:
        x = _f32(x)
        y = np.empty(x.shape, np.float32)
        self._k.unary(x, y, self._k.UNARY_OPS[op])
        return y

    def silu(self, x) -> np.ndarray:
        return self._unary(x, "silu")

    def sigmoid(self, x) -> np.ndarray:
        return self._unary(x, "sigmoid")

    def softplus(self, x) -> np.ndarray:
        return self._unary(x, "softplus")

    def exp(self, x) -> np.ndarray:
        return self._unary(x, "exp")

    def swiglu(self, gate, up) -> np.ndarray:
        """gate, up [..., F] -> silu(gate) * up."""
        gate, up = _f32(gate), _f32(up)
        if gate.shape != up.shape:
            raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} differ")
        y = np.empty(gate.shape, np.float32)
        self._k.swiglu(gate, up, y)
        return y

    # ---- attention --------------------------------------------------------------------------
    def _kv_pages(self, kv, what: str):
        k, v = _inplace_f32(kv.k, f"{what}: kv.k"), _inplace_f32(kv.v, f"{what}: kv.v")
        if k.ndim != 4 or v.shape != k.shape:
            raise ValueError(f"{what}: kv pages k {k.shape}, v {v.shape} must both be [n_pages, PAGE_SIZE, Hkv, D]")
        return k, v

    def kv_write(self, kv, batch, k, v) -> None:
        """k, v [T, Hkv, D] -> each live row's KV slot (padding rows skipped)."""
        kp, vp = self._kv_pages(kv, "kv_write")
        k, v = _f32(k), _f32(v)
        want = (batch.n_rows, kp.shape[2], kp.shape[3])
        if k.shape != want or v.shape != want:
            raise ValueError(f"kv_write: k {k.shape}, v {v.shape} must be [T, Hkv, D] = {want}")
        self._k.kv_write(kp, vp, k, v, batch)

    def attention(self, q, kv, batch, scale: float, causal: bool = True) -> np.ndarray:
        """q [T, Hq, D] over each segment's paged KV (tree segments: the committed prefix and
        the node's root path) -> [T, Hq, D] (zeros on padding rows)."""
        kp, vp = self._kv_pages(kv, "attention")
        q = _f32(q)
        if q.ndim != 3 or q.shape[2] != kp.shape[3]:
            raise ValueError(f"attention: q {q.shape} must be [T, Hq, D] with D = {kp.shape[3]} (the KV pages)")
        if q.shape[0] != batch.n_rows:
            raise ValueError(f"attention: q has {q.shape[0]} rows, the batch {batch.n_rows}")
        hq, hkv = q.shape[1], kp.shape[2]
        if hq % hkv or hq // hkv > 64:
            raise ValueError(f"attention: {hq} query heads must be a multiple of the {hkv} KV heads "
                             "(at most 64 per KV head)")
        out = np.empty(q.shape, np.float32)
        self._k.attention(q, kp, vp, out, batch, float(scale), bool(causal))
        return out

    # ---- Gated DeltaNet ---------------------------------------------------------------------
    def gdn_recurrent(self, q, k, v, g, beta, state):
        """q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv], state [Hv, Dk, Dv]
        -> (o [T, Hv, Dv], new state); the input state is not modified."""
        q, k, v, g, beta, state = (_f32(a) for a in (q, k, v, g, beta, state))
        T, H, dk, dv = _gdn_shapes(q, k, v, g, beta, state.shape)
        o, new_state = np.empty((T, H, dv), np.float32), np.empty(state.shape, np.float32)
        self._k.gdn_recurrent(q, k, v, g, beta, state, new_state, o)
        return o, new_state

    def gdn_chunked(self, q, k, v, g, beta, state, chunk: int = 64):
        """gdn_recurrent (the module docstring says why: one arithmetic for every row kind)."""
        if chunk <= 0:
            raise ValueError(f"gdn_chunked: chunk must be > 0, got {chunk}")
        return self.gdn_recurrent(q, k, v, g, beta, state)

    def gdn_recurrent_segments(self, q, k, v, g, beta, pool, batch):
        """Each live segment of `batch` from pool[seq_slots[s]] ([slots, Hv, Dk, Dv], updated
        in place) -> o [T, Hv, Dv] (zeros on padding rows)."""
        pool = _inplace_f32(pool, "gdn_recurrent_segments: the state pool")
        q, k, v, g, beta = (_f32(a) for a in (q, k, v, g, beta))
        if pool.ndim != 4:
            raise ValueError(f"gdn_recurrent_segments: pool must be [slots, Hv, Dk, Dv], got {pool.shape}")
        T, H, dk, dv = _gdn_shapes(q, k, v, g, beta, pool.shape[1:])
        if T != batch.n_rows:
            raise ValueError(f"gdn_recurrent_segments: {T} rows, the batch has {batch.n_rows}")
        o = np.empty((T, H, dv), np.float32)
        self._k.gdn_segments(q, k, v, g, beta, pool, batch, o)
        return o

    def gdn_tree_verify(self, mode, q, k, v, g, beta, parents, state):
        """One tree's verify (luce.ops.host_step_ops routes tree segments here): q, k [n, Hv, Dk],
        v [n, Hv, Dv], g, beta [n, Hv], parents [n] (local, root -1), state [Hv, Dk, Dv]
        (unchanged) -> (o [n, Hv, Dv], {'factors': TreeFactors (u f32)} | {'node_states':
        [n, Hv, Dk, Dv]}), every node bitwise the AR step along its root path."""
        q, k, v, g, beta, state = (_f32(a) for a in (q, k, v, g, beta, state))
        n, H, dk, dv = _gdn_shapes(q, k, v, g, beta, state.shape)
        tp = np.ascontiguousarray(parents, dtype=np.int32)
        if tp.shape != (n,):
            raise ValueError(f"gdn_tree_verify: parents {tp.shape} must be [n={n}]")
        o = np.empty((n, H, dv), np.float32)
        if mode == "factor":
            u = np.empty((n, H, dv), np.float32)
            self._k.gdn_tree_verify(q, k, v, g, beta, tp, state, o, u, None)
            return o, {"factors": ref_tree.TreeFactors(k=k.copy(), g=g.copy(), beta=beta.copy(), u=u)}
        if mode == "baseline":
            states = np.empty((n, H, dk, dv), np.float32)
            self._k.gdn_tree_verify(q, k, v, g, beta, tp, state, o, None, states)
            return o, {"node_states": states}
        raise ValueError(f"GDN tree mode must be 'factor' or 'baseline', got {mode!r}")

    def gdn_tree_commit(self, stage, conv_state, gdn_state, path):
        """One tree's commit: (conv [K-1, C], gdn [Hv, Dk, Dv]) advanced along `path` (node ids,
        root first) of `stage` (a luce.ops.api.TreeStage of one tree) -> new (conv, gdn); the
        inputs stay as they were. 'factor' replays the path's factors with the AR step's C
        update (bitwise AR decoding of the path); 'baseline' takes the last node's state."""
        conv_state = np.array(conv_state, dtype=np.float32)
        gdn_state = np.array(gdn_state, dtype=np.float32)
        nodes = np.ascontiguousarray(path, dtype=np.int32).reshape(-1)
        parents = np.asarray(stage.parents)
        if (nodes.size == 0 or nodes[0] != 0 or nodes.max() >= len(parents) or nodes.min() < 0
                or not np.array_equal(parents[nodes[1:]], nodes[:-1])):
            raise ValueError(f"commit path {nodes.tolist()} must start at the root (0) and follow the parent "
                             f"links of the tree of {len(parents)} nodes")
        width = conv_state.shape[0]   # the last K-1 inputs of (state, the path's inputs)
        conv_state = np.ascontiguousarray(np.concatenate([conv_state, np.asarray(stage.conv_inputs)[nodes]])[-width:])
        if stage.mode == "baseline":
            return conv_state, np.array(stage.node_states[int(nodes[-1])], dtype=np.float32)
        if stage.mode != "factor":
            raise ValueError(f"GDN tree mode must be 'factor' or 'baseline', got {stage.mode!r}")
        f = stage.factors
        k, g, u = _f32(f.k), _f32(f.g), _f32(f.u)
        n, H, dk = k.shape
        if g.shape != (n, H) or u.shape[:2] != (n, H) or gdn_state.shape != (H, dk, u.shape[2]):
            raise ValueError(f"gdn_tree_commit: factors k {k.shape}, g {g.shape}, u {u.shape} do not match "
                             f"the state {gdn_state.shape}")
        self._k.gdn_tree_commit(k, g, u, np.ascontiguousarray(parents, dtype=np.int32), nodes, gdn_state)
        return conv_state, gdn_state

    # ---- greedy and top-k (host logits) ------------------------------------------------------
    def argmax(self, logits) -> np.ndarray:
        """logits [L, V] -> [L] int64, ties to the lowest id; NaN rows are an error."""
        from luce.ref.sampling import reject_nan_rows

        logits = _f32(logits)
        if logits.ndim != 2 or logits.shape[1] == 0:
            raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
        ids = np.empty(logits.shape[0], np.int64)
        self._k.argmax(logits, ids)
        reject_nan_rows(ids)
        return ids

    def top_k_logprobs(self, logits, k: int):
        """logits [L, V] -> (ids [L, k] int64, logprobs [L, k] f32), best first, ties to the
        lowest id, log-softmax over the whole row (k <= 64; larger k: the numpy reference)."""
        from luce.ref.sampling import reject_nan_rows

        logits = _f32(logits)
        if logits.ndim != 2:
            raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
        if not 1 <= k <= logits.shape[1]:
            raise ValueError(f"top_k_logprobs: k={k} not in 1..{logits.shape[1]}")
        if k > 64:
            return super().top_k_logprobs(logits, k)
        ids, logprobs = np.empty((logits.shape[0], k), np.int64), np.empty((logits.shape[0], k), np.float32)
        self._k.top_k_logprobs(logits, k, ids, logprobs)
        reject_nan_rows(ids[:, 0])
        return ids, logprobs
