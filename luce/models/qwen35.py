"""Qwen3.5 / 3.6 hybrid model (GGUF arch `qwen35`), following llama.cpp's
src/models/qwen35.cpp and transformers' Qwen3_5ForCausalLM:

    x = token_embd[ids]
    per layer: x += mixer(rmsnorm(x) * attn_norm)           mixer: Gated DeltaNet (gdn_layer)
               x += ffn(rmsnorm(x) * post_attention_norm)          or gated full attention
    logits = (rmsnorm(x) * output_norm) @ output^T          (output = token_embd when tied)

Gated full attention: `attn_q` gives per head [query (D), gate (D)]; per-head RMSNorm on q
and k, partial NEOX rotary on rope_dim dims (IMROPE with text positions), GQA over the
paged KV, output * sigmoid(gate), then attn_output. Layer kinds come from
config.recurrent_layers. Norm weights are used as stored (the GGUF holds 1 + w).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from luce.models.batch import ForwardBatch, ForwardOutput, ensure_valid
from luce.models.gdn_layer import GDNDims, GDNWeights, gdn_mixer, gdn_projections
from luce.models.kv_cache import ModelState, PagedKV
from luce.models.layers import AttentionWeights, FFNWeights, TokenIO, blk, ffn_block
from luce.models.loader import register_arch
from luce.models.recurrent_state import RecurrentState


def gated_attention(backend, w: AttentionWeights, projections, batch, kv, config):
    """Gated full attention of one layer from the normed input's projections through
    w.projections, columns [q | k | v] with q interleaved with its gate per head (merged where
    the backend merges: [qk, v] or [qkv]) -> [T, hidden]. The queries and the gates are read
    from the first projection in place where the backend fuses (CUDA)."""
    b = backend
    T, H, D = projections[0].shape[0], config.n_head, config.head_dim
    q = b.rope_kv_write(projections, kv, batch, H, config.rope_dim, config.rope_theta, config.rope_sections,
                        w.q_norm, w.k_norm, config.rms_eps, gated=True)   # q/k norm, rotary, KV write
    o = b.attention(q, kv, batch, 1.0 / float(np.sqrt(D))).reshape(T, H, D)   # tree rows: ancestors
    return b.gate_output_matmul(o, projections[0], w.wo, batch.prefill_spans)   # qg: its first 2HD columns


@dataclass
class Qwen35Layer:
    attn_norm: Any                   # [hidden]
    post_attention_norm: Any         # [hidden]
    ffn: FFNWeights
    gdn: GDNWeights | None = None    # Gated DeltaNet layers
    attn: AttentionWeights | None = None  # full-attention layers


class Qwen35Model(TokenIO):
    """Hybrid Gated DeltaNet + gated attention decoder (see luce.models.batch.Model).

    State (`new_state`): paged KV for the full-attention layers and, per slot, conv
    [K-1, C] and GDN [Hv, Dk, Dv] f32 state for every GDN layer (RecurrentState)."""

    def __init__(self, config, backend, token_embd, layers: list[Qwen35Layer], output_norm, output):
        self.config = config
        self.backend = backend
        self.token_embd = token_embd     # Weight [V, hidden]
        self.layers = layers
        self.output_norm = output_norm   # [hidden]
        self.output = output             # Weight [V, hidden] (token_embd when tied)
        self.gdn_dims = GDNDims.of(config)
        self.gdn_tree_mode = "factor"    # tree verify of GDN layers: luce.ops.api.TREE_MODES

    @classmethod
    def from_gguf(cls, gguf, backend) -> "Qwen35Model":
        config = gguf.config
        if config.arch != "qwen35":
            raise ValueError(f"Qwen35Model serves GGUF arch 'qwen35', not {config.arch!r}")
        if len(config.recurrent_layers) != config.n_layer:
            raise ValueError(f"qwen35 config has {len(config.recurrent_layers)} layer kinds for "
                             f"{config.n_layer} layers; the GGUF needs attention.recurrent_layers "
                             "or full_attention_interval")
        layers = []
        for il, recurrent in enumerate(config.recurrent_layers):
            layers.append(Qwen35Layer(
                attn_norm=backend.load_tensor(gguf, blk(il, "attn_norm.weight")),
                post_attention_norm=backend.load_tensor(gguf, blk(il, "post_attention_norm.weight")),
                ffn=FFNWeights.load(backend, gguf, il),
                gdn=GDNWeights.load(backend, gguf, il) if recurrent else None,
                attn=None if recurrent else AttentionWeights.load(backend, gguf, il).merge(backend)))
        token_embd = backend.load_weight(gguf, "token_embd.weight")
        output = backend.load_weight(gguf, "output.weight") if "output.weight" in gguf.tensors else token_embd
        return cls(config, backend, token_embd, layers, backend.load_tensor(gguf, "output_norm.weight"), output)

    def new_state(self, max_pages: int, max_slots: int) -> ModelState:
        c, d = self.config, self.gdn_dims
        kv = {il: PagedKV(max_pages, c.n_head_kv, c.head_dim, zeros=self.backend.zeros)
              for il in c.full_attention_layers}
        recurrent = RecurrentState(self.backend, c.gdn_layers, max_slots,
                                   d.conv_state_shape, d.gdn_state_shape)
        return ModelState(max_pages=max_pages, max_slots=max_slots, kv=kv, recurrent=recurrent,
                          backend=self.backend)

    def forward(self, batch: ForwardBatch, state: ModelState) -> ForwardOutput:
        """One step: logits [L, V] of batch.logits_indices, {layer: output [T, hidden]} of
        batch.capture_layers (the layer's output, before the final norm) and, when the step
        verifies trees, {GDN layer: TreeStage} (ForwardOutput.staged). Prefill and AR rows
        update the KV of attention layers and their slot's conv and GDN state; tree rows write
        scratch KV rows only (luce.models.commit promotes the accepted paths)."""
        ensure_valid(batch, state.max_slots, int(self.config.vocab))
        if state.recurrent is None and self.config.gdn_layers:
            raise ValueError("qwen35 forward needs a state from Qwen35Model.new_state (no recurrent state given)")
        b, c = self.backend, self.config
        x = self.embed(batch.token_ids)
        captured, staged = {}, {}
        pending = None   # the last FFN's output, not yet added to x (fused into the next norm)
        for il, layer in enumerate(self.layers):
            weights = gdn_projections(layer.gdn) if layer.gdn is not None else layer.attn.projections
            x, projections = b.add_rmsnorm_matmuls(x, pending, layer.attn_norm, c.rms_eps, weights,
                                                   prefill_spans=batch.prefill_spans)
            if layer.gdn is not None:
                h = gdn_mixer(b, layer.gdn, projections, batch, state.recurrent, il, self.gdn_dims, c.rms_eps,
                              self.gdn_tree_mode, staged)
            else:
                h = gated_attention(b, layer.attn, projections, batch, state.kv[il], c)
            x, pending = ffn_block(b, layer.post_attention_norm, layer.ffn, x, h, c.rms_eps, batch.prefill_spans)
            if il in batch.capture_layers:
                x, pending = b.add(x, pending), None
                captured[il] = x
        logits = self.final_logits(x, pending, batch.logits_indices)
        return ForwardOutput(logits=logits, captured=captured, staged=staged)


register_arch("qwen35", Qwen35Model)
