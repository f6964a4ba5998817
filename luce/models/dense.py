"""Dense Qwen2 / Qwen3 (GGUF archs `qwen2`, `qwen3`), following llama.cpp's
src/models/qwen2.cpp and qwen3.cpp and transformers' Qwen2/Qwen3ForCausalLM:

    x = token_embd[ids]
    per layer: x += attn(rmsnorm(x) * attn_norm);  x += ffn(rmsnorm(x) * ffn_norm)
    (each residual add is fused with the norm after it: backend.add_rmsnorm_matmuls)
    logits = (rmsnorm(x) * output_norm) @ output^T    (output = token_embd when tied)

qwen2 adds q/k/v biases; qwen3 has per-head q/k RMSNorm before rotary. Rotary is NEOX.
"""
from __future__ import annotations

from dataclasses import dataclass

from luce.models.batch import ForwardBatch, ForwardOutput, ensure_valid
from luce.models.kv_cache import ModelState, PagedKV
from luce.models.layers import AttentionWeights, FFNWeights, TokenIO, ffn_block, gqa_attention
from luce.models.loader import register_arch


@dataclass
class DenseLayer:
    attn_norm: object          # [hidden]
    attn: AttentionWeights
    ffn_norm: object           # [hidden]
    ffn: FFNWeights


class DenseModel(TokenIO):
    """Qwen2/Qwen3 decoder on any backend (see luce.models.batch.Model)."""

    def __init__(self, config, backend, token_embd, layers: list[DenseLayer], output_norm, output):
        self.config = config
        self.backend = backend
        self.token_embd = token_embd   # Weight [V, hidden]
        self.layers = layers
        self.output_norm = output_norm # [hidden]
        self.output = output           # Weight [V, hidden] (token_embd when tied)

    @classmethod
    def from_gguf(cls, gguf, backend) -> "DenseModel":
        config = gguf.config
        if config.arch not in ("qwen2", "qwen3"):
            raise ValueError(f"DenseModel serves archs qwen2 and qwen3, not {config.arch!r}")
        layers = [DenseLayer(attn_norm=backend.load_tensor(gguf, f"blk.{il}.attn_norm.weight"),
                             attn=AttentionWeights.load(backend, gguf, il).merge(backend),
                             ffn_norm=backend.load_tensor(gguf, f"blk.{il}.ffn_norm.weight"),
                             ffn=FFNWeights.load(backend, gguf, il))
                  for il in range(config.n_layer)]
        token_embd = backend.load_weight(gguf, "token_embd.weight")
        output = token_embd if "output.weight" not in gguf.tensors else backend.load_weight(gguf, "output.weight")
        return cls(config, backend, token_embd, layers, backend.load_tensor(gguf, "output_norm.weight"), output)

    def new_state(self, max_pages: int, max_slots: int) -> ModelState:
        c = self.config
        kv = {il: PagedKV(max_pages, c.n_head_kv, c.head_dim, zeros=self.backend.zeros)
              for il in range(c.n_layer)}
        return ModelState(max_pages=max_pages, max_slots=max_slots, kv=kv, backend=self.backend)

    def forward(self, batch: ForwardBatch, state: ModelState) -> ForwardOutput:
        ensure_valid(batch, state.max_slots, int(self.config.vocab))
        b, eps = self.backend, self.config.rms_eps
        x = self.embed(batch.token_ids)
        pending = None   # the last FFN's output, not yet added to x (fused into the next norm)
        captured = {}
        for il, layer in enumerate(self.layers):
            x, qkv = b.add_rmsnorm_matmuls(x, pending, layer.attn_norm, eps, layer.attn.projections,
                                           layer.attn.biases, batch.prefill_spans)
            h = gqa_attention(b, layer.attn, qkv, batch, state.kv[il], self.config)
            x, pending = ffn_block(b, layer.ffn_norm, layer.ffn, x, h, eps, batch.prefill_spans)
            if il in batch.capture_layers:
                x, pending = b.add(x, pending), None
                captured[il] = x
        logits = self.final_logits(x, pending, batch.logits_indices)
        return ForwardOutput(logits=logits, captured=captured)


register_arch("qwen2", DenseModel)
register_arch("qwen3", DenseModel)
