"""Deterministic tiny GGUF models (qwen35 hybrid, qwen2/qwen3 dense, DFlash draft) for tests.

Same seed, config and quant mix -> byte-identical file. Every model carries the tiny
tokenizer (`tiny_tokenizer.py`), so vocab = its token count (420) and every tiny model can
draft for every other.

Default sizes (odd-ish, so kernels meet head counts of 3 and widths that are not powers
of two; every row length is a multiple of 32, so q8_0/Q5_0 need no F16 fallback):
- qwen35: 4 layers (layer 3 full attention, interval 4), hidden 96, FFN 160; attention
  3 query heads / 1 KV head x 32, rotary on 8 dims, M-RoPE sections (2, 1, 1, 0);
  Gated DeltaNet 2 key heads / 4 value heads x 16 (value heads > key heads exercises the
  tiled head order), conv kernel 4 (128 conv channels).
- qwen3: 3 layers, hidden 96, FFN 160, 4 query / 2 KV heads x 32 (query width 128 != hidden).
- qwen2: 3 layers, hidden 96, FFN 160, 3 query / 1 KV head x 32, q/k/v biases.
- dflash: the target's hidden and FFN, 2 layers, 4 query / 2 KV heads x 32, block 4,
  target layers (0, 2), mask token <|mask|>.
With a 256-block mix ("q4_k_m", "iq4_xs") and no explicit `hidden`, `KQUANT_SIZES` apply
(hidden 256, FFN 512) so K/IQ types really occur; rows of 96 (attention output) and 64
(ssm_out) still fall back to Q5_0/Q8_0 as llama.cpp does.

Weights: linear N(0, 1/fan_in), embeddings N(0, 1), norms 1 + N(0, 0.1^2) (qwen35 stores
norms as w + 1, so this is transformers' zero-centred weight near 0), ssm_a = -U(1, 16)
(= -exp(A_log)), ssm_dt.bias = softplus^-1 of dt log-uniform in [1e-3, 1e-1] (Mamba's
init), conv1d N(0, 1/kernel), biases N(0, 0.1^2). Each tensor draws from its own stream
keyed by (seed, arch, name), so changing one size leaves unrelated tensors unchanged.
"""
from __future__ import annotations

import dataclasses
import os
import zlib

import numpy as np

from luce.gguf.config import ModelConfig
from luce.gguf.writer import write_model
from luce.testing.tensor_layout import tensor_shapes
from luce.testing.tiny_tokenizer import tiny_tokenizer_metadata

KQUANT_SIZES = {
    "qwen35": {"hidden": 256, "ffn": 512},
    "qwen3": {"hidden": 256, "ffn": 512},
    "qwen2": {"hidden": 256, "ffn": 512, "n_head": 8, "n_head_kv": 2},
}
_KQUANT_MIXES = ("q4_k_m", "iq4_xs")
_RMS_EPS = float(np.float32(1e-6))  # GGUF stores FLOAT32: keep configs equal after a round trip


def _tokenizer() -> dict[str, object]:
    return tiny_tokenizer_metadata()


def _vocab() -> int:
    return len(_tokenizer()["tokenizer.ggml.tokens"])


def _token_id(token: str) -> int:
    return _tokenizer()["tokenizer.ggml.tokens"].index(token)


def sizes_for_mix(arch: str, quant_mix: object, overrides: dict) -> dict:
    """overrides, plus KQUANT_SIZES when a 256-block mix is asked for without a hidden size."""
    if isinstance(quant_mix, str) and quant_mix.lower() in _KQUANT_MIXES and "hidden" not in overrides:
        return {**KQUANT_SIZES[arch], **overrides}
    return dict(overrides)


def _build(base: dict, overrides: dict) -> ModelConfig:
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ModelConfig)}
    if unknown:
        raise TypeError(f"unknown ModelConfig fields {sorted(unknown)}")
    return ModelConfig(**{**base, **overrides})


def tiny_qwen35_config(full_attention_interval: int = 4, **overrides) -> ModelConfig:
    """The tiny qwen35 config; `recurrent_layers` follows `full_attention_interval` and
    `ssm_inner` follows the GDN sizes unless given."""
    n_layer = overrides.get("n_layer", 4)
    n_v = overrides.get("ssm_n_v_heads", 4)
    state = overrides.get("ssm_state_size", 16)
    base = dict(
        arch="qwen35", n_layer=n_layer, hidden=96, ffn=160, n_head=3, n_head_kv=1, head_dim=32,
        vocab=_vocab(), rms_eps=_RMS_EPS, rope_theta=1e7, rope_dim=8, context_length=4096,
        rope_sections=(2, 1, 1, 0), qk_norm=True,
        recurrent_layers=tuple((il + 1) % full_attention_interval != 0 for il in range(n_layer)),
        ssm_conv_kernel=4, ssm_state_size=state, ssm_n_k_heads=2, ssm_n_v_heads=n_v,
        ssm_inner=n_v * state,
    )
    config = _build(base, overrides)
    if config.ssm_n_v_heads % config.ssm_n_k_heads:
        raise ValueError(f"ssm_n_v_heads {config.ssm_n_v_heads} must be a multiple of "
                         f"ssm_n_k_heads {config.ssm_n_k_heads}")
    if sum(config.rope_sections) * 2 != config.rope_dim:
        raise ValueError(f"rope_sections {config.rope_sections} must sum to rope_dim / 2 "
                         f"= {config.rope_dim // 2}")
    return config


def tiny_dense_config(arch: str = "qwen3", **overrides) -> ModelConfig:
    """The tiny qwen3 (q/k norm) or qwen2 (q/k/v bias; head_dim = hidden / n_head) config."""
    if arch == "qwen3":
        base = dict(n_head=4, n_head_kv=2, head_dim=32, qk_norm=True)
    elif arch == "qwen2":
        n_head = overrides.get("n_head", 3)
        base = dict(n_head=n_head, n_head_kv=1, head_dim=overrides.get("hidden", 96) // n_head, qkv_bias=True)
    else:
        raise ValueError(f"dense arch must be 'qwen3' or 'qwen2', got {arch!r}")
    base.update(arch=arch, n_layer=3, hidden=96, ffn=160, vocab=_vocab(), rms_eps=_RMS_EPS,
                rope_theta=1e6, context_length=4096)
    base["rope_dim"] = overrides.get("head_dim", base["head_dim"])
    config = _build(base, overrides)
    if arch == "qwen2" and config.n_head * config.head_dim != config.hidden:
        raise ValueError(f"qwen2 needs n_head * head_dim == hidden, got {config.n_head} * "
                         f"{config.head_dim} != {config.hidden}")
    return config


def tiny_dflash_config(target: ModelConfig, n_layer: int = 2, block_size: int = 4,
                       target_layers: tuple[int, ...] = (0, 2), **overrides) -> ModelConfig:
    """A DFlash draft for `target`: same hidden, FFN, vocab, rope theta; full NEOX rotary
    (degenerate M-RoPE sections (head_dim/2, 0, 0, 0) when the target uses M-RoPE, as the
    converter writes); captures the outputs of `target_layers` (0-based)."""
    layers = tuple(int(i) for i in target_layers)
    if not layers or list(layers) != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] < target.n_layer:
        raise ValueError(f"target_layers {target_layers} must be increasing layer ids of the "
                         f"{target.n_layer}-layer target")
    head_dim = overrides.get("head_dim", 32)
    base = dict(
        arch="dflash", n_layer=n_layer, hidden=target.hidden, ffn=target.ffn, n_head=4, n_head_kv=2,
        head_dim=head_dim, vocab=target.vocab, rms_eps=target.rms_eps, rope_theta=target.rope_theta,
        rope_dim=head_dim, context_length=target.context_length, qk_norm=True,
        tied_embeddings=True,  # no output.weight of its own (the reader's reading of that)
        rope_sections=(head_dim // 2, 0, 0, 0) if target.rope_sections else (),
        target_layers=layers, block_size=block_size,
        mask_token_id=_token_id("<|mask|>") if target.vocab == _vocab() else -1,
    )
    return _build(base, overrides)


def _stream(seed: int, arch: str, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(f"{arch}:{name}".encode())])


def _init(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("_norm.weight"):
        return 1.0 + 0.1 * rng.standard_normal(shape)
    if name.endswith(".ssm_a"):
        return -rng.uniform(1.0, 16.0, shape)
    if name.endswith("ssm_dt.bias"):
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
        return dt + np.log(-np.expm1(-dt))  # softplus^-1(dt)
    if name.endswith(".bias"):
        return 0.1 * rng.standard_normal(shape)
    if name == "token_embd.weight":
        return rng.standard_normal(shape)
    return rng.standard_normal(shape) / np.sqrt(shape[-1])  # linear and conv1d: 1/fan_in


def random_weights(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """name -> float32 tensor (numpy order) for every tensor of `config`, in file order."""
    return {name: _init(name, shape, _stream(seed, config.arch, name)).astype(np.float32)
            for name, shape in tensor_shapes(config).items()}


def write_tiny(path: str | os.PathLike, config: ModelConfig, seed: int = 0, quant_mix="f32") -> ModelConfig:
    """Write `config` with random weights and the tiny tokenizer; returns config."""
    if config.vocab != _vocab():
        raise ValueError(f"vocab {config.vocab} differs from the tiny tokenizer's {_vocab()} tokens; "
                         "tiny models keep vocab = tokenizer size")
    write_model(path, config, random_weights(config, seed), quant_mix, tokenizer=_tokenizer(),
                extra_metadata={"general.name": f"luce-tiny-{config.arch}"})
    return config


def make_qwen35(path: str | os.PathLike, seed: int = 0, quant_mix="f32", **config_overrides) -> ModelConfig:
    """Write a tiny qwen35 model (see module doc for sizes) and return its config."""
    config = tiny_qwen35_config(**sizes_for_mix("qwen35", quant_mix, config_overrides))
    return write_tiny(path, config, seed, quant_mix)


def make_dense(path: str | os.PathLike, arch: str = "qwen3", seed: int = 0, quant_mix="f32",
               **overrides) -> ModelConfig:
    """Write a tiny qwen3 or qwen2 model and return its config."""
    config = tiny_dense_config(arch, **sizes_for_mix(arch, quant_mix, overrides))
    return write_tiny(path, config, seed, quant_mix)


def make_dflash_draft(path: str | os.PathLike, target: ModelConfig, seed: int = 0, n_layer: int = 2,
                      block_size: int = 4, target_layers: tuple[int, ...] = (0, 2),
                      quant_mix="f32", **overrides) -> ModelConfig:
    """Write a tiny DFlash draft for `target` (a tiny model's config) and return its config
    (overrides: tiny_dflash_config's, e.g. head_dim=64 for the CUDA attention kernel)."""
    config = tiny_dflash_config(target, n_layer=n_layer, block_size=block_size, target_layers=target_layers,
                                **overrides)
    return write_tiny(path, config, seed, quant_mix)
