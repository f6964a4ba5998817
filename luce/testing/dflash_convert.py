"""Reference DFlash draft weights (z-lab `dflash` package naming) -> llama.cpp `dflash` GGUF parts.

Three things live here, all about the reference draft's weight format:
- `tiny_draft_spec` / `reference_hf_config`: a small draft description and the transformers
  `Qwen3Config` fields (with `dflash_config`) that the reference `DFlashDraftModel` reads;
- `random_reference_state` / `random_target_head` / `random_qwen3_target_state`:
  deterministic random weights from a seed, drawn with numpy only, so a test can rebuild
  exactly what the torch oracle ran (the tiny Qwen3 target converts with
  `convert_qwen3_target`);
- `convert_reference_draft`: reference state dict + config -> GGUF tensor names, metadata
  and a `ModelConfig`, following llama.cpp's converter (`DFlashModel` in conversion/qwen.py).

Conventions (checked against llama.cpp src/models/dflash.cpp):
- `fc.weight` [hidden, n_target_layers * hidden]; `enc.output_norm.weight` is the reference
  `hidden_norm` (applied after fc); `output_norm.weight` is the draft's own final `norm`.
- Qwen3 RMSNorm weights multiply directly (no `1 + w` shift), so norms are stored as is.
- `dflash.target_layers` stores the HF hidden-state index (0-based layer id + 1).
- The draft has no token embedding and no LM head: it uses the target's.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from luce.gguf.config import ModelConfig

# reference per-layer name -> GGUF per-layer name
_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_TENSORS = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
}
# DFlash2 (grouped dynamic causal convolutions, candidate selector; llama.cpp names)
_DFLASH2_LAYER_TENSORS = {
    "attention_conv.base_kernel": "attn_conv_base",            # [2, K, hidden], no .weight
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
_DFLASH2_GLOBAL_TENSORS = {  # checkpoints store the codebooks without .weight
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
}
_DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def tiny_draft_spec(**overrides) -> dict:
    """A small draft description (plain dict, storable in a fixture). Keys:
    hidden, n_layer, n_head, n_head_kv, head_dim, ffn, vocab, block_size, target_layers
    (0-based), target_n_layer, mask_token_id, rope_theta, rms_eps, layer_types (list of
    'full_attention' | 'sliding_attention', or None), sliding_window (int or None), is_causal
    (None = the reference default), input_embedding_scale, output_multiplier,
    final_logit_softcapping (None = absent); DFlash2 when conv_kernel_size, conv_group_size,
    selector_rank and selector_top_k are set (else None)."""
    spec = dict(hidden=32, n_layer=2, n_head=4, n_head_kv=2, head_dim=8, ffn=64, vocab=96,
                block_size=4, target_layers=[0, 2], target_n_layer=4, mask_token_id=95,
                rope_theta=10000.0, rms_eps=1e-6, layer_types=None, sliding_window=None,
                is_causal=None, input_embedding_scale=None, output_multiplier=None,
                final_logit_softcapping=None, **{k: None for k in _DFLASH2_KEYS})
    unknown = set(overrides) - set(spec)
    if unknown:
        raise ValueError(f"unknown draft spec keys {sorted(unknown)}; valid keys: {sorted(spec)}")
    spec.update(overrides)
    return spec


def reference_hf_config(spec: dict) -> dict:
    """spec -> the config.json fields of a reference DFlash draft (transformers Qwen3Config)."""
    cfg = dict(
        architectures=["DFlashDraftModel"], model_type="qwen3",
        hidden_size=spec["hidden"], num_hidden_layers=spec["n_layer"],
        num_attention_heads=spec["n_head"], num_key_value_heads=spec["n_head_kv"],
        head_dim=spec["head_dim"], intermediate_size=spec["ffn"], vocab_size=spec["vocab"],
        rms_norm_eps=spec["rms_eps"], hidden_act="silu", attention_bias=False,
        max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]},
        num_target_layers=spec["target_n_layer"],
        dflash_config={"block_size": spec["block_size"], "mask_token_id": spec["mask_token_id"],
                       "target_layer_ids": list(spec["target_layers"])},
    )
    if spec["layer_types"] is not None:
        cfg["layer_types"] = list(spec["layer_types"])
    if spec["sliding_window"] is not None:
        cfg["use_sliding_window"] = True
        cfg["sliding_window"] = spec["sliding_window"]
    if spec["is_causal"] is not None:
        cfg["is_causal"] = bool(spec["is_causal"])
    for name in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
        if spec[name] is not None:
            cfg["dflash_config"][name] = float(spec[name])
    if is_dflash2_spec(spec):
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["dflash_config"].update({k: int(spec[k]) for k in _DFLASH2_KEYS})
    return cfg


def is_dflash2_spec(spec: dict) -> bool:
    return spec.get("conv_kernel_size") is not None


def _normal(seed: int, name: str, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Per-tensor stream keyed by (seed, name): independent of the order tensors are drawn."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def random_reference_state(spec: dict, seed: int) -> dict[str, np.ndarray]:
    """Random reference-named draft weights: {'layers.0.self_attn.q_proj.weight': [out, in], ...}.
    Linear weights ~ N(0, 1/in); norm weights ~ 1 + N(0, 0.1^2) so every norm matters."""
    h, d, f = spec["hidden"], spec["head_dim"], spec["ffn"]
    shapes = {
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (spec["n_head"] * d, h),
        "self_attn.k_proj.weight": (spec["n_head_kv"] * d, h),
        "self_attn.v_proj.weight": (spec["n_head_kv"] * d, h),
        "self_attn.o_proj.weight": (h, spec["n_head"] * d),
        "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
        "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f),
    }
    named = {f"layers.{il}.{k}": s for il in range(spec["n_layer"]) for k, s in shapes.items()}
    named.update({"fc.weight": (h, len(spec["target_layers"]) * h),
                  "hidden_norm.weight": (h,), "norm.weight": (h,)})
    state = {}
    for name, shape in named.items():
        if len(shape) == 1:
            state[name] = 1.0 + _normal(seed, name, shape, 0.1)
        else:
            state[name] = _normal(seed, name, shape, 1.0 / np.sqrt(shape[1]))
    if is_dflash2_spec(spec):
        state.update(_random_dflash2_state(spec, seed))
    return state


def _random_dflash2_state(spec: dict, seed: int) -> dict[str, np.ndarray]:
    """Convolutions near identity (base tap 0 ~ 1) so the signal survives; codebooks ~ N(0, 1)."""
    h, k, rank = spec["hidden"], spec["conv_kernel_size"], spec["selector_rank"]
    n_proj = 2 * k * (h // spec["conv_group_size"])
    state = {}
    for il in range(spec["n_layer"]):
        for conv in ("attention_conv", "mlp_conv"):
            name = f"layers.{il}.{conv}"
            base = _normal(seed, name + ".base_kernel", (2, k, h), 0.3)
            base[:, 0] += 1.0
            state[name + ".base_kernel"] = base
            state[name + ".kernel_projection.weight"] = _normal(seed, name + ".proj", (n_proj, h), 0.3 / np.sqrt(h))
    for name in ("predecessor_codebook", "successor_codebook"):
        state[f"candidate_selector.{name}.weight"] = _normal(seed, name, (spec["vocab"], rank), 1.0)
    state["candidate_selector.hidden_projection.weight"] = _normal(seed, "selector_hidden", (rank, h), 1.0 / np.sqrt(h))
    return state


def random_target_head(spec: dict, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The target's token embedding [V, hidden] and LM head [V, hidden] the draft borrows."""
    shape = (spec["vocab"], spec["hidden"])
    return (_normal(seed, "target.embed_tokens.weight", shape, 1.0),
            _normal(seed, "target.lm_head.weight", shape, 1.0 / np.sqrt(spec["hidden"])))


def random_qwen3_target_state(spec: dict, seed: int) -> dict[str, np.ndarray]:
    """A tiny transformers Qwen3ForCausalLM target for the draft (state-dict names; same
    widths and heads as the draft, spec['target_n_layer'] layers; embedding and LM head from
    random_target_head)."""
    embed, head = random_target_head(spec, seed)
    layer = {k: v for k, v in random_reference_state(dict(spec, n_layer=1), seed).items()
             if k.startswith("layers.0.")}
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": head}
    for il in range(spec["target_n_layer"]):
        for name, value in layer.items():
            full = "model." + name.replace("layers.0.", f"layers.{il}.", 1)
            scale = 0.1 if value.ndim == 1 else 1.0 / np.sqrt(value.shape[1])
            state[full] = (1.0 if value.ndim == 1 else 0.0) + _normal(seed, "target." + full, value.shape, scale)
    state["model.norm.weight"] = 1.0 + _normal(seed, "target.model.norm.weight", (spec["hidden"],), 0.1)
    return state


def qwen3_target_config(spec: dict) -> ModelConfig:
    """ModelConfig (arch qwen3) of random_qwen3_target_state's model."""
    return ModelConfig(arch="qwen3", n_layer=spec["target_n_layer"], hidden=spec["hidden"], ffn=spec["ffn"],
                       n_head=spec["n_head"], n_head_kv=spec["n_head_kv"], head_dim=spec["head_dim"],
                       vocab=spec["vocab"], rms_eps=spec["rms_eps"], rope_theta=spec["rope_theta"],
                       rope_dim=spec["head_dim"], context_length=4096, qk_norm=True)


def convert_qwen3_target(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Qwen3ForCausalLM state dict -> llama.cpp `qwen3` GGUF tensors (Qwen3 norms multiply
    directly and rotary is NEOX, so nothing is shifted or permuted)."""
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output.weight": state["lm_head.weight"],
           "output_norm.weight": state["model.norm.weight"]}
    for name, value in state.items():
        parts = name.split(".", 3)
        if parts[:2] == ["model", "layers"]:
            out[f"blk.{parts[2]}.{_LAYER_TENSORS[parts[3]]}"] = value
    return out


@dataclass
class DFlashGGUFParts:
    """What a GGUF writer needs for a `dflash` file.
    tensors: GGUF name -> f32 array in numpy (row-major, [out, in]) order;
    metadata: full GGUF keys not covered by `config` (`dflash.*`, tokenizer mask id)."""
    config: ModelConfig
    tensors: dict[str, np.ndarray]
    metadata: dict[str, object] = field(default_factory=dict)


def _layer_attention_kinds(hf: dict) -> tuple[list[bool], int | None]:
    """Per layer: does it use the sliding window (the reference makes those layers causal)?
    Mirrors Qwen3Config: sliding_window is dropped unless use_sliding_window."""
    n = hf["num_hidden_layers"]
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    types = hf.get("layer_types")
    if types is None:
        start = hf.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= start else "full_attention"
                 for i in range(n)]
    sliding = [t == "sliding_attention" for t in types]
    if any(sliding) and window is None:
        raise ValueError("draft config marks sliding_attention layers but has no sliding_window "
                         "(set use_sliding_window and sliding_window)")
    return sliding, window if any(sliding) else None


def convert_reference_draft(state: dict[str, np.ndarray], hf: dict) -> DFlashGGUFParts:
    """Reference DFlash draft (state dict with or without a 'model.' prefix, config.json dict)
    -> GGUF parts (DFlash2 tensors and keys too, when the state has a candidate selector).
    Raises ValueError for features llama.cpp's `dflash` arch cannot express (attention
    biases, non-SiLU activation) or for missing / unexpected tensors."""
    state = {k.removeprefix("model."): np.asarray(v, dtype=np.float32) for k, v in state.items()}
    for name in ("predecessor_codebook", "successor_codebook"):
        if f"candidate_selector.{name}" in state:
            state[f"candidate_selector.{name}.weight"] = state.pop(f"candidate_selector.{name}")
    if hf.get("attention_bias", False):
        raise ValueError("DFlash draft with attention_bias=True: the dflash GGUF arch has no biases")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"DFlash draft hidden_act {hf['hidden_act']!r}: only 'silu' is supported")
    dcfg = hf.get("dflash_config", {})
    get = lambda name, default=None: dcfg.get(name, hf.get(name, default))  # noqa: E731
    n_layer = hf["num_hidden_layers"]
    target_layers = get("target_layer_ids")
    if not target_layers:
        raise ValueError("draft config has no dflash_config.target_layer_ids")
    mask_token_id = get("mask_token_id")
    if mask_token_id is None:
        raise ValueError("draft config has no dflash_config.mask_token_id")
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"draft rope_type {rope['rope_type']!r}: only default rotary is supported")
    rope_theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    hidden, n_head = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hidden // n_head

    tensors: dict[str, np.ndarray] = {}
    for ref_name, gguf_name in _GLOBAL_TENSORS.items():
        tensors[gguf_name] = _take(state, ref_name)
    for il in range(n_layer):
        for ref_name, gguf_name in _LAYER_TENSORS.items():
            tensors[f"blk.{il}.{gguf_name}"] = _take(state, f"layers.{il}.{ref_name}")
    dflash2 = "candidate_selector.hidden_projection.weight" in state
    if dflash2:
        missing = [k for k in _DFLASH2_KEYS if get(k) is None]
        if missing:
            raise ValueError(f"DFlash2 draft (candidate_selector tensors) without dflash_config {missing}")
        for ref_name, gguf_name in _DFLASH2_GLOBAL_TENSORS.items():
            tensors[gguf_name] = _take(state, ref_name.removesuffix(".weight") + ".weight")
        for il in range(n_layer):
            for ref_name, gguf_name in _DFLASH2_LAYER_TENSORS.items():
                tensors[f"blk.{il}.{gguf_name}"] = _take(state, f"layers.{il}.{ref_name}")
    leftover = sorted(k for k in state if not k.startswith(("embed_tokens.", "lm_head.")))
    if leftover:
        raise ValueError(f"unexpected draft tensors {leftover[:4]}: not part of a DFlash draft")
    expect_fc = (hidden, len(target_layers) * hidden)
    if tensors["fc.weight"].shape != expect_fc:
        raise ValueError(f"fc.weight shape {tensors['fc.weight'].shape}, expected {expect_fc}")

    sliding, window = _layer_attention_kinds(hf)
    config = ModelConfig(
        arch="dflash", n_layer=n_layer, hidden=hidden, ffn=hf["intermediate_size"],
        n_head=n_head, n_head_kv=hf.get("num_key_value_heads") or n_head, head_dim=head_dim,
        vocab=hf["vocab_size"], rms_eps=float(hf["rms_norm_eps"]), rope_theta=rope_theta,
        rope_dim=head_dim, context_length=hf.get("max_position_embeddings", 4096),
        qk_norm=True, target_layers=tuple(int(i) for i in target_layers),
        block_size=int(get("block_size", 16)), mask_token_id=int(mask_token_id))
    metadata: dict[str, object] = {
        "dflash.vocab_size": config.vocab,
        "dflash.block_size": config.block_size,
        "dflash.target_layers": [i + 1 for i in config.target_layers],
        "tokenizer.ggml.mask_token_id": config.mask_token_id,
    }
    if window is not None:
        metadata["dflash.attention.sliding_window"] = int(window)
        metadata["dflash.attention.sliding_window_pattern"] = sliding
    if hf.get("is_causal") is not None:
        metadata["dflash.attention.causal"] = bool(hf["is_causal"])
    for ref_key, gguf_key in (("output_multiplier", "dflash.logit_scale"),
                              ("input_embedding_scale", "dflash.embedding_scale")):
        if get(ref_key) is not None:
            metadata[gguf_key] = float(get(ref_key))
    if dflash2:
        metadata.update({f"dflash.{k}": int(get(k)) for k in _DFLASH2_KEYS})
    softcap = get("final_logit_softcapping")
    if softcap is not None and float(softcap) > 0:
        metadata["dflash.final_logit_softcapping"] = float(softcap)
    return DFlashGGUFParts(config=config, tensors=tensors, metadata=metadata)


def _take(state: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in state:
        raise ValueError(f"reference draft is missing tensor {name!r}")
    return state.pop(name)
