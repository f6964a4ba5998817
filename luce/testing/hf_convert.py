"""Hugging Face Qwen3.5 text model (`Qwen3_5ForCausalLM`) -> llama.cpp `qwen35` GGUF tensors.

numpy only (no torch): the oracle tool (tools/hf_oracle.py) and the tests build the same
random weights from a seed with `random_qwen35_state_dict`, load them into transformers
(oracle) or convert them here and write a GGUF (luce), so fixtures need no .gguf file.

The conversion follows llama.cpp's converter (conversion/qwen.py: Qwen3_5TextModel,
_LinearAttentionVReorderBase, Qwen3NextModel), see MODELS.md:
- zero-centred norms (applied as 1 + w) are stored as w + 1; the GDN output norm as is;
- `attn_q` keeps transformers' per-head [query, gate] packing;
- `ssm_a` = -exp(A_log); conv1d [C, 1, K] -> [C, K];
- GDN value heads go from grouped order (value head kh*r + i for key head kh) to tiled
  order (i*n_k + kh) in every value-head-indexed tensor.
Tensors are numpy arrays in numpy order ([out, in] for projections), float32.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from luce.gguf.config import ModelConfig


def hf_layer_types(hf: dict) -> list[str]:
    """transformers' per-layer kinds: 'linear_attention' (GDN) or 'full_attention'."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    interval = hf.get("full_attention_interval", 4)
    return ["linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(hf["num_hidden_layers"])]


def rope_dim_of(hf: dict) -> int:
    factor = hf.get("rope_parameters", {}).get("partial_rotary_factor", 0.25)
    return int(hf["head_dim"] * factor)


def _gdn_dims(hf: dict) -> tuple[int, int, int, int]:
    """(n_k_heads, n_v_heads, key head dim, value head dim) of the GDN layers."""
    return (hf["linear_num_key_heads"], hf["linear_num_value_heads"],
            hf["linear_key_head_dim"], hf["linear_value_head_dim"])


def random_qwen35_state_dict(hf: dict, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights named as in transformers' Qwen3_5ForCausalLM state dict.

    Scales keep activations O(1) through the layers (projections ~ 1/sqrt(fan_in)); norm
    weights are random so the w+1 convention and the gated norm's weight are exercised.
    Each tensor has its own RNG stream from (seed, name), so the result is order-free."""
    H, F, V = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    hd, nh, nkv = hf["head_dim"], hf["num_attention_heads"], hf["num_key_value_heads"]
    nk, nv, dk, dv = _gdn_dims(hf)
    K = hf.get("linear_conv_kernel_dim", 4)
    conv = 2 * nk * dk + nv * dv

    def rng(name: str) -> np.random.Generator:
        return np.random.default_rng([seed, zlib.crc32(name.encode())])

    def proj(name: str, n_out: int, n_in: int) -> None:
        sd[name] = rng(name).standard_normal((n_out, n_in)) / np.sqrt(n_in)

    def centred_norm(name: str, n: int) -> None:
        sd[name] = 0.1 * rng(name).standard_normal(n)

    sd: dict[str, np.ndarray] = {}
    sd["model.embed_tokens.weight"] = rng("embed").standard_normal((V, H))
    for il, kind in enumerate(hf_layer_types(hf)):
        p = f"model.layers.{il}."
        centred_norm(p + "input_layernorm.weight", H)
        centred_norm(p + "post_attention_layernorm.weight", H)
        if kind == "full_attention":
            a = p + "self_attn."
            proj(a + "q_proj.weight", 2 * nh * hd, H)
            proj(a + "k_proj.weight", nkv * hd, H)
            proj(a + "v_proj.weight", nkv * hd, H)
            proj(a + "o_proj.weight", H, nh * hd)
            centred_norm(a + "q_norm.weight", hd)
            centred_norm(a + "k_norm.weight", hd)
        else:
            a = p + "linear_attn."
            proj(a + "in_proj_qkv.weight", conv, H)
            proj(a + "in_proj_z.weight", nv * dv, H)
            proj(a + "in_proj_b.weight", nv, H)
            proj(a + "in_proj_a.weight", nv, H)
            proj(a + "out_proj.weight", H, nv * dv)
            sd[a + "conv1d.weight"] = rng(a + "conv1d").standard_normal((conv, 1, K)) / np.sqrt(K)
            sd[a + "dt_bias"] = 0.5 * rng(a + "dt_bias").standard_normal(nv)
            sd[a + "A_log"] = np.log(rng(a + "A_log").uniform(0.1, 4.0, nv))
            sd[a + "norm.weight"] = 1.0 + 0.1 * rng(a + "norm").standard_normal(dv)
        proj(p + "mlp.gate_proj.weight", F, H)
        proj(p + "mlp.up_proj.weight", F, H)
        proj(p + "mlp.down_proj.weight", H, F)
    centred_norm("model.norm.weight", H)
    if hf.get("tie_word_embeddings", False):
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    else:
        proj("lm_head.weight", V, H)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def grouped_to_tiled(x: np.ndarray, axis: int, n_k_heads: int, n_v_heads: int,
                     head_dim: int) -> np.ndarray:
    """Reorder value heads along `axis` (length n_v_heads*head_dim) from grouped order
    (head kh*r + i) to tiled order (head i*n_k_heads + kh), r = n_v_heads // n_k_heads."""
    r = n_v_heads // n_k_heads
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(n_k_heads, r, head_dim, *rest).swapaxes(0, 1).reshape(n_v_heads * head_dim, *rest)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


def _convert_gdn(sd: dict, a: str, hf: dict) -> dict[str, np.ndarray]:
    nk, nv, dk, dv = _gdn_dims(hf)

    def tiled(x: np.ndarray, axis: int, head_dim: int) -> np.ndarray:
        return grouped_to_tiled(x, axis, nk, nv, head_dim)  # identity when nv == nk

    qk = 2 * nk * dk
    qkv, conv = sd[a + "in_proj_qkv.weight"], sd[a + "conv1d.weight"][:, 0, :]
    return {
        "attn_qkv.weight": np.concatenate([qkv[:qk], tiled(qkv[qk:], 0, dv)]),
        "attn_gate.weight": tiled(sd[a + "in_proj_z.weight"], 0, dv),
        "ssm_conv1d.weight": np.concatenate([conv[:qk], tiled(conv[qk:], 0, dv)]),
        "ssm_dt.bias": tiled(sd[a + "dt_bias"], 0, 1),
        "ssm_a": tiled(-np.exp(sd[a + "A_log"].astype(np.float64)), 0, 1),
        "ssm_beta.weight": tiled(sd[a + "in_proj_b.weight"], 0, 1),
        "ssm_alpha.weight": tiled(sd[a + "in_proj_a.weight"], 0, 1),
        "ssm_norm.weight": sd[a + "norm.weight"],
        "ssm_out.weight": tiled(sd[a + "out_proj.weight"], 1, dv),
    }


def convert_qwen35_state_dict(sd: dict[str, np.ndarray], hf: dict) -> dict[str, np.ndarray]:
    """transformers state dict (numpy) -> {GGUF tensor name: f32 array in numpy order}."""
    def plus_one(name: str) -> np.ndarray:
        return sd[name].astype(np.float64) + 1.0

    out = {"token_embd.weight": sd["model.embed_tokens.weight"],
           "output_norm.weight": plus_one("model.norm.weight")}
    if not hf.get("tie_word_embeddings", False):
        out["output.weight"] = sd["lm_head.weight"]
    for il, kind in enumerate(hf_layer_types(hf)):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        out[b + "attn_norm.weight"] = plus_one(p + "input_layernorm.weight")
        out[b + "post_attention_norm.weight"] = plus_one(p + "post_attention_layernorm.weight")
        if kind == "full_attention":
            a = p + "self_attn."
            out[b + "attn_q.weight"] = sd[a + "q_proj.weight"]
            out[b + "attn_k.weight"] = sd[a + "k_proj.weight"]
            out[b + "attn_v.weight"] = sd[a + "v_proj.weight"]
            out[b + "attn_output.weight"] = sd[a + "o_proj.weight"]
            out[b + "attn_q_norm.weight"] = plus_one(a + "q_norm.weight")
            out[b + "attn_k_norm.weight"] = plus_one(a + "k_norm.weight")
        else:
            for name, t in _convert_gdn(sd, p + "linear_attn.", hf).items():
                out[b + name] = t
        out[b + "ffn_gate.weight"] = sd[p + "mlp.gate_proj.weight"]
        out[b + "ffn_up.weight"] = sd[p + "mlp.up_proj.weight"]
        out[b + "ffn_down.weight"] = sd[p + "mlp.down_proj.weight"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def qwen35_model_config(hf: dict) -> ModelConfig:
    """The luce ModelConfig a converted GGUF of this transformers config carries."""
    nk, nv, dk, dv = _gdn_dims(hf)
    if dk != dv:
        raise ValueError(f"qwen35 GGUF needs linear_key_head_dim == linear_value_head_dim, got {dk}, {dv}")
    rope = hf.get("rope_parameters", {})
    sections = tuple(rope.get("mrope_section", (11, 11, 10)))
    return ModelConfig(
        arch="qwen35", n_layer=hf["num_hidden_layers"], hidden=hf["hidden_size"],
        ffn=hf["intermediate_size"], n_head=hf["num_attention_heads"],
        n_head_kv=hf["num_key_value_heads"], head_dim=hf["head_dim"], vocab=hf["vocab_size"],
        rms_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=rope.get("rope_theta", 10000.0),
        rope_dim=rope_dim_of(hf), context_length=hf.get("max_position_embeddings", 4096),
        rope_sections=(sections + (0, 0, 0, 0))[:4], qk_norm=True,
        tied_embeddings=hf.get("tie_word_embeddings", False),
        recurrent_layers=tuple(t == "linear_attention" for t in hf_layer_types(hf)),
        ssm_conv_kernel=hf.get("linear_conv_kernel_dim", 4), ssm_state_size=dk,
        ssm_n_k_heads=nk, ssm_n_v_heads=nv, ssm_inner=nv * dv)


def write_qwen35_gguf(path: str | Path, hf: dict, seed: int, quant_mix: str = "f32",
                      tokenizer: dict | None = None) -> Path:
    """Write the GGUF of the random model (hf config, seed) to `path`; returns it.

    tokenizer: GGUF tokenizer metadata (e.g. luce.testing.tiny_tokenizer); its token count
    must equal the config's vocab_size, since the reader takes the vocab from it."""
    from luce.gguf.writer import write_model

    if tokenizer is not None and len(tokenizer.get("tokenizer.ggml.tokens", ())) != hf["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tokenizer.get('tokenizer.ggml.tokens', ()))} tokens, "
                         f"the model's vocab_size is {hf['vocab_size']}: they must match")
    tensors = convert_qwen35_state_dict(random_qwen35_state_dict(hf, seed), hf)
    write_model(path, qwen35_model_config(hf), tensors, quant_mix=quant_mix, tokenizer=tokenizer)
    return Path(path)
