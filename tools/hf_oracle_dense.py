#!/usr/bin/env python3
"""Transformers oracle for the dense qwen2 / qwen3 models: reference logits of tiny random
`Qwen2ForCausalLM` / `Qwen3ForCausalLM` models, saved as small .npz fixtures for
tests/models/test_dense.py.

Each named config (CONFIGS) is a transformers config plus a seed. The weights come from
`random_state_dict(name)` (numpy, one stream per tensor), and `write_gguf(name, path)`
converts them to llama.cpp's tensor names and writes the GGUF with luce.gguf.writer, so a
test rebuilds the very same model without torch and without a committed .gguf.

Per config the fixture holds (V = vocab, H = hidden, N = N_TOKENS):
  config_json, seed, tokens [N] int32
  prefill_logits [N, V] f32       one forward over all N tokens
  incr_prompt_len, incr_logits [1 + STEPS, V] f32
                                  prefill tokens[:incr_prompt_len] with a cache (its last row
                                  first), then STEPS cached single-token steps on the next tokens
  capture_layers [C] int32, captured [C, N, H] f32
                                  outputs of those decoder layers (residual stream)
  versions (torch / transformers)

Usage: python3 tools/hf_oracle_dense.py [--out tests/fixtures/dense] [--gguf DIR] [NAME ...]
Needs torch and transformers for the logits (oracle only; luce never imports them); the
weight and GGUF functions need only numpy.
"""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from luce.testing.oracle_cli import captured_layer_outputs, fixture_main  # noqa: E402

N_TOKENS = 37             # crosses two KV page boundaries (16, 32)
INCR_PROMPT_LEN = 13
INCR_STEPS = 8            # positions 13..20: the decode steps cross the page boundary at 16


def _rope(theta: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta}


CONFIGS: dict[str, dict] = {
    # GQA 4/2, query width 128 != hidden 64, q/k norms, separate LM head
    "qwen3_gqa": {"arch": "qwen3", "seed": 5, "capture_layers": [0, 2], "hf": dict(
        vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        rope_parameters=_rope(1e6), tie_word_embeddings=False)},
    # MQA 3/1, odd hidden 40, head_dim 16, eps 1e-5, theta 1e4, tied embeddings
    "qwen3_mqa_tied": {"arch": "qwen3", "seed": 6, "capture_layers": [1], "hf": dict(
        vocab_size=100, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5,
        rope_parameters=_rope(1e4), tie_word_embeddings=True)},
    # q/k/v biases, 3 query heads / 1 KV head x 32, separate LM head
    "qwen2_bias": {"arch": "qwen2", "seed": 7, "capture_layers": [0, 2], "hf": dict(
        vocab_size=160, hidden_size=96, intermediate_size=120, num_hidden_layers=3,
        num_attention_heads=3, num_key_value_heads=1, rms_norm_eps=1e-6,
        rope_parameters=_rope(1e6), tie_word_embeddings=False)},
    # GQA 6/2 x 8, tied embeddings (like Qwen2.5 0.5B/1.5B upstream), theta 1e4
    "qwen2_tied": {"arch": "qwen2", "seed": 8, "capture_layers": [1], "hf": dict(
        vocab_size=100, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-6,
        rope_parameters=_rope(1e4), tie_word_embeddings=True)},
}


def head_dim_of(hf: dict) -> int:
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def hf_tensor_shapes(arch: str, hf: dict) -> dict[str, tuple[int, ...]]:
    """transformers parameter name -> shape for a Qwen2/Qwen3 causal LM."""
    h, f, d = hf["hidden_size"], hf["intermediate_size"], head_dim_of(hf)
    q, kv = hf["num_attention_heads"] * d, hf["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (hf["vocab_size"], h)}
    for il in range(hf["num_hidden_layers"]):
        p = f"model.layers.{il}."
        shapes[p + "input_layernorm.weight"] = (h,)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes[p + f"self_attn.{name}.weight"] = (rows, h)
            if arch == "qwen2":
                shapes[p + f"self_attn.{name}.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if arch == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (f, h)
        shapes[p + "mlp.up_proj.weight"] = (f, h)
        shapes[p + "mlp.down_proj.weight"] = (h, f)
    shapes["model.norm.weight"] = (h,)
    if not hf.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (hf["vocab_size"], h)
    return shapes


def random_state_dict(name: str) -> dict[str, np.ndarray]:
    """Deterministic f32 weights of CONFIGS[name]: linear N(0, 1/fan_in), embeddings N(0, 1),
    norms 1 + N(0, 0.1^2), biases N(0, 0.5^2); one numpy stream per tensor."""
    spec = CONFIGS[name]
    out = {}
    for tname, shape in hf_tensor_shapes(spec["arch"], spec["hf"]).items():
        rng = np.random.default_rng([spec["seed"], zlib.crc32(tname.encode())])
        x = rng.standard_normal(shape)
        if tname.endswith("norm.weight"):
            x = 1.0 + 0.1 * x
        elif tname.endswith(".bias"):
            x = 0.5 * x
        elif tname != "model.embed_tokens.weight":
            x = x / np.sqrt(shape[-1])
        out[tname] = x.astype(np.float32)
    return out


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    """transformers name -> llama.cpp GGUF name (qwen2/qwen3: no permutation, NEOX rotary)."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model, layers, il, rest
    if parts[:2] != ["model", "layers"] or parts[3] not in _LAYER_NAMES:
        raise KeyError(f"no GGUF name for transformers tensor {hf_name!r}")
    return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"


def model_config(name: str):
    """The luce ModelConfig the converted GGUF of CONFIGS[name] carries."""
    from luce.gguf.config import ModelConfig

    spec = CONFIGS[name]
    hf, d = spec["hf"], head_dim_of(spec["hf"])
    return ModelConfig(
        arch=spec["arch"], n_layer=hf["num_hidden_layers"], hidden=hf["hidden_size"],
        ffn=hf["intermediate_size"], n_head=hf["num_attention_heads"],
        n_head_kv=hf["num_key_value_heads"], head_dim=d, vocab=hf["vocab_size"],
        rms_eps=float(np.float32(hf["rms_norm_eps"])), rope_theta=hf["rope_parameters"]["rope_theta"],
        rope_dim=d, context_length=hf.get("max_position_embeddings", 4096),
        qkv_bias=spec["arch"] == "qwen2", qk_norm=spec["arch"] == "qwen3",
        tied_embeddings=hf.get("tie_word_embeddings", False))


def write_gguf(name: str, path: str | Path, quant_mix: str = "f32") -> Path:
    """Write CONFIGS[name]'s random model as a GGUF (llama.cpp names) at `path`."""
    from luce.gguf.writer import write_model

    tensors = {gguf_name(k): v for k, v in random_state_dict(name).items()}
    write_model(path, model_config(name), tensors, quant_mix=quant_mix,
                extra_metadata={"general.name": f"luce-oracle-{name}"})
    return Path(path)


def oracle_tokens(name: str, n: int = N_TOKENS) -> np.ndarray:
    """The token ids of CONFIGS[name]'s fixture: [n] int32."""
    spec = CONFIGS[name]
    return np.random.default_rng([spec["seed"], 7]).integers(0, spec["hf"]["vocab_size"], n).astype(np.int32)


def build_hf_model(name: str):
    """Qwen2/Qwen3ForCausalLM (float32, eval, eager attention) with the random weights."""
    import torch
    import transformers

    spec = CONFIGS[name]
    prefix = "Qwen2" if spec["arch"] == "qwen2" else "Qwen3"
    config = getattr(transformers, prefix + "Config")(**spec["hf"])
    config._attn_implementation = "eager"
    model = getattr(transformers, prefix + "ForCausalLM")(config).eval()
    state = {k: torch.from_numpy(v) for k, v in random_state_dict(name).items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model


def _logits(model, ids, cache=None):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None], cache=cache,
                    use_cache=cache is not None)
    new_cache = getattr(out, "cache", None)
    return out.logits[0].float().numpy(), new_cache if new_cache is not None else out.past_key_values


def run_oracle(name: str) -> dict[str, np.ndarray]:
    """Compute the fixture arrays of CONFIGS[name] with transformers (see module doc)."""
    import torch
    import transformers
    from transformers import DynamicCache

    spec = CONFIGS[name]
    model = build_hf_model(name)
    tokens = oracle_tokens(name)
    layers = spec["capture_layers"]
    with captured_layer_outputs(model, layers) as captured:
        prefill, _ = _logits(model, tokens)

    cache = DynamicCache(config=model.config)
    rows, cache = _logits(model, tokens[:INCR_PROMPT_LEN], cache)
    incr = [rows[-1]]
    for i in range(INCR_PROMPT_LEN, INCR_PROMPT_LEN + INCR_STEPS):
        rows, cache = _logits(model, tokens[i:i + 1], cache)
        incr.append(rows[-1])
    # the cached path must agree with the full forward, or the cache was not used
    want = prefill[INCR_PROMPT_LEN - 1:INCR_PROMPT_LEN + INCR_STEPS]
    if not np.allclose(np.stack(incr), want, rtol=1e-4, atol=1e-4):
        raise RuntimeError(f"{name}: transformers' cached decode disagrees with its full forward")
    return {
        "config_json": np.array(json.dumps(spec, sort_keys=True)),
        "seed": np.array(spec["seed"], dtype=np.int64),
        "tokens": tokens,
        "prefill_logits": prefill.astype(np.float32),
        "incr_prompt_len": np.array(INCR_PROMPT_LEN, dtype=np.int32),
        "incr_logits": np.stack(incr).astype(np.float32),
        "capture_layers": np.array(layers, dtype=np.int32),
        "captured": np.stack([captured[il] for il in layers]).astype(np.float32),
        "versions": np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    }


def main(argv: list[str] | None = None) -> int:
    return fixture_main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS,
                        default_out=ROOT / "tests" / "fixtures" / "dense", run_oracle=run_oracle,
                        write_gguf=write_gguf)


if __name__ == "__main__":
    sys.exit(main())
