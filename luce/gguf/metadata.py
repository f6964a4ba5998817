"""GGUF metadata -> ModelConfig, and the tensor layout each architecture must have.

Keys are read as llama.cpp writes them (`{arch}.block_count`, `{arch}.ssm.state_size`, ...;
see src/llama-arch.cpp and conversion/qwen.py). Shapes are in numpy order (reverse of ggml
`ne`): a projection from hidden to n outputs is [n, hidden].
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, NamedTuple

from gguf.constants import GGMLQuantizationType as Q

from luce.gguf.config import SUPPORTED_ARCHS, ModelConfig
from luce.gguf.errors import (GGUFError, MissingKeyError, MissingTensorError, TensorShapeError,
                              UnsupportedArchError, UnsupportedQuantError)

_REQUIRED = object()


def supported_qtypes() -> tuple[Q, ...]:
    """The tensor types luce can compute with (luce.gguf.quants.SUPPORTED)."""
    from luce.gguf import quants  # lazy: the codecs are only needed once a model is checked

    return tuple(quants.SUPPORTED)


def same_shape(expected: tuple, found: tuple) -> bool:
    """Shapes equal up to leading 1s (ggml's trailing unit dims); None in expected = any."""
    def strip(s: tuple) -> tuple:
        s = tuple(s)
        while len(s) > 1 and s[0] == 1:
            s = s[1:]
        return s
    e, f = strip(expected), strip(found)
    return len(e) == len(f) and all(x is None or x == y for x, y in zip(e, f))


class _Keys:
    """Typed access to `{arch}.*` metadata with MissingKeyError / GGUFError on bad values."""

    def __init__(self, metadata: dict, arch: str, path: Path):
        self.md, self.arch, self.path = metadata, arch, path

    def raw(self, key: str, default=_REQUIRED):
        if key in self.md:
            return self.md[key]
        if default is _REQUIRED:
            raise MissingKeyError("required metadata key is missing", file=self.path, key=key,
                                  expected=f"the key (needed for arch '{self.arch}')",
                                  found="no such key")
        return default

    def bad(self, key: str, expected: str, found: object) -> GGUFError:
        return GGUFError("invalid metadata value", file=self.path, key=key,
                         expected=expected, found=found)

    def integer(self, suffix: str, default=_REQUIRED, *, minimum: int = 1,
                full_key: bool = False) -> int:
        """An integer >= minimum; a per-layer array is accepted when all entries agree."""
        key = suffix if full_key else f"{self.arch}.{suffix}"
        if key not in self.md and default is not _REQUIRED:
            return default
        v = self.raw(key)
        if isinstance(v, list) and v and all(x == v[0] for x in v):
            v = v[0]
        if isinstance(v, list):
            raise self.bad(key, "one value for every layer", v)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.bad(key, f"an integer >= {minimum}", v)
        return v

    def number(self, suffix: str, default=_REQUIRED) -> float:
        key = f"{self.arch}.{suffix}"
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise self.bad(key, "a positive number", v)
        return float(v)  # a FLOAT32 key keeps its exact value: 1e-6 reads 9.99999997e-07

    def integers(self, suffix: str, default=_REQUIRED) -> tuple[int, ...]:
        key = f"{self.arch}.{suffix}"
        v = self.raw(key, default)
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
            raise self.bad(key, "an array of integers", v)
        return tuple(v)


def parse_config(metadata: dict, tensors: dict, path: Path) -> ModelConfig:
    """ModelConfig from metadata (plus tensor presence: vocab, tied head, q/k/v biases)."""
    if "general.architecture" not in metadata:
        raise MissingKeyError("required metadata key is missing", file=path,
                              key="general.architecture", expected="the model architecture",
                              found="no such key")
    arch = metadata["general.architecture"]
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedArchError("unsupported model architecture", file=path,
                                   key="general.architecture",
                                   expected=f"one of {', '.join(SUPPORTED_ARCHS)}", found=arch)
    k = _Keys(metadata, arch, path)
    n_layer_all = k.integer("block_count")
    nextn = k.integer("nextn_predict_layers", 0, minimum=0)
    if nextn >= n_layer_all:
        raise k.bad(f"{arch}.nextn_predict_layers", f"fewer than block_count={n_layer_all}", nextn)
    n_layer = n_layer_all - nextn  # MTP layers are appended after the trunk
    hidden = k.integer("embedding_length")
    n_head = k.integer("attention.head_count")
    n_head_kv = k.integer("attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise k.bad(f"{arch}.attention.head_count_kv", f"a divisor of head_count={n_head}",
                    n_head_kv)
    head_dim = k.integer("attention.key_length", hidden // n_head)
    if k.integer("attention.value_length", head_dim) != head_dim:
        raise k.bad(f"{arch}.attention.value_length", f"key_length={head_dim}",
                    metadata[f"{arch}.attention.value_length"])
    rope_dim = k.integer("rope.dimension_count", head_dim)
    if rope_dim > head_dim or rope_dim % 2:
        raise k.bad(f"{arch}.rope.dimension_count", f"an even number <= head_dim={head_dim}",
                    rope_dim)
    fields = dict(
        arch=arch, n_layer=n_layer, hidden=hidden, ffn=k.integer("feed_forward_length"),
        n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        vocab=_vocab(metadata, tensors, k), rms_eps=k.number("attention.layer_norm_rms_epsilon"),
        rope_theta=k.number("rope.freq_base", 10000.0), rope_dim=rope_dim,
        context_length=k.integer("context_length"),
        rope_sections=k.integers("rope.dimension_sections", [] if arch != "qwen35" else _REQUIRED),
        qk_norm=arch in ("qwen3", "qwen35", "dflash"),
        tied_embeddings="output.weight" not in tensors,
        extra=_extra(metadata, arch, n_layer_all, nextn),
    )
    if arch == "qwen35":
        fields.update(_qwen35_fields(k, n_layer, n_layer_all))
    if arch == "dflash":
        fields.update(_dflash_fields(k))
    first_attn = next((i for i, r in enumerate(fields.get("recurrent_layers", ())) if not r), 0)
    fields["qkv_bias"] = f"blk.{first_attn}.attn_q.bias" in tensors
    return ModelConfig(**fields)


def _vocab(metadata: dict, tensors: dict, k: _Keys) -> int:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    if "token_embd.weight" in tensors:
        return tensors["token_embd.weight"].shape[0]
    return k.integer("vocab_size", 0, minimum=0)


def _qwen35_fields(k: _Keys, n_layer: int, n_layer_all: int) -> dict:
    key = f"{k.arch}.attention.recurrent_layers"
    if key in k.md:  # explicit per-layer kinds win over the interval
        kinds = k.md[key]
        if not isinstance(kinds, list) or len(kinds) < n_layer or \
                any(not isinstance(x, (bool, int)) for x in kinds):
            raise k.bad(key, f"{n_layer_all} booleans (one per layer)", kinds)
        recurrent = tuple(bool(x) for x in kinds[:n_layer])
    else:
        interval = k.integer("full_attention_interval", 4)  # llama.cpp's default
        recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    state, n_k = k.integer("ssm.state_size"), k.integer("ssm.group_count")
    n_v = k.integer("ssm.time_step_rank")
    inner = k.integer("ssm.inner_size")
    if n_v % n_k:
        raise k.bad(f"{k.arch}.ssm.time_step_rank", f"a multiple of ssm.group_count={n_k}", n_v)
    if inner != n_v * state:
        raise k.bad(f"{k.arch}.ssm.inner_size", f"time_step_rank*state_size={n_v * state}", inner)
    return dict(recurrent_layers=recurrent, ssm_conv_kernel=k.integer("ssm.conv_kernel"),
                ssm_state_size=state, ssm_n_k_heads=n_k, ssm_n_v_heads=n_v, ssm_inner=inner)


def _dflash_fields(k: _Keys) -> dict:
    stored = k.integers("target_layers")
    if not stored or min(stored) < 1:
        raise k.bad(f"{k.arch}.target_layers",
                    "a non-empty array of hidden-state indices >= 1 (layer id + 1)", list(stored))
    return dict(target_layers=tuple(i - 1 for i in stored),  # HF hidden-state index -> layer id
                block_size=k.integer("block_size", 16),
                mask_token_id=k.integer("tokenizer.ggml.mask_token_id", -1, minimum=0,
                                        full_key=True))


_EXTRA_KEYS = {  # {arch}.<suffix> -> extra[name], kept when present
    "attention.sliding_window": "sliding_window",
    "attention.sliding_window_pattern": "swa_layers",
    "attention.causal": "causal",
    "conv_kernel_size": "dflash_conv_kernel", "conv_group_size": "dflash_conv_group",
    "selector_rank": "dflash_selector_rank", "selector_top_k": "dflash_selector_top_k",
}


def _extra(metadata: dict, arch: str, n_layer_all: int, nextn: int) -> dict:
    extra = {"n_layer_all": n_layer_all, "nextn_layers": nextn}
    for suffix, name in _EXTRA_KEYS.items():
        if f"{arch}.{suffix}" in metadata:
            extra[name] = metadata[f"{arch}.{suffix}"]
    for key in ("general.name", "general.file_type"):
        if key in metadata:
            extra[key.split(".")[1]] = metadata[key]
    return extra


class TensorSpec(NamedTuple):
    name: str
    shape: tuple  # numpy order; None = any size
    formula: str  # how the shape follows from the config, e.g. "[n_head*head_dim, hidden]"
    required: bool = True


def expected_tensors(cfg: ModelConfig) -> Iterator[TensorSpec]:
    """Every tensor the model code reads, with its expected numpy-order shape (lazily, so a
    corrupt block_count fails at the first missing layer instead of building a huge list)."""
    H, F, hd = cfg.hidden, cfg.ffn, cfg.head_dim
    q, kv = cfg.n_head * hd, cfg.n_head_kv * hd
    V = cfg.vocab or None
    dflash = cfg.arch == "dflash"
    yield TensorSpec("token_embd.weight", (V, H), "[vocab, hidden]", not dflash)
    yield TensorSpec("output_norm.weight", (H,), "[hidden]")
    yield TensorSpec("output.weight", (None if dflash else V, H), "[vocab, hidden]", False)
    if dflash:
        n_t = len(cfg.target_layers)
        yield TensorSpec("fc.weight", (H, n_t * H), "[hidden, len(target_layers)*hidden]")
        yield TensorSpec("enc.output_norm.weight", (H,), "[hidden]")
    gdn = set(cfg.gdn_layers)
    gated = cfg.arch == "qwen35"  # attn_q packs query and output gate per head
    for il in range(cfg.n_layer):
        def t(suffix: str, shape: tuple, formula: str) -> TensorSpec:
            return TensorSpec(f"blk.{il}.{suffix}", shape, formula)
        yield t("attn_norm.weight", (H,), "[hidden]")
        if gated:
            yield t("post_attention_norm.weight", (H,), "[hidden]")
        else:
            yield t("ffn_norm.weight", (H,), "[hidden]")
        if il in gdn:
            yield from _gdn_specs(cfg, t)
        else:
            yield t("attn_q.weight", (2 * q if gated else q, H),
                    "[2*n_head*head_dim, hidden]" if gated else "[n_head*head_dim, hidden]")
            yield t("attn_k.weight", (kv, H), "[n_head_kv*head_dim, hidden]")
            yield t("attn_v.weight", (kv, H), "[n_head_kv*head_dim, hidden]")
            yield t("attn_output.weight", (H, q), "[hidden, n_head*head_dim]")
            if cfg.qkv_bias:
                yield t("attn_q.bias", (q,), "[n_head*head_dim]")
                yield t("attn_k.bias", (kv,), "[n_head_kv*head_dim]")
                yield t("attn_v.bias", (kv,), "[n_head_kv*head_dim]")
            if cfg.qk_norm:
                yield t("attn_q_norm.weight", (hd,), "[head_dim]")
                yield t("attn_k_norm.weight", (hd,), "[head_dim]")
        yield t("ffn_gate.weight", (F, H), "[ffn, hidden]")
        yield t("ffn_up.weight", (F, H), "[ffn, hidden]")
        yield t("ffn_down.weight", (H, F), "[hidden, ffn]")


def _gdn_specs(cfg: ModelConfig, t) -> list[TensorSpec]:
    H, ds, nv = cfg.hidden, cfg.ssm_state_size, cfg.ssm_n_v_heads
    key_dim, value_dim = cfg.ssm_n_k_heads * ds, nv * ds
    conv = 2 * key_dim + value_dim
    return [t("attn_qkv.weight", (conv, H), "[2*group_count*state_size + inner_size, hidden]"),
            t("attn_gate.weight", (value_dim, H), "[inner_size, hidden]"),
            t("ssm_conv1d.weight", (conv, cfg.ssm_conv_kernel),
              "[2*group_count*state_size + inner_size, conv_kernel]"),
            t("ssm_dt.bias", (nv,), "[time_step_rank]"),
            t("ssm_a", (nv,), "[time_step_rank]"),
            t("ssm_beta.weight", (nv, H), "[time_step_rank, hidden]"),
            t("ssm_alpha.weight", (nv, H), "[time_step_rank, hidden]"),
            t("ssm_norm.weight", (ds,), "[state_size]"),
            t("ssm_out.weight", (H, value_dim), "[hidden, inner_size]")]


def check_tensors(cfg: ModelConfig, tensors: dict, path: Path) -> None:
    """Raise MissingTensorError / TensorShapeError / UnsupportedQuantError for the first
    tensor the model needs that is absent, misshapen or of a type luce cannot compute with."""
    supported = supported_qtypes()
    for spec in expected_tensors(cfg):
        info = tensors.get(spec.name)
        want = f"{spec.formula} = [{', '.join('any' if d is None else str(d) for d in spec.shape)}]"
        if info is None:
            if spec.required:
                raise MissingTensorError(f"tensor required by arch '{cfg.arch}' is missing",
                                         file=path, key=spec.name, expected=want,
                                         found="no such tensor")
            continue
        if not same_shape(spec.shape, info.shape):
            raise TensorShapeError(f"tensor shape does not match the '{cfg.arch}.*' metadata",
                                   file=path, key=spec.name, expected=want, found=list(info.shape))
        if info.qtype not in supported:
            raise UnsupportedQuantError(
                "unsupported quant type", file=path, key=spec.name,
                expected=f"one of {', '.join(t.name for t in supported)}", found=info.qtype.name)
