"""Typed model configuration read from GGUF metadata (archs qwen35, qwen2, qwen3, dflash).

Field names follow the model, not the GGUF keys; `luce.gguf.reader` fills them from
`{arch}.*` keys (see MODELS.md for the key-to-field mapping and conventions).
"""
from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("qwen35", "qwen2", "qwen3", "dflash")


@dataclass(frozen=True)
class ModelConfig:
    arch: str                        # 'qwen35' | 'qwen2' | 'qwen3' | 'dflash'
    n_layer: int                     # {arch}.block_count
    hidden: int                      # {arch}.embedding_length
    ffn: int                         # {arch}.feed_forward_length
    n_head: int                      # {arch}.attention.head_count
    n_head_kv: int                   # {arch}.attention.head_count_kv
    head_dim: int                    # {arch}.attention.key_length (else hidden // n_head)
    vocab: int                       # rows of token_embd (or tokenizer.ggml.tokens length)
    rms_eps: float                   # {arch}.attention.layer_norm_rms_epsilon
    rope_theta: float                # {arch}.rope.freq_base
    rope_dim: int                    # {arch}.rope.dimension_count: rotated dims per head
    context_length: int              # {arch}.context_length
    rope_sections: tuple[int, ...] = ()   # {arch}.rope.dimension_sections (M-RoPE), () if none
    qkv_bias: bool = False           # qwen2: attn_q/k/v carry a bias
    qk_norm: bool = False            # qwen3, qwen35 attention, dflash: per-head q/k RMSNorm
    tied_embeddings: bool = False    # no `output.weight`: the LM head is token_embd
    # qwen35 hybrid: per-layer kind and Gated DeltaNet sizes
    recurrent_layers: tuple[bool, ...] = ()  # True where layer il is Gated DeltaNet
    ssm_conv_kernel: int = 0         # {arch}.ssm.conv_kernel (4)
    ssm_state_size: int = 0          # {arch}.ssm.state_size: GDN key = value head dim
    ssm_n_k_heads: int = 0           # {arch}.ssm.group_count
    ssm_n_v_heads: int = 0           # {arch}.ssm.time_step_rank
    ssm_inner: int = 0               # {arch}.ssm.inner_size = n_v_heads * state_size
    # dflash draft
    target_layers: tuple[int, ...] = ()  # 0-based target layers whose outputs are captured
    block_size: int = 0              # {arch}.block_size (16)
    mask_token_id: int = -1          # tokenizer.ggml.mask_token_id
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_hybrid(self) -> bool:
        return any(self.recurrent_layers)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        if not self.recurrent_layers:
            return tuple(range(self.n_layer))
        return tuple(i for i, r in enumerate(self.recurrent_layers) if not r)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.recurrent_layers) if r)
