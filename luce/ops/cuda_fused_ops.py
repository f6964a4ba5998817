"""The CUDA backend's fused ops (mixed into CudaBackend; kernels in cuda/norm_quant.cu,
cuda/rope_kv.cu and cuda/gdn_decode.cu, references in luce/ref/norm_quant.py, rope_kv.py and
gdn_decode.py): residual add + RMSNorm + the next matmul's activation quantization in one
launch, SwiGLU + quantization in one launch, the gated attention's output gate + quantization
in one launch, q/k norm + rotary + KV write in one launch, a GDN layer's decode chain (conv,
norms, gates, delta rule, gated norm) in two, and merged weights so q/k/v, gate/up or a GDN
layer's projections go through one matmul launch (their consumers read the merged output's
column blocks in place). Every result is bitwise the unfused ops' (the fused kernels share the
unfused kernels' device code). The fused quantization is the decode family's: a step whose
matmuls send rows to the prompt-row GEMM (prefill_spans, CudaBackend.has_prompt_rows) takes the
unfused composition, whose add / norm / SwiGLU / gate bits are the same, so a row's result never
depends on what else is in the step.
"""
from __future__ import annotations

import os

import numpy as np

from luce.ops.api import SEG_AR, SEG_PAD, SEG_TREE, FusedOps
from luce.ops.gate_inputs import gate_layout
from luce.ops.gdn_inputs import gdn_input_widths, gdn_out_proj, gdn_q_scale
from luce.ops.cuda_array import Block
from luce.ops.quant_weight import QuantWeight

Q5_0_AS_Q8_0 = os.environ.get("LUCE_MERGE_Q5_0", "1") != "0"   # merge_weights (A/B runs: "0" keeps them apart)

ROPE_ATTENTION_ON = os.environ.get("LUCE_ROPE_ATTN", "1") != "0"   # rope_kv_attention's fused launch

# matmuls of [q|k, v] in two types at one decode row as one launch (luce_matmul_pair; the same bits
# either way). H100, Coder-1.5B Q4_K_M C1: 741.8 / 740.9 tok/s against 734.5 / 733.9 without, 232
# launches a step against 246 (docs/PERF.md, session 26). LUCE_MATMUL_PAIR=0 turns it off (A/B runs).
PAIR_ON = os.environ.get("LUCE_MATMUL_PAIR", "1") != "0"

# The gated attention's output gate and the out projection's x quantization in one launch
# (luce_gate_quant) where that matmul would not quantize in lane. LUCE_GATE_QUANT=0: gate_output,
# then the matmul (A/B runs).
GATE_QUANT_ON = os.environ.get("LUCE_GATE_QUANT", "1") != "0"

# A step of tree rows only (speculative verify): a GDN layer's conv, norms and gates in one launch
# (luce_gdn_tree_prepare), then the tree verify with the gated norm: 16 kernels fewer a layer than
# the composition, the same bits. LUCE_GDN_TREE_FUSED=0 keeps the composition (A/B runs).
GDN_TREE_FUSED = os.environ.get("LUCE_GDN_TREE_FUSED", "1") != "0"

# A step of AR rows: the GDN out projection's x quantized in the chain's norm epilogue where that
# matmul would not quantize in lane (one launch a GDN layer fewer). LUCE_GDN_OUT_QUANT=0: the
# matmul quantizes normed itself (A/B runs).
GDN_OUT_QUANT_ON = os.environ.get("LUCE_GDN_OUT_QUANT", "1") != "0"


class CudaFusedOps(FusedOps):
    """Mixin of CudaBackend (uses its empty / _f32 / memcpy / _matmuls / _bias_ptr / _matmul_workspace /
    has_prompt_rows / stream)."""

    def _quant_workspace(self, rows: int, k: int, weights):
        """(workspace, bytes) for x [rows, k] quantized once for the block-type weights, or
        (None, 0) where the fused kernels cannot quantize (float weights only, k % 32)."""
        from luce import _cuda_matmul as km

        if rows == 0 or k % 32 or all(w.qtype in km.FLOAT_QTYPES for w in weights):
            return None, 0
        ws_bytes = km.workspace_bytes(rows, k)
        return self.empty((ws_bytes,), np.uint8), ws_bytes

    def _producer_workspace(self, on: bool, rows: int, k: int, w, prefill_spans):
        """(workspace, bytes) a fused producer of x [rows, k] quantizes into for w's matmul (on, w
        takes k columns, that matmul would not quantize in lane: quantizes_in_lane, no prompt
        rows), else (None, 0): the producer writes x alone and the matmul quantizes it."""
        if not on or w.k != k or self.quantizes_in_lane([w]) or self.has_prompt_rows(rows, prefill_spans):
            return None, 0
        return self._quant_workspace(rows, k, [w])

    def _matmul_pair(self, x, weights, biases, runs, workspaces):
        """CudaBackend._matmuls of two block-type weights whose types luce_matmul_pair may run
        as one launch (PAIR_QTYPES: the Q4_K_M mixes' q|k and v), one decode row: [y_a, y_b];
        None where it does not apply (PAIR_ON off, other shapes)."""
        from luce import _cuda_matmul as km

        if not PAIR_ON or len(weights) != 2 or runs != [(0, 1, False)]:
            return None
        a, b = weights
        if (a.qtype, b.qtype) not in km.PAIR_QTYPES or a.k != b.k or x.shape[1] != a.k:
            return None
        ys = [self.empty((1, w.n)) for w in weights]
        bias_ptrs = [self._bias_ptr(bias, w) for w, bias in zip(weights, biases)]
        ws, nb, flags = self._matmul_workspace(workspaces, 0, 1, a.k, km.workspace_bytes)
        km.matmul_pair(x.ptr, a.ptr, bias_ptrs[0], ys[0].ptr, a.n, a.qtype, b.ptr, bias_ptrs[1], ys[1].ptr, b.n,
                       b.qtype, ws.ptr, nb, 1, a.k, flags, self.stream)
        return ys

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
        # A step with prompt rows: the add and the norm in one launch, unquantized (the prompt-row
        # GEMM scales x its own way), instead of an add launch and a norm launch.
        prompt = self.has_prompt_rows(T, prefill_spans)
        s = x if residual is None else self.empty(x.shape)
        normed = self.empty(x.shape)
        workspace, ws_bytes = (None, 0) if prompt else self._quant_workspace(T, D, weights)
        if T:
            kf.add_rmsnorm(x.ptr, 0 if residual is None else residual.ptr, weight.ptr,
                           0 if residual is None else s.ptr, normed.ptr, 0 if workspace is None else workspace.ptr,
                           ws_bytes, T, D, eps, self.stream)
        if prompt:
            return s, self._matmuls(normed, weights, biases, prefill_spans)
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
        if self.has_prompt_rows(T, prefill_spans):   # the prompt-row GEMM quantizes its own way
            from luce import _cuda_elementwise as ke

            act = self.empty((T, F))
            if T:   # a merged gate|up is read in place (strides), not split into two copies first
                ke.swiglu(gate_ptr, up_ptr, act.ptr, T, F, stride, stride, F, stream=self.stream)
            return self.matmul(act, w, prefill_spans=prefill_spans)
        workspace, ws_bytes = self._quant_workspace(T, F, [w])
        if workspace is None:
            return super().swiglu_matmul(gate, up, w)
        act = self.empty((T, F))
        kf.swiglu_quant(gate_ptr, up_ptr, act.ptr, workspace.ptr, ws_bytes, T, F, stride, stride, self.stream)
        return self._matmuls(act, [w], None, (), (workspace, ws_bytes))[0]

    def gated_query(self, qg):
        return self._columns(self._f32(qg), 0, qg.shape[-1] // 2)   # one gather, not split's two

    def gate_output(self, o, qg):
        """One launch: o * sigmoid(gate), the gates read in place from qg (a strided view; the
        forms of luce.ops.gate_inputs), the bits of the split, sigmoid and mul launches."""
        from luce import _cuda_pointwise as kp

        o, qg = self._f32(o), self._f32(qg)
        T, H, D, stride = gate_layout(o, qg)
        out = self.empty((T, H * D))
        if T:
            kp.binary("mul_sigmoid", o.ptr, qg.ptr + 4 * D, out.ptr, (1, T, H, D), (0, H * D, D, 1),
                      (0, stride, 2 * D, 1), 0.0, self.stream)
        return out

    def gate_output_matmul(self, o, qg, w, prefill_spans=()):
        """A step of decode-family rows whose matmul would not quantize x in lane anyway
        (quantizes_in_lane: the 27B's k = 6,144): the gate and the out projection's quantization
        of x in one launch (luce_gate_quant), then the matmul reading that workspace; else
        gate_output, then matmul. The gates read in place either way; the composition's bits."""
        from luce import _cuda_fused as kf

        o, qg = self._f32(o), self._f32(qg)
        T, H, D, stride = gate_layout(o, qg)
        workspace, ws_bytes = self._producer_workspace(GATE_QUANT_ON and D % 4 == 0, T, H * D, w, prefill_spans)
        if workspace is None:
            return super().gate_output_matmul(o, qg, w, prefill_spans)   # this class's gate_output
        act = self.empty((T, H * D))
        kf.gate_quant(o.ptr, qg.ptr, act.ptr, workspace.ptr, ws_bytes, T, H, D, stride, self.stream)
        return self._matmuls(act, [w], None, (), (workspace, ws_bytes))[0]

    def rope_kv_write(self, parts, kv, batch, n_head: int, rope_dim: int, theta: float, sections=(),
                      q_norm=None, k_norm=None, eps: float = 0.0, gated: bool = False):
        from luce import _cuda_fused as kf
        from luce.ops.cuda_step_meta import meta_of

        Hkv, D = kv.k.shape[2], kv.k.shape[3]
        parts, views, n_pos = self._rope_kv_views(parts, kv, batch, n_head, rope_dim, sections, gated)
        T = parts[0].shape[0]
        meta = meta_of(self, batch)
        if views is None:
            return super().rope_kv_write(parts, kv, batch, n_head, rope_dim, theta, sections, q_norm, k_norm, eps,
                                         gated)
        q_norm = None if q_norm is None else self._f32(q_norm)
        k_norm = None if k_norm is None else self._f32(k_norm)
        q_out = self.empty((T, n_head, D))
        (q, q_stride), (k, k_stride), (v, v_stride) = views
        kf.rope_kv(q, k, v, 0 if q_norm is None else q_norm.ptr, 0 if k_norm is None else k_norm.ptr, q_out.ptr,
                   kv.k.ptr, kv.v.ptr, meta.ptr("kv_dst"), self._dev(batch.positions, np.int32).ptr, T,
                   q_stride, k_stride, v_stride, n_head, Hkv, D, rope_dim, theta, tuple(sections), n_pos, eps,
                   self.stream, 2 * D if gated else 0)   # gated: the queries read in place, no gather
        return q_out

    def _rope_kv_views(self, parts, kv, batch, n_head: int, rope_dim: int, sections, gated: bool = False):
        """(parts as f32, the (address, row stride) of their q, k, v column blocks or None where
        the rope_kv kernel does not take them, n_pos); gated: the q block is [query | gate] heads
        (n_head * 2D). ValueError for inconsistent shapes."""
        from luce.ops.cuda_step_meta import meta_of

        Hkv, D = kv.k.shape[2], kv.k.shape[3]
        parts = [self._f32(p) for p in parts]
        T = parts[0].shape[0]
        widths = [(2 if gated else 1) * n_head * D, Hkv * D, Hkv * D]
        if any(p.ndim != 2 or p.shape[0] != T for p in parts) or sum(p.shape[1] for p in parts) != sum(widths):
            raise ValueError(f"rope_kv_write: parts {[p.shape for p in parts]} are not [T, q | k | v] columns "
                             f"{widths} for {n_head} query / {Hkv} KV heads of {D}")
        views = _column_views(parts, widths)
        pos = np.asarray(batch.positions, dtype=np.int32)
        n_pos = 1 if pos.ndim == 1 else pos.shape[-1]
        if views is None or D > 1024 or T == 0 or not meta_of(self, batch).has_kv_rows:
            return parts, None, n_pos
        if rope_dim > D or rope_dim % 2 or pos.shape[0] != T or n_pos not in (1, 4) or (n_pos == 4 and not sections):
            raise ValueError(f"rope_kv_write: rope_dim {rope_dim} of head_dim {D}, positions {pos.shape} for {T} rows "
                             f"(sections {tuple(sections)})")
        return parts, views, n_pos

    def rope_kv_attention(self, parts, kv, batch, n_head: int, rope_dim: int, theta: float, sections=(),
                          q_norm=None, k_norm=None, eps: float = 0.0, scale: float = 1.0):
        """A step whose live segments are all AR rows (batch.decode_only: its kinds, in the
        replay key, so a replayed graph took the same path when captured) at head_dim 64 or 128
        with one position a row (no M-RoPE): one attention launch that takes the projection (luce_rope_kv_attention,
        the bits of rope_kv then attention); any other step, or LUCE_ROPE_ATTN=0 (A/B runs):
        rope_kv_write, then attention."""
        from luce.ops.cuda_sequence_ops import ATTENTION_MAX_GROUP
        from luce.ops.cuda_step_meta import meta_of

        Hkv, D = kv.k.shape[2], kv.k.shape[3]
        parts, views, n_pos = self._rope_kv_views(parts, kv, batch, n_head, rope_dim, sections)
        if views is None or D not in (64, 128) or n_pos != 1 or not batch.decode_only or not ROPE_ATTENTION_ON \
                or n_head % Hkv or n_head // Hkv > ATTENTION_MAX_GROUP or not meta_of(self, batch).max_kv:
            return super().rope_kv_attention(parts, kv, batch, n_head, rope_dim, theta, sections, q_norm, k_norm,
                                             eps, scale)
        # the norms and positions stay referenced here until the launch
        norms = [None if n is None else self._f32(n) for n in (q_norm, k_norm)]
        positions = self._dev(batch.positions, np.int32)
        (q, q_stride), (k, k_stride), (v, v_stride) = views
        rope = (q, k, v, *(0 if n is None else n.ptr for n in norms), meta_of(self, batch).ptr("kv_dst"),
                positions.ptr, q_stride, k_stride, v_stride, rope_dim, theta, tuple(sections), eps)
        return self._attention((parts[0].shape[0], n_head, D), None, kv, batch, scale, True, rope)

    def conv_gdn_norm(self, parts, conv, dt_bias, ssm_a, norm, conv_pool, gdn_pool, batch, n_k_heads: int,
                      l2_eps: float, rms_eps: float, tree_mode: str = "factor", out_proj=None):
        """A step whose live segments are all AR rows: cuda/gdn_decode.cu (2 launches), reading
        the column blocks qkv | z | b | a of merged parts in place (row strides), and quantizing
        normed for out_proj in its second launch where that matmul would not quantize in lane
        (quantizes_in_lane: the 27B's k = 6,144); a step of tree rows only: luce_gdn_tree_prepare,
        then gdn_step's tree verify with the norm (_tree_chain); any other step: the composition
        (conv1d_step, gdn_step and the pointwise ops, each one launch; a merged part is split
        there first, a gather a block). out_proj after the chain as api.Backend.conv_gdn_norm says."""
        from luce import _cuda_gdn as kg
        from luce.ops.cuda_step_meta import meta_of
        from luce.ops.cuda_step_ops import GDN_KEY_DIMS

        kinds, T = batch.kinds, parts[0].shape[0]
        n_slots, Hv, dk, dv = gdn_pool.shape
        K = conv.shape[-1]
        live = kinds[kinds != SEG_PAD]
        only = lambda kind: live.size > 0 and bool((live == kind).all())  # noqa: E731
        tree = GDN_TREE_FUSED and only(SEG_TREE) and batch.max_tree_rows <= 65535
        if T == 0 or not (only(SEG_AR) or tree) or dk not in GDN_KEY_DIMS or dv % 32 or not 2 <= K <= 8:
            return super().conv_gdn_norm(parts, conv, dt_bias, ssm_a, norm, conv_pool, gdn_pool, batch,
                                         n_k_heads, l2_eps, rms_eps, tree_mode, out_proj)
        parts = [self._f32(x) for x in parts]
        conv, dt_bias, ssm_a, norm = (self._f32(x) for x in (conv, dt_bias, ssm_a, norm))
        C = 2 * n_k_heads * dk + Hv * dv
        widths = gdn_input_widths(C, Hv, dv)
        views = None if any(p.ndim != 2 or p.shape[0] != T for p in parts) or \
            sum(p.shape[1] for p in parts) != sum(widths) else _column_views(parts, widths)
        if views is None or conv.shape != (C, K) or conv_pool.shape != (n_slots, K - 1, C) \
                or dt_bias.shape != (Hv,) or ssm_a.shape != (Hv,) or norm.shape != (dv,):
            raise ValueError(f"conv_gdn_norm: parts {[p.shape for p in parts]}, conv {conv.shape}, conv_pool "
                             f"{conv_pool.shape}, dt_bias {dt_bias.shape}, ssm_a {ssm_a.shape}, norm {norm.shape} for "
                             f"{n_k_heads} key heads and gdn_pool {gdn_pool.shape}: want parts [T, w] of column "
                             f"blocks qkv | z | b | a {widths}, conv [{C}, K], conv_pool [{n_slots}, K-1, {C}], "
                             f"dt_bias, ssm_a [{Hv}], norm [{dv}]")
        (qkv, qkv_stride), (z, z_stride), (b, b_stride), (a, a_stride) = views
        S, meta = batch.n_segments, meta_of(self, batch)
        if tree:
            normed, tree_part = self._tree_chain(T, views, conv, conv_pool, dt_bias, ssm_a, norm, gdn_pool, batch,
                                                 n_k_heads, l2_eps, rms_eps, tree_mode)
            return gdn_out_proj(self, normed, out_proj, batch), tree_part
        q, k = self.empty((T, Hv, dk)), self.empty((T, Hv, dk))
        v, o, normed = self.empty((T, Hv, dv)), self.empty((T, Hv, dv)), self.empty((T, Hv, dv))
        g, beta = self.empty((T, Hv)), self.empty((T, Hv))
        workspace, ws_bytes = (None, 0) if out_proj is None else self._producer_workspace(
            GDN_OUT_QUANT_ON and dv <= 4096, T, Hv * dv, out_proj, batch.prefill_spans)
        chunks = (Hv * dv + 255) // 256 if workspace is not None else 0
        arrivals = self.empty((S * (Hv + chunks),), np.int32)
        kg.gdn_decode(qkv, conv.ptr, conv_pool.ptr, b, a, dt_bias.ptr, ssm_a.ptr, z, norm.ptr,
                      gdn_pool.ptr, q.ptr, k.ptr, v.ptr, g.ptr, beta.ptr, o.ptr, normed.ptr, arrivals.ptr,
                      meta.ptr("qo_indptr"), meta.ptr("ar_slots"), n_slots, S, n_k_heads, Hv, dk, dv, K,
                      gdn_q_scale(dk), l2_eps, rms_eps, qkv_stride, z_stride, b_stride, a_stride, self.stream,
                      0 if workspace is None else workspace.ptr, ws_bytes, T)
        if workspace is None:
            return gdn_out_proj(self, normed, out_proj, batch), None
        return self._matmuls(normed.reshape(T, Hv * dv), [out_proj], None, (), (workspace, ws_bytes))[0], None

    def _tree_chain(self, T: int, views, conv, conv_pool, dt_bias, ssm_a, norm, gdn_pool, batch, n_k_heads: int,
                    l2_eps: float, rms_eps: float, tree_mode: str):
        """conv_gdn_norm of a step of tree rows only (views: conv_gdn_norm's column blocks):
        q, k, v, g, beta in one launch (luce_gdn_tree_prepare, which also zeroes the arrivals),
        then gdn_step's tree verify with the gated RMSNorm epilogue reading z in place ('factor':
        the prepare also zeroes normed's padding rows and stages the commit's conv inputs, the
        tree part's 'conv_inputs'; 'baseline': gdn_step, then gated_rmsnorm over a copy of z)."""
        from luce import _cuda_gather as kga
        from luce import _cuda_gdn as kg
        from luce.ops.cuda_step_meta import meta_of
        from luce.ops.cuda_step_ops import stage_capacity

        (qkv, qkv_stride), (z, z_stride), (b, b_stride), (a, a_stride) = views
        n_slots, Hv, dk, dv = gdn_pool.shape
        K, meta, S = conv.shape[-1], meta_of(self, batch), batch.n_segments
        q, k = self.empty((T, Hv, dk)), self.empty((T, Hv, dk))
        v, g, beta = self.empty((T, Hv, dv)), self.empty((T, Hv)), self.empty((T, Hv))
        arrivals = self.empty((S, Hv), np.int32)
        factor, t0 = tree_mode == "factor", batch.tree_start
        normed = self.empty((T, Hv, dv)) if factor else None   # padding rows: the prepare's zeros
        stage = self._stage(conv_pool, "conv_inputs", (T - t0, conv.shape[0]),
                            stage_capacity(conv_pool, batch)) if factor else None
        kg.gdn_tree_prepare(qkv, conv.ptr, conv_pool.ptr, b, a, dt_bias.ptr, ssm_a.ptr, z, q.ptr, k.ptr, v.ptr, g.ptr,
                            beta.ptr, meta.ptr("qo_indptr"), meta.ptr("tree_slots"), meta.ptr("tree_parents"),
                            n_slots, S, n_k_heads, Hv, dk, dv, K, gdn_q_scale(dk), l2_eps, qkv_stride, z_stride,
                            b_stride, a_stride, batch.max_tree_rows, self.stream, arrivals=arrivals.ptr,
                            normed=normed.ptr if factor else 0, conv_stage=stage.ptr if factor else 0,
                            stage_row0=t0)
        if factor:
            _, tree_part = self.gdn_step(q, k, v, g, beta, gdn_pool, batch, tree_mode,
                                         norm=(z, z_stride, norm, rms_eps, normed, arrivals))
            return normed, dict(tree_part, conv_inputs=stage)
        o, tree_part = self.gdn_step(q, k, v, g, beta, gdn_pool, batch, tree_mode)
        z_rows = self.empty((T, Hv, dv))
        kga.gather(z, z_rows.ptr, 0, 0, T, 4 * Hv * dv, 4 * z_stride, 4 * Hv * dv, self.stream)
        return self.gated_rmsnorm(o, z_rows, norm, rms_eps), tree_part

    def merge_weights(self, weights):
        """Block-type weights of one ggml type and width -> one QuantWeight [sum n, k] (their
        rows copied in turn; a row's products do not depend on the matrix it sits in). Q5_0
        weights beside Q8_0 ones merge as Q8_0 (_q8_0_of: the same values exactly, then the
        Q8_0 arithmetic): the Coder-0.5B's q|k (Q5_0) and v (Q8_0, half its layers) in one launch."""
        from luce import _cuda_matmul as km

        q5, q8 = km.QTYPES["Q5_0"], km.QTYPES["Q8_0"]
        if Q5_0_AS_Q8_0 and len(weights) > 1 and {w.qtype for w in weights} == {q5, q8}:
            weights = [self._q8_0_of(w) if w.qtype == q5 else w for w in weights]
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

    def _q8_0_of(self, w):
        """A Q5_0 QuantWeight as Q8_0 (luce.gguf.quants_legacy.q5_0_as_q8_0: each block's d and
        ints q - 16), a new device copy; at load, where projections merge."""
        from luce import _cuda_matmul as km
        from luce.gguf.quants_legacy import q5_0_as_q8_0
        from luce.ops.cuda_array import CudaArray

        raw = self.to_numpy(CudaArray(w.block, w.ptr, (w.n * w.row_bytes // 22, 22), np.uint8, self))
        return self._upload_weight(q5_0_as_q8_0(raw), km.QTYPES["Q8_0"], w.shape, "a Q5_0 weight as Q8_0")


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
