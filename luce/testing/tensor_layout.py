"""GGUF tensor names and numpy-order shapes per arch, as llama.cpp stores them.

Shapes are numpy order: a linear layer mapping `in` -> `out` is `[out, in]` (ggml ne is
the reverse, `{in, out}`, as llama.cpp's create_tensor calls spell it). Checked against
llama.cpp src/models/{qwen35,qwen2,qwen3,dflash}.cpp and conversion/qwen.py:

- qwen35 full attention: `attn_q` is `[2 * n_head * head_dim, hidden]`, rows per head
  `[query (head_dim), gate (head_dim)]`; per-head `attn_q_norm`/`attn_k_norm` `[head_dim]`.
- qwen35 Gated DeltaNet: `attn_qkv` `[2*nk*ds + nv*ds, hidden]` (q, k, v blocks),
  `attn_gate` (z) `[nv*ds, hidden]`, `ssm_conv1d.weight` `[conv_channels, conv_kernel]`
  (ggml `{kernel, channels}`), `ssm_dt.bias` and `ssm_a` (no `.weight`) `[nv]`,
  `ssm_beta`/`ssm_alpha` `[nv, hidden]`, `ssm_norm` `[ds]`, `ssm_out` `[hidden, nv*ds]`.
- qwen35 norms: `attn_norm` before the mixer, `post_attention_norm` before the FFN.
- qwen2/qwen3: `ffn_norm` before the FFN; qwen2 has q/k/v biases, qwen3 q/k norms.
- dflash: `fc` `[hidden, n_target_layers * hidden]` (llama.cpp sizes the input as
  n_target_layers * the draft's own hidden), `enc.output_norm`, qwen3-style layers and its
  own final `output_norm`; no `token_embd`/`output` (the target's are used).
"""
from __future__ import annotations

from luce.gguf.config import ModelConfig

Shape = tuple[int, ...]


def tensor_shapes(config: ModelConfig) -> dict[str, Shape]:
    """name -> numpy shape of every tensor a model file of `config` holds, in file order."""
    if config.arch == "qwen35":
        return _qwen35(config)
    if config.arch in ("qwen2", "qwen3"):
        return _dense(config)
    if config.arch == "dflash":
        return _dflash(config)
    raise ValueError(f"no tensor layout for arch {config.arch!r}")


def _embeddings(c: ModelConfig) -> dict[str, Shape]:
    return {"token_embd.weight": (c.vocab, c.hidden)}


def _head(c: ModelConfig) -> dict[str, Shape]:
    shapes: dict[str, Shape] = {"output_norm.weight": (c.hidden,)}
    if not c.tied_embeddings:
        shapes["output.weight"] = (c.vocab, c.hidden)
    return shapes


def _ffn(p: str, c: ModelConfig) -> dict[str, Shape]:
    return {f"{p}.ffn_gate.weight": (c.ffn, c.hidden), f"{p}.ffn_up.weight": (c.ffn, c.hidden),
            f"{p}.ffn_down.weight": (c.hidden, c.ffn)}


def _attention(p: str, c: ModelConfig, q_rows: int) -> dict[str, Shape]:
    kv = c.n_head_kv * c.head_dim
    shapes: dict[str, Shape] = {f"{p}.attn_q.weight": (q_rows, c.hidden)}
    if c.qkv_bias:
        shapes[f"{p}.attn_q.bias"] = (q_rows,)
    shapes[f"{p}.attn_k.weight"] = (kv, c.hidden)
    if c.qkv_bias:
        shapes[f"{p}.attn_k.bias"] = (kv,)
    shapes[f"{p}.attn_v.weight"] = (kv, c.hidden)
    if c.qkv_bias:
        shapes[f"{p}.attn_v.bias"] = (kv,)
    shapes[f"{p}.attn_output.weight"] = (c.hidden, c.n_head * c.head_dim)
    if c.qk_norm:
        shapes[f"{p}.attn_q_norm.weight"] = (c.head_dim,)
        shapes[f"{p}.attn_k_norm.weight"] = (c.head_dim,)
    return shapes


def _gated_deltanet(p: str, c: ModelConfig) -> dict[str, Shape]:
    key_dim = c.ssm_n_k_heads * c.ssm_state_size
    value_dim = c.ssm_n_v_heads * c.ssm_state_size
    return {
        f"{p}.attn_qkv.weight": (2 * key_dim + value_dim, c.hidden),
        f"{p}.attn_gate.weight": (value_dim, c.hidden),
        f"{p}.ssm_conv1d.weight": (2 * key_dim + value_dim, c.ssm_conv_kernel),
        f"{p}.ssm_dt.bias": (c.ssm_n_v_heads,),
        f"{p}.ssm_a": (c.ssm_n_v_heads,),
        f"{p}.ssm_beta.weight": (c.ssm_n_v_heads, c.hidden),
        f"{p}.ssm_alpha.weight": (c.ssm_n_v_heads, c.hidden),
        f"{p}.ssm_norm.weight": (c.ssm_state_size,),
        f"{p}.ssm_out.weight": (c.hidden, value_dim),
    }


def _qwen35(c: ModelConfig) -> dict[str, Shape]:
    if len(c.recurrent_layers) != c.n_layer:
        raise ValueError(f"qwen35 config needs recurrent_layers for {c.n_layer} layers")
    shapes = _embeddings(c)
    for il, recurrent in enumerate(c.recurrent_layers):
        p = f"blk.{il}"
        shapes[f"{p}.attn_norm.weight"] = (c.hidden,)
        if recurrent:
            shapes.update(_gated_deltanet(p, c))
        else:
            shapes.update(_attention(p, c, q_rows=2 * c.n_head * c.head_dim))
        shapes[f"{p}.post_attention_norm.weight"] = (c.hidden,)
        shapes.update(_ffn(p, c))
    shapes.update(_head(c))
    return shapes


def _dense(c: ModelConfig) -> dict[str, Shape]:
    shapes = _embeddings(c)
    for il in range(c.n_layer):
        p = f"blk.{il}"
        shapes[f"{p}.attn_norm.weight"] = (c.hidden,)
        shapes.update(_attention(p, c, q_rows=c.n_head * c.head_dim))
        shapes[f"{p}.ffn_norm.weight"] = (c.hidden,)
        shapes.update(_ffn(p, c))
    shapes.update(_head(c))
    return shapes


def _dflash(c: ModelConfig) -> dict[str, Shape]:
    if not c.target_layers:
        raise ValueError("dflash config needs target_layers")
    shapes: dict[str, Shape] = {
        "fc.weight": (c.hidden, len(c.target_layers) * c.hidden),
        "enc.output_norm.weight": (c.hidden,),
    }
    for il in range(c.n_layer):
        p = f"blk.{il}"
        shapes[f"{p}.attn_norm.weight"] = (c.hidden,)
        shapes.update(_attention(p, c, q_rows=c.n_head * c.head_dim))
        shapes[f"{p}.ffn_norm.weight"] = (c.hidden,)
        shapes.update(_ffn(p, c))
    shapes["output_norm.weight"] = (c.hidden,)
    return shapes
