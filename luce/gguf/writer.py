"""Write GGUF files with the keys, tensor names and layouts llama.cpp's converter produces.

Used by tools (tiny test models, the transformers oracle) and tests; the runtime only reads.

- `write_gguf`: the low level: metadata dict plus float32 tensors, each with its GGML type.
- `config_metadata`: the `{arch}.*` keys for a `ModelConfig` (the inverse of the reader).
- `plan_tensor_types`: the GGML type of every tensor under a quant mix (llama.cpp's recipes).
- `write_model`: a whole model: config keys, tokenizer keys, tensors typed by a quant mix.

Tensors are given in numpy order (`[rows, row_length]`, row length = ggml ne[0]); the file
stores the reversed (ggml) order, as llama.cpp's converter does.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType

from luce.gguf.config import SUPPORTED_ARCHS, ModelConfig
from luce.gguf.quants import SUPPORTED, block_info, quantize

QType = GGMLQuantizationType

# Keys whose GGUF type llama.cpp fixes differently from the generic Python-type rule below.
_KNOWN_ARRAY_TYPES = {
    "tokenizer.ggml.token_type": GGUFValueType.INT32,
    "tokenizer.ggml.scores": GGUFValueType.FLOAT32,
}

_NUMPY_SCALAR_TYPES = {
    np.dtype(np.uint8): GGUFValueType.UINT8,
    np.dtype(np.int8): GGUFValueType.INT8,
    np.dtype(np.uint16): GGUFValueType.UINT16,
    np.dtype(np.int16): GGUFValueType.INT16,
    np.dtype(np.uint32): GGUFValueType.UINT32,
    np.dtype(np.int32): GGUFValueType.INT32,
    np.dtype(np.uint64): GGUFValueType.UINT64,
    np.dtype(np.int64): GGUFValueType.INT64,
    np.dtype(np.float32): GGUFValueType.FLOAT32,
    np.dtype(np.float64): GGUFValueType.FLOAT64,
    np.dtype(np.bool_): GGUFValueType.BOOL,
}


def _int_type(values: Sequence[int]) -> GGUFValueType:
    lo, hi = min(values), max(values)
    if lo >= 0:
        return GGUFValueType.UINT32 if hi < 2**32 else GGUFValueType.UINT64
    return GGUFValueType.INT32 if lo >= -(2**31) and hi < 2**31 else GGUFValueType.INT64


def _scalar_type(key: str, value: object) -> GGUFValueType:
    if isinstance(value, np.generic):
        if value.dtype not in _NUMPY_SCALAR_TYPES:
            raise TypeError(f"metadata {key!r}: numpy scalar of dtype {value.dtype} has no GGUF type")
        return _NUMPY_SCALAR_TYPES[value.dtype]
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return _int_type([value])
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    raise TypeError(f"metadata {key!r}: value of type {type(value).__name__} has no GGUF type "
                    "(use bool, int, float, str, a numpy scalar, or a list/array of those)")


def _array_type(key: str, items: list) -> GGUFValueType:
    """Element type of a metadata array. Python ints become INT32 (what gguf's `add_array`
    and hence llama.cpp's converter write: rope sections, target layers), widened to
    UINT32/INT64/UINT64 only when a value does not fit."""
    if key in _KNOWN_ARRAY_TYPES:
        return _KNOWN_ARRAY_TYPES[key]
    kinds = {_scalar_type(key, v) for v in items}
    if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        lo, hi = min(items), max(items)
        if -(2**31) <= lo and hi < 2**31:
            return GGUFValueType.INT32
        return _int_type(items)
    if len(kinds) != 1:
        raise TypeError(f"metadata {key!r}: array mixes element types {sorted(k.name for k in kinds)}")
    return kinds.pop()


def _add_metadata(writer: GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"metadata {key!r}: arrays must be 1-D, got shape {value.shape}")
        sub = _KNOWN_ARRAY_TYPES.get(key) or _NUMPY_SCALAR_TYPES.get(value.dtype)
        if sub is None:
            raise TypeError(f"metadata {key!r}: numpy array of dtype {value.dtype} has no GGUF type")
        value = value.tolist()
    elif isinstance(value, (list, tuple)):
        value = list(value)
        sub = _array_type(key, value) if value else None
    else:
        writer.add_key_value(key, value, _scalar_type(key, value))
        return
    if not value:
        raise ValueError(f"metadata {key!r}: empty arrays cannot be typed in GGUF; leave the key out")
    if sub == GGUFValueType.BOOL:
        value = [bool(v) for v in value]
    writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=sub)


def write_gguf(path: str | os.PathLike, arch: str, metadata: Mapping[str, object],
               tensors: Mapping[str, tuple[np.ndarray, QType]]) -> None:
    """Write one GGUF file.

    metadata: full key names -> value. Python int -> UINT32 (INT32 if negative, UINT64 or
      INT64 if it does not fit 32 bits), float -> FLOAT32, bool -> BOOL, str -> STRING,
      list/tuple -> ARRAY (int elements -> INT32 as llama.cpp writes arrays; token_type is
      INT32, scores FLOAT32), numpy scalars/1-D arrays keep their exact dtype.
      `general.architecture` is written from `arch` and must not be repeated.
    tensors: name -> (x float array in numpy order [..., row_length], GGML type); written in
      the given order, each encoded by luce.gguf.quants.quantize (types in its SUPPORTED).
      The row length must be a multiple of the type's block size.
    Same inputs give a byte-identical file.
    """
    if "general.architecture" in metadata:
        raise ValueError("metadata must not contain 'general.architecture': it is written from `arch`")
    writer = GGUFWriter(os.fspath(path), arch)
    for key, value in metadata.items():
        _add_metadata(writer, key, value)
    for name, (x, qtype) in tensors.items():
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise TypeError(f"tensor {name!r}: expected a float array, got dtype {x.dtype}")
        if x.ndim == 0 or x.size == 0:
            raise ValueError(f"tensor {name!r}: expected a non-empty array with at least one axis")
        if not np.isfinite(x).all():
            raise ValueError(f"tensor {name!r}: contains NaN or inf")
        qtype = QType(qtype)
        block = _block_size(qtype)
        if x.shape[-1] % block:
            raise ValueError(f"tensor {name!r}: row length {x.shape[-1]} is not a multiple of the "
                             f"{qtype.name} block ({block}); pick another type")
        # u8 [..., row bytes]: GGUFWriter derives the element shape from the byte shape
        writer.add_tensor(name, quantize(x.astype(np.float32), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _block_size(qtype: QType) -> int:
    if qtype not in SUPPORTED:
        raise ValueError(f"GGML type {qtype.name} is not one luce computes with; use one of "
                         f"{', '.join(t.name for t in SUPPORTED)}")
    return block_info(qtype)[0]


def config_metadata(config: ModelConfig) -> dict[str, object]:
    """The metadata keys llama.cpp's converter writes for `config` (and `luce.gguf.reader`
    parses back into an equal ModelConfig): `{arch}.*` plus, for dflash, the mask token id.

    Key lengths are written where the HF config carries `head_dim` (qwen3, qwen35, dflash)
    or where it differs from hidden // n_head; `rope.dimension_count` only where rotation is
    partial (qwen35 always, as its converter does); dflash `target_layers` are stored as
    0-based layer id + 1 (llama.cpp's convention), and dflash also gets `dflash.vocab_size`
    (llama.cpp's LLM_KV_VOCAB_SIZE; its converter relies on the tokenizer instead).
    """
    if config.arch not in SUPPORTED_ARCHS:
        raise ValueError(f"arch {config.arch!r} is not one of {SUPPORTED_ARCHS}")
    a = config.arch
    md: dict[str, object] = {
        f"{a}.block_count": config.n_layer,
        f"{a}.context_length": config.context_length,
        f"{a}.embedding_length": config.hidden,
        f"{a}.feed_forward_length": config.ffn,
        f"{a}.attention.head_count": config.n_head,
        f"{a}.attention.head_count_kv": config.n_head_kv,
    }
    if config.rope_sections:
        sections = list(config.rope_sections) + [0] * (4 - len(config.rope_sections))
        md[f"{a}.rope.dimension_sections"] = sections[:4]
    md[f"{a}.rope.freq_base"] = float(config.rope_theta)
    md[f"{a}.attention.layer_norm_rms_epsilon"] = float(config.rms_eps)
    if a != "qwen2" or config.head_dim * config.n_head != config.hidden:
        md[f"{a}.attention.key_length"] = config.head_dim
        md[f"{a}.attention.value_length"] = config.head_dim
    if a == "qwen35" or config.rope_dim != config.head_dim:
        md[f"{a}.rope.dimension_count"] = config.rope_dim
    if a == "qwen35":
        md.update(_qwen35_metadata(config))
    if a == "dflash":
        if not config.target_layers or config.block_size <= 0:
            raise ValueError("dflash config needs target_layers and block_size > 0")
        md[f"{a}.vocab_size"] = config.vocab  # no token_embd to infer it from (nor a tokenizer, maybe)
        md[f"{a}.block_size"] = config.block_size
        md[f"{a}.target_layers"] = [i + 1 for i in config.target_layers]
        if config.mask_token_id >= 0:
            md["tokenizer.ggml.mask_token_id"] = config.mask_token_id
    return md


def _qwen35_metadata(config: ModelConfig) -> dict[str, object]:
    a = config.arch
    if len(config.recurrent_layers) != config.n_layer:
        raise ValueError(f"qwen35 config needs recurrent_layers for all {config.n_layer} layers, "
                         f"got {len(config.recurrent_layers)}")
    if config.ssm_inner != config.ssm_n_v_heads * config.ssm_state_size:
        raise ValueError(f"ssm_inner {config.ssm_inner} != ssm_n_v_heads {config.ssm_n_v_heads} "
                         f"* ssm_state_size {config.ssm_state_size}")
    md: dict[str, object] = {
        f"{a}.ssm.conv_kernel": config.ssm_conv_kernel,
        f"{a}.ssm.state_size": config.ssm_state_size,
        f"{a}.ssm.group_count": config.ssm_n_k_heads,
        f"{a}.ssm.time_step_rank": config.ssm_n_v_heads,
        f"{a}.ssm.inner_size": config.ssm_inner,
        f"{a}.attention.recurrent_layers": [bool(r) for r in config.recurrent_layers],
    }
    interval = _full_attention_interval(config.recurrent_layers)
    if interval is not None:
        md[f"{a}.full_attention_interval"] = interval
    return md


def _full_attention_interval(recurrent: Sequence[bool]) -> int | None:
    """The k with layer il full attention iff (il + 1) % k == 0, if the pattern has one."""
    for k in range(1, len(recurrent) + 1):
        if all(bool(r) == ((il + 1) % k != 0) for il, r in enumerate(recurrent)):
            return k
    return None


# ---- quant mixes -------------------------------------------------------------------------

QUANT_MIXES = ("f32", "f16", "bf16", "q8_0", "q4_k_m", "iq4_xs")

_MIX_FILE_TYPES = {
    "f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0, "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M,
    "iq4_xs": LlamaFileType.MOSTLY_IQ4_XS,
}

# llama.cpp's tensor_type_fallback for a row length the type's block does not divide,
# restricted to the types luce decodes (llama.cpp uses Q5_1 for Q5_K and IQ4_NL for IQ4_XS).
_FALLBACK = {
    QType.Q4_K: QType.Q5_0, QType.Q5_K: QType.Q8_0, QType.Q6_K: QType.Q8_0,
    QType.IQ4_XS: QType.Q8_0, QType.Q8_0: QType.F16, QType.Q5_0: QType.F16,
}

_LAYER = re.compile(r"^blk\.(\d+)\.")


def is_quantizable(name: str, shape: Sequence[int]) -> bool:
    """llama.cpp quantizes only 2-D+ `*.weight` tensors that are not norms or ssm_conv1d;
    everything else (norms, biases, ssm_a, ssm_dt.bias, conv1d) stays F32 in every mix."""
    return (len(shape) >= 2 and name.endswith(".weight") and not name.endswith("_norm.weight")
            and "ssm_conv1d" not in name)


def fallback_type(qtype: QType, row_length: int) -> QType:
    """qtype, or the type llama.cpp falls back to when row_length is not a block multiple."""
    while row_length % _block_size(qtype):
        qtype = _FALLBACK.get(qtype, QType.F32)
    return qtype


def mix_file_type(quant_mix: object) -> int | None:
    """general.file_type for a named mix; None for custom (dict or callable) mixes."""
    if isinstance(quant_mix, str):
        return int(_MIX_FILE_TYPES[_mix_name(quant_mix)])
    return None


def _mix_name(quant_mix: str) -> str:
    name = quant_mix.lower()
    if name not in QUANT_MIXES:
        raise ValueError(f"unknown quant mix {quant_mix!r}: use one of {QUANT_MIXES}, "
                         "a dict name-regex -> type, or a callable (name, shape) -> type")
    return name


def _as_qtype(value: object) -> QType:
    if isinstance(value, str):
        try:
            return QType[value.upper()]
        except KeyError:
            raise ValueError(f"unknown GGML type name {value!r}") from None
    return QType(value)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _recipe_type(mix: str, name: str, config: ModelConfig, i_wv: int, n_wv: int, is_head: bool) -> QType:
    """llama.cpp's llama_tensor_get_type for ftype `mix` (no imatrix), before the fallback."""
    if mix in ("f32", "f16", "bf16", "q8_0"):
        return _as_qtype(mix)
    base = QType.Q4_K if mix == "q4_k_m" else QType.IQ4_XS
    layer = _LAYER.match(name)
    il = int(layer.group(1)) if layer else -1
    if is_head:
        return QType.Q6_K
    if "attn_v.weight" in name or "attn_qkv.weight" in name:
        if mix == "q4_k_m":
            return QType.Q6_K if _use_more_bits(i_wv, n_wv) else base
        return QType.Q5_K if config.n_head >= 4 * config.n_head_kv else base
    if "ffn_down" in name:
        if mix == "q4_k_m":
            return QType.Q6_K if _use_more_bits(il, config.n_layer) else base
        return QType.Q5_K if il < config.n_layer // 8 else base
    return base


def plan_tensor_types(config: ModelConfig, shapes: Mapping[str, Sequence[int]],
                      quant_mix: str | Mapping[str, object] | Callable = "f32") -> dict[str, QType]:
    """GGML type per tensor (shapes in numpy order, iterated in file order).

    quant_mix: "f32"; "f16"/"bf16"/"q8_0" (every quantizable weight); "q4_k_m" (Q4_K, with
    Q6_K for output, for attn_v/attn_qkv and ffn_down where llama.cpp's use_more_bits says
    so); "iq4_xs" (IQ4_XS, Q6_K output, Q5_K attn_v/attn_qkv when n_head >= 4 n_head_kv and
    ffn_down in the first n_layer/8 layers); a dict regex -> type (first `re.search` match
    in dict order; unmatched weights stay F32); or a callable (name, shape) -> type.
    Types may be GGMLQuantizationType or names ("q4_k"). Only `is_quantizable` tensors get
    the mix; the rest are F32. A row length the type's block does not divide falls back as
    llama.cpp does (Q4_K -> Q5_0, Q6_K/Q5_K/IQ4_XS -> Q8_0, 32-blocks -> F16).
    """
    head = "output.weight" if "output.weight" in shapes else "token_embd.weight"
    wv_names = [n for n in shapes if "attn_v.weight" in n or "attn_qkv.weight" in n]
    types: dict[str, QType] = {}
    for name, shape in shapes.items():
        if not is_quantizable(name, shape):
            types[name] = QType.F32
            continue
        if isinstance(quant_mix, str):
            i_wv = wv_names.index(name) if name in wv_names else -1
            qtype = _recipe_type(_mix_name(quant_mix), name, config, i_wv, len(wv_names), name == head)
            if name == head and qtype == QType.Q6_K and shape[-1] % 256:
                qtype = QType.Q8_0  # llama.cpp's output rule, checked before the fallback
        elif isinstance(quant_mix, Mapping):
            match = next((t for p, t in quant_mix.items() if re.search(p, name)), QType.F32)
            qtype = _as_qtype(match)
        elif callable(quant_mix):
            qtype = _as_qtype(quant_mix(name, tuple(shape)))
        else:
            raise TypeError(f"quant_mix must be a str, dict or callable, got {type(quant_mix).__name__}")
        types[name] = fallback_type(qtype, shape[-1])
    return types


def write_model(path: str | os.PathLike, config: ModelConfig, tensors: Mapping[str, np.ndarray],
                quant_mix: str | Mapping[str, object] | Callable = "f32",
                tokenizer: Mapping[str, object] | None = None,
                extra_metadata: Mapping[str, object] | None = None) -> None:
    """Write a model file: config keys, general.file_type, tokenizer keys, extra metadata
    (later entries override earlier ones), and `tensors` (GGUF names, numpy order, float)
    typed by `quant_mix` (see `plan_tensor_types`)."""
    shapes = {name: tuple(np.shape(x)) for name, x in tensors.items()}
    types = plan_tensor_types(config, shapes, quant_mix)
    metadata = config_metadata(config)
    file_type = mix_file_type(quant_mix)
    if file_type is not None:
        metadata["general.file_type"] = np.uint32(file_type)
    if any(t not in (QType.F32, QType.F16, QType.BF16) for t in types.values()):
        metadata["general.quantization_version"] = np.uint32(2)
    metadata.update(tokenizer or {})
    metadata.update(extra_metadata or {})
    write_gguf(path, config.arch, metadata, {n: (tensors[n], types[n]) for n in tensors})
