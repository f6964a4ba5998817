"""The backend interface every model calls (numpy reference, CUDA, HIP).

Models touch activations only through these methods, plus `.shape` and `.reshape(...)` on
the arrays they return (contiguous reshapes; a GPU array type provides them as views).
Host-side metadata (a ForwardBatch, token ids, page ids) stays numpy.

Conventions:
- "Array" is the backend's array type (np.ndarray on numpy); activations are f32.
- A "Weight" is a matrix `[N, K]` (out, in; numpy order of the GGUF tensor) in whatever form
  the backend multiplies fastest (numpy: dequantized f32; CUDA: the quantized blocks).
- Batch invariance (DESIGN.md section 5): every op computes a row's result bitwise the same
  whatever other rows share the call. Reductions depend on the row's own sizes only.
- `kv` arguments are one attention layer's pages: an object with `.k, .v` backend arrays
  [n_pages, PAGE_SIZE, Hkv, D] f32 (luce.models.kv_cache.PagedKV, allocated with this
  backend's `zeros`); `batch` is a luce.models.batch.ForwardBatch (host numpy metadata).
  The backend never imports luce.models: both are used by duck typing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from luce.ops.gate_inputs import gate_operands
from luce.ops.gdn_inputs import gdn_input_blocks, gdn_input_widths, gdn_out_proj, gdn_qkv_heads

Array = Any
Weight = Any

TREE_MODES = ("factor", "baseline")   # how GDN layers verify tree rows (gdn_step)
SEG_PAD, SEG_PREFILL, SEG_AR, SEG_TREE = -1, 0, 1, 2   # segment kinds of a step (ForwardBatch.kinds)


@dataclass
class TreeStage:
    """What one GDN layer's tree verify keeps for the commit, in rows of the step's tree
    block (rows batch.tree_start.. T-1 of the step, Nt of them; ForwardOutput.staged)."""

    conv_inputs: Array         # [Nt, C] f32 the tree rows' conv inputs
    mode: str                  # one of TREE_MODES
    factors: Any = None        # 'factor': luce.ref.gdn_tree.TreeFactors, k [Nt, Hv, Dk], g, beta [Nt, Hv], u [Nt, Hv, Dv]
    node_states: Any = None    # 'baseline': [Nt, Hv, Dk, Dv] f32, every node's state
    parents: Any = None        # local parents [Nt] when the stage is one tree (gdn_tree_commit)


@runtime_checkable
class Backend(Protocol):
    name: str  # 'numpy' | 'cpu' | 'cuda' | 'hip'

    def fit_to_model(self, config) -> None:
        """A model with this GGUF config was loaded on the backend (luce.models.loader): adapt
        launch choices that depend on the models' size (never a result)."""

    # ---- memory -------------------------------------------------------------------------
    def asarray(self, x: np.ndarray) -> Array:
        """Host array -> backend array (f32 stays f32, ints stay ints)."""

    def to_numpy(self, x: Array) -> np.ndarray:
        """Backend array -> host np.ndarray (a copy on GPU backends)."""

    def zeros(self, shape: Sequence[int], dtype=np.float32) -> Array:
        """Zero-filled backend array."""

    def copy_into(self, dst: Array, src: Array) -> None:
        """Write src into dst (same shape) in place (per-slot state pools)."""

    def load_weight(self, gguf, name: str) -> Weight:
        """Matrix `name` of a luce.gguf.reader.GGUFModel, numpy shape [N, K], ready for
        `matmul` and `embedding` (numpy: dequantized to f32 once, here)."""

    def weight_from_array(self, w: np.ndarray) -> Weight:
        """A Weight from an f32 host matrix [N, K] (tests, tools)."""

    def weight_rows(self, w: Weight, n: int) -> Weight:
        """The first n output rows of w [N, K] -> [n, K], a view sharing w's memory (a draft
        model's output matrix cut to the frequent token ids)."""

    def load_tensor(self, gguf, name: str) -> Array:
        """Small tensor `name` (norm weights, biases, ssm_a, conv weights) as an f32 Array,
        numpy shape of the GGUF tensor."""

    # ---- dense maths ----------------------------------------------------------------------
    def embedding(self, table: Weight, token_ids: np.ndarray) -> Array:
        """table [V, D], token_ids [T] int -> [T, D] f32 (rows of the table)."""

    def matmul(self, x: Array, w: Weight, bias: Array | None = None,
               prefill_spans: Sequence[tuple[int, int]] = ()) -> Array:
        """x [T, K] f32, w [N, K], bias [N] | None -> y [T, N] f32 = x @ w^T (+ bias).
        Batch-invariant: row t of y depends only on row t of x and on whether t lies in one of
        prefill_spans (row ranges [start, end) of prompt rows, ForwardBatch.prefill_spans;
        DESIGN 5 rule 1: a backend may give them its prompt-row arithmetic, CUDA's 8-bit x
        GEMM; numpy and cpu ignore it)."""

    def matmuls(self, x: Array, weights: Sequence[Weight], biases: Sequence[Array | None] | None = None,
                prefill_spans: Sequence[tuple[int, int]] = ()) -> list[Array]:
        """[matmul(x, w, b, prefill_spans) for each weight]: the same results, with the activation
        work shared where the backend can (CUDA: x quantized once for the block-type weights)."""

    def add(self, a: Array, b: Array) -> Array:
        """Elementwise a + b (numpy broadcasting, f32)."""

    def mul(self, a: Array, b: Array) -> Array:
        """Elementwise a * b (numpy broadcasting, f32)."""

    def split(self, x: Array, sizes: Sequence[int]) -> list[Array]:
        """Split x [..., sum(sizes)] along the last axis into contiguous arrays [..., sizes[i]]."""

    def concat_rows(self, parts: Sequence[Array]) -> Array:
        """Arrays [n_i, ...] (equal trailing shapes) -> [sum n_i, ...] along axis 0."""

    def concat_cols(self, parts: Sequence[Array]) -> Array:
        """Arrays [n, w_i] f32 (equal row counts) -> [n, sum w_i] along the last axis
        (DFlash features: captured target layers side by side)."""

    def take_rows(self, x: Array, rows: np.ndarray, out: Array | None = None) -> Array:
        """x [T, ...], rows [L] int -> x[rows] [L, ...] (contiguous); written into `out` (an
        array of that shape and dtype) when given, which is returned."""

    def put_rows(self, dst: Array, rows: np.ndarray, src: Array) -> None:
        """dst [N, ...], rows [L] int (distinct), src [L, ...] -> dst[rows] = src in place (the
        inverse of take_rows: saved rows put back; device copies only on GPU backends)."""

    def rmsnorm(self, x: Array, weight: Array, eps: float) -> Array:
        """x [..., D], weight [D] -> x / sqrt(mean(x^2) + eps) * weight, per row of D."""

    def rope(self, x: Array, positions: np.ndarray, rope_dim: int, theta: float,
             sections: Sequence[int] = ()) -> Array:
        """NEOX (half-split) rotary on the first `rope_dim` dims of each head.

        x [T, H, D] f32; positions [T] int, or [T, 4] int (t, h, w, e) for M-RoPE;
        sections: () for plain rotary, else the 4 interleaved M-RoPE (IMROPE) section sizes
        (pairs i of the rotated dims take the position of section by llama.cpp's imrope rule).
        Dims rope_dim..D pass through. Pair i rotates (x[i], x[i + rope_dim/2]) by
        angle = position * theta^(-2i/rope_dim)."""

    def swiglu(self, gate: Array, up: Array) -> Array:
        """gate, up [T, F] -> silu(gate) * up [T, F]."""

    # ---- fused (FusedOps below composes them; references: luce/ref/norm_quant.py, rope_kv.py, gdn_decode.py)
    def add_rmsnorm_matmuls(self, x: Array, residual: Array | None, weight: Array, eps: float,
                            weights: Sequence[Weight], biases: Sequence[Array | None] | None = None,
                            prefill_spans: Sequence[tuple[int, int]] = ()) -> tuple[Array, list[Array]]:
        """x, residual [T, D] (residual None: x alone), weight [D] -> (s, matmuls(rmsnorm(s,
        weight, eps), weights, biases, prefill_spans)) with s = add(x, residual): bitwise the
        composition (CUDA fuses the decode family's quantization; a step with prompt rows
        takes the composition, the prompt-row GEMM quantizes its own way)."""

    def swiglu_matmul(self, gate: Array, up: Array | None, w: Weight,
                      prefill_spans: Sequence[tuple[int, int]] = ()) -> Array:
        """matmul(swiglu(gate, up), w, prefill_spans=prefill_spans), bitwise; up None: gate is
        [T, 2F], gate | up."""

    def gate_output_matmul(self, o: Array, qg: Array, w: Weight,
                           prefill_spans: Sequence[tuple[int, int]] = ()) -> Array:
        """matmul(gate_output(o, qg), w, prefill_spans=prefill_spans), bitwise (the gated
        attention's output projection; CUDA quantizes the gated output for the decode family in
        the gate's launch). o [T, H*D] with qg [T, H, 2D], or o [T, H, D] with qg the [T, W]
        output of a merged projection whose first 2HD columns are qg (luce.ops.gate_inputs)."""

    def rope_kv_write(self, parts: Sequence[Array], kv: Any, batch, n_head: int, rope_dim: int, theta: float,
                      sections: Sequence[int] = (), q_norm: Array | None = None, k_norm: Array | None = None,
                      eps: float = 0.0, gated: bool = False) -> Array:
        """The attention input of a step: parts are the q/k/v projections of its T rows, whose
        columns side by side are [q | k | v] = [n_head*D | Hkv*D | Hkv*D] ([q, k, v], [qk, v]
        or [qkv]; D, Hkv from kv); gated: q is a gated attention's [n_head*2D], each head its
        query then its gate (gated_query; CUDA reads the queries in place). Per head RMSNorm of
        q and k (q_norm / k_norm [D], eps; none where None), then rope(batch.positions,
        rope_dim, theta, sections) of both; k and v go to the rows' KV locations (kv_write)
        -> q [T, n_head, D]. Bitwise the composition."""

    def rope_kv_attention(self, parts: Sequence[Array], kv: Any, batch, n_head: int, rope_dim: int, theta: float,
                          sections: Sequence[int] = (), q_norm: Array | None = None, k_norm: Array | None = None,
                          eps: float = 0.0, scale: float = 1.0) -> Array:
        """attention(rope_kv_write(parts, ...), kv, batch, scale, causal=True) -> [T, n_head, D],
        bitwise (references: luce/ref/rope_kv_attention.py; CUDA fuses the input into the
        attention launch of a step whose live segments are all AR rows, D 64 or 128, no M-RoPE)."""

    def conv_gdn_norm(self, parts: Sequence[Array], conv: Array, dt_bias: Array, ssm_a: Array, norm: Array,
                      conv_pool: Array, gdn_pool: Array, batch, n_k_heads: int, l2_eps: float,
                      rms_eps: float, tree_mode: str = "factor",
                      out_proj: Weight | None = None) -> tuple[Array, dict | None]:
        """A Gated DeltaNet layer's chain from its projections to the output norm (luce/ref/
        gdn_decode.py): parts are the projections of its T rows, whose columns side by side are
        [qkv | z | b | a] = [C | Hv*Dv | Hv | Hv] (C = 2 Hk Dk + Hv Dv; [qkv, z, b, a], or merged
        weights' outputs such as [qkv, zba] or [qkvzba], gdn_input_blocks), conv [C, K],
        dt_bias, ssm_a [Hv], norm [Dv], conv_pool [slots, K-1, C], gdn_pool [slots, Hv, Dk, Dv],
        n_k_heads = Hk -> (gated_rmsnorm(o, z, norm, rms_eps) [T, Hv, Dv], gdn_step's tree part)
        with beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a, conv1d_step of qkv, q and k
        l2norm'ed (l2_eps; q times gdn_q_scale) and tiled to the value heads (gdn_qkv_heads), o
        from gdn_step(tree_mode). Bitwise the composition (CUDA: steps of AR rows in two launches,
        reading merged parts in place). A tree part may carry 'conv_inputs' (TreeStage's, staged
        by the chain itself), else the caller stages them (stage_tree_rows). out_proj (a Weight
        [N, Hv*Dv]): the result is matmul(normed [T, Hv*Dv], out_proj, batch.prefill_spans) [T, N]
        instead (CUDA quantizes normed for it in the chain's launch, bitwise the same)."""

    def merge_weights(self, weights: Sequence[Weight]) -> Weight | None:
        """One Weight [sum N_i, K] with the rows of each in turn, or None where the backend
        does not multiply them as one (then callers keep them apart). matmul through the
        merged weight equals each weight's matmul, bitwise, in its columns; where the backend
        re-encodes a weight to merge it (CUDA: Q5_0 beside Q8_0 as Q8_0, the same values), that
        weight's matmul in its merged type."""

    def silu(self, x: Array) -> Array:
        """x * sigmoid(x), elementwise."""

    def sigmoid(self, x: Array) -> Array:
        """1 / (1 + exp(-x)), elementwise."""

    def softplus(self, x: Array) -> Array:
        """log(1 + exp(x)), elementwise (overflow-safe)."""

    def exp(self, x: Array) -> Array:
        """exp(x), elementwise."""

    def l2norm(self, x: Array, eps: float) -> Array:
        """x [..., D] -> x / sqrt(sum(x^2) + eps) per row of D (transformers' l2norm)."""

    # ---- attention ---------------------------------------------------------------------------
    def kv_write(self, kv: Any, batch, k: Array, v: Array) -> None:
        """Store k, v [T, Hkv, D] f32 of the batch's rows at their KV locations
        (ForwardBatch.row_kv_locations); padding rows are skipped."""

    def kv_move_rows(self, kv: Any, src_rows: np.ndarray, dst_rows: np.ndarray) -> None:
        """Copy KV rows src_rows[i] -> dst_rows[i] [n] int (flat rows: page * PAGE_SIZE +
        offset) in kv.k and kv.v, every source read before any destination is written
        (tree commit moves the accepted rows into place). Pairs (-1, -1) are skipped (padding
        of a commit of fixed size)."""

    def attention(self, q: Array, kv: Any, batch, scale: float, causal: bool = True) -> Array:
        """Paged GQA attention. q [T, Hq, D] f32 (Hq a multiple of Hkv; query head h reads KV
        head h // (Hq / Hkv)); keys/values: segment s's first kv_len(s) KV rows in `kv`
        (write this step's rows first with kv_write). causal: row attends KV indices
        0..its own KV index; else all kv_len(s) rows. -> [T, Hq, D] f32 (zeros on padding)."""

    # ---- hybrid (Gated DeltaNet) ops: references in luce/ref/{conv1d,gdn_*,gated_rmsnorm}.py
    def causal_conv1d(self, x: Array, weight: Array, state: Array, silu: bool = True) -> tuple[Array, Array]:
        """x [T, C], weight [C, K], state [K-1, C] (previous inputs, oldest first)
        -> (y [T, C], new_state [K-1, C])."""

    def gdn_recurrent(self, q: Array, k: Array, v: Array, g: Array, beta: Array,
                      state: Array) -> tuple[Array, Array]:
        """Gated delta rule, one token at a time. q, k [T, Hv, Dk] (L2-normed, q scaled by
        1/sqrt(Dk)), v [T, Hv, Dv], g, beta [T, Hv], state [Hv, Dk, Dv] f32
        -> (o [T, Hv, Dv], new_state). Per token: h = exp(g) h; u = beta (v - h^T k);
        h += k u^T; o = h^T q."""

    def conv1d_segments(self, x: Array, weight: Array, pool: Array, batch, silu: bool = True) -> Array:
        """causal_conv1d of every live segment of `batch` in one call: x [T, C] its rows,
        pool [slots, K-1, C]; segment s reads pool[seq_slots[s]] and leaves its new window
        there (in place) -> y [T, C]."""

    def gdn_recurrent_segments(self, q: Array, k: Array, v: Array, g: Array, beta: Array, pool: Array,
                               batch) -> Array:
        """gdn_recurrent of every live segment of `batch` in one call from pool[seq_slots[s]]
        ([slots, Hv, Dk, Dv], updated in place) -> o [T, Hv, Dv]."""

    def gdn_chunked(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array,
                    chunk: int = 64) -> tuple[Array, Array]:
        """gdn_recurrent's maths in chunk form (prefill)."""

    def gated_rmsnorm(self, x: Array, z: Array, weight: Array, eps: float) -> Array:
        """x, z [..., D], weight [D] -> rmsnorm(x) * weight * silu(z)."""

    # ---- one step: every segment of a ForwardBatch, one launch per op ----------------------
    # Segment kinds (batch.kinds): PREFILL and AR segments update pool[slot] in place
    # (durable); TREE segments (the batch's tree block, rows tree_start..T-1) read pool[slot]
    # only. Slots and offsets are the batch's (the step's metadata arena on GPU backends).
    def conv1d_step(self, x: Array, weight: Array, pool: Array, batch, silu: bool = True) -> Array:
        """x [T, C] the step's conv inputs, weight [C, K], pool [slots, K-1, C] -> y [T, C]:
        PREFILL and AR segments causal_conv1d from pool[slot], leaving their new window there;
        TREE segments conv1d_tree from pool[slot]. Padding rows unspecified."""

    def gdn_step(self, q: Array, k: Array, v: Array, g: Array, beta: Array, pool: Array, batch,
                 mode: str = "factor") -> tuple[Array, dict | None]:
        """q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv], pool [slots, Hv, Dk, Dv] ->
        (o [T, Hv, Dv], tree part of a TreeStage or None without trees).
        PREFILL segments: chunks cut at absolute multiples of GDN_CHUNK from the segment's
        first position (luce.ref.gdn_chunked.delta_rule_groups: chunked form, one-token
        chunks the recurrent step); AR segments: the recurrent step; both from pool[slot],
        updated in place. TREE segments: gdn_tree_verify(mode) from pool[slot]; the result
        {'factors': TreeFactors} or {'node_states': ...} covers the tree block's rows."""

    def stage_tree_rows(self, x: Array, batch, pool: Array) -> Array:
        """x [T, W] (W >= C = pool's last axis: a merged projection's leading qkv block) -> [Nt, C]
        a copy of the first C columns of its tree block's rows (batch.tree_start..T-1), kept until
        the commit (TreeStage.conv_inputs of the layer whose state pool is `pool`). GPU backends
        put it, like the rest of a layer's TreeStage, at one address per layer, so that the
        tree commit's captured graph repeats (luce.models.commit)."""

    def tree_commit(self, conv_pool: Array, gdn_pool: Array, stage: TreeStage, commit) -> None:
        """Promote every accepted path of a step into the pools, one launch per op. commit
        (luce.models.commit.TreeCommit): slots [P], path_indptr [P+1], path_rows [R] (tree
        block rows, root first), tree_rows [P, 2] (each path's tree, rows [a, b) of the
        block), parents [Nt] (local parents of the block's rows). For path p on slot s:
        conv_pool[s] = the last K-1 rows of concat(conv_pool[s], conv_inputs[path rows]);
        gdn_pool[s] 'factor': the path's factors replayed with the AR step's update (h = exp(g)
        h; h += k u^T), 'baseline': the state of the path's last node. Slots < 0 are padding."""

    # ---- sampling (results on the host) --------------------------------------------------
    def argmax(self, logits: Array) -> np.ndarray:
        """logits [L, V] -> [L] int64 host array; ties go to the lowest token id."""

    def top_k_logprobs(self, logits: Array, k: int) -> tuple[np.ndarray, np.ndarray]:
        """logits [L, V] -> (ids [L, k] int64, logprobs [L, k] f32) host arrays, best first,
        ties to the lowest id; logprobs are log-softmax over the whole row."""

    def top_k_logprobs_start(self, logits: Array, k: int) -> Any:
        """top_k_logprobs queued behind the work before it: -> a handle for top_k_logprobs_wait
        (a backend that runs each call to its end returns the result)."""

    def top_k_logprobs_wait(self, handle: Any) -> tuple[np.ndarray, np.ndarray]:
        """The host (ids, logprobs) of a top_k_logprobs_start, once its work has run."""

    def sample(self, logits: Array, temperature, top_k, top_p, min_p, seed, position) -> np.ndarray:
        """Seeded sampling without penalties (luce/ref/sample_rng.py): logits [L, V];
        temperature, top_p, min_p [L] float64; top_k [L] int (1..BACKEND_TOPK_MAX where the
        temperature is not 0); seed [L] uint64; position [L] int64 -> [L] int64 host tokens,
        bitwise the engine's host sampler. NaN rows are an error."""


class FusedOps:
    """The fused ops of Backend as the composition of the ops they fuse (mixed into every
    backend; the CUDA backend overrides them with one-launch kernels of the same bits)."""

    def add_rmsnorm_matmuls(self, x, residual, weight, eps: float, weights, biases=None, prefill_spans=()):
        s = x if residual is None else self.add(x, residual)
        return s, self.matmuls(self.rmsnorm(s, weight, eps), weights, biases, prefill_spans=prefill_spans)

    def swiglu_matmul(self, gate, up, w, prefill_spans=()):
        if up is None:
            F = gate.shape[-1] // 2
            gate, up = self.split(gate, [F, F])
        return self.matmul(self.swiglu(gate, up), w, prefill_spans=prefill_spans)

    def gated_query(self, qg):
        """qg [T, H, 2D], each head's query then its gate -> the queries [T, H, D]."""
        D = qg.shape[-1] // 2
        return self.split(qg, [D, D])[0]

    def gate_output(self, o, qg):
        """o [T, H*D] * sigmoid(the gates of qg [T, H, 2D]) -> [T, H*D] (gated attention's output;
        o [T, H, D] with a merged projection's qg: luce.ops.gate_inputs)."""
        o, qg = gate_operands(self, o, qg)
        T, H, D = qg.shape[0], qg.shape[1], qg.shape[2] // 2
        return self.mul(o, self.sigmoid(self.split(qg, [D, D])[1].reshape(T, H * D)))

    def gate_output_matmul(self, o, qg, w, prefill_spans=()):
        return self.matmul(self.gate_output(o, qg), w, prefill_spans=prefill_spans)

    def rope_kv_write(self, parts, kv, batch, n_head: int, rope_dim: int, theta: float, sections=(),
                      q_norm=None, k_norm=None, eps: float = 0.0, gated: bool = False):
        Hkv, D = kv.k.shape[2], kv.k.shape[3]
        T = parts[0].shape[0]
        q_width = (2 if gated else 1) * n_head * D
        if len(parts) != 3:
            whole = parts[0] if len(parts) == 1 else self.concat_cols(parts)
            parts = self.split(whole, [q_width, Hkv * D, Hkv * D])
        if gated:
            parts = [self.gated_query(parts[0].reshape(T, n_head, 2 * D)), *parts[1:]]
        q, k, v = (p.reshape(T, -1, D) for p in parts)
        if q_norm is not None:
            q = self.rmsnorm(q, q_norm, eps)
        if k_norm is not None:
            k = self.rmsnorm(k, k_norm, eps)
        q = self.rope(q, batch.positions, rope_dim, theta, sections)
        k = self.rope(k, batch.positions, rope_dim, theta, sections)
        self.kv_write(kv, batch, k, v)
        return q

    def rope_kv_attention(self, parts, kv, batch, n_head: int, rope_dim: int, theta: float, sections=(),
                          q_norm=None, k_norm=None, eps: float = 0.0, scale: float = 1.0):
        q = self.rope_kv_write(parts, kv, batch, n_head, rope_dim, theta, sections, q_norm, k_norm, eps)
        return self.attention(q, kv, batch, scale, True)

    def conv_gdn_norm(self, parts, conv, dt_bias, ssm_a, norm, conv_pool, gdn_pool, batch, n_k_heads: int,
                      l2_eps: float, rms_eps: float, tree_mode: str = "factor", out_proj=None):
        _, Hv, dk, dv = gdn_pool.shape
        qkv, z, b, a = gdn_input_blocks(self, parts, gdn_input_widths(conv.shape[0], Hv, dv))
        T = qkv.shape[0]
        beta = self.sigmoid(b)
        g = self.mul(self.softplus(self.add(a, dt_bias)), ssm_a)
        mixed = self.conv1d_step(qkv, conv, conv_pool, batch)
        q, k, v = gdn_qkv_heads(self, mixed, T, n_k_heads, Hv, dk, dv, l2_eps)
        o, tree_part = self.gdn_step(q, k, v, g, beta, gdn_pool, batch, tree_mode)
        return gdn_out_proj(self, self.gated_rmsnorm(o, z.reshape(T, Hv, dv), norm, rms_eps), out_proj,
                            batch), tree_part

    def merge_weights(self, weights):
        return None
