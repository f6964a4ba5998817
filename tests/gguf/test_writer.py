"""luce.gguf.writer: metadata typing, tensor bytes and shapes, config keys, quant-mix recipes.

Files are read back two ways: luce's reader (values, numpy shapes, dequantization) and the
gguf package's GGUFReader (an independent parser: GGUF value types and ggml `ne` order).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType as V

from luce.gguf import quants
from luce.gguf.config import ModelConfig
from luce.gguf.reader import GGUFModel
from luce.gguf.writer import (config_metadata, fallback_type, is_quantizable, mix_file_type,
                              plan_tensor_types, write_gguf, write_model)
from luce.testing.tensor_layout import tensor_shapes
from luce.testing.tiny_models import (random_weights, tiny_dense_config, tiny_dflash_config,
                                      tiny_qwen35_config)

# Relative RMS error (vs the tensor's RMS) each type reaches on Gaussian data, with margin.
MAX_REL_RMS = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 8e-3, Q.Q8_0: 1e-2, Q.Q6_K: 3e-2,
               Q.Q5_K: 5e-2, Q.Q5_0: 6e-2, Q.Q4_K: 0.1, Q.IQ4_XS: 0.1}


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


def base_metadata() -> dict:
    """The qwen3 keys luce's reader needs to open a file at all."""
    return config_metadata(tiny_dense_config("qwen3"))


def field_type(reader: GGUFReader, key: str) -> list[V]:
    return list(reader.fields[key].types)


# ---- metadata ------------------------------------------------------------------------------

def test_metadata_types_and_values(tmp_path):
    md = {
        "t.uint": 7, "t.neg": -3, "t.big": 2**40, "t.float": 0.25, "t.flag": True, "t.text": "héllo",
        "t.ints": [1, 2, 3], "t.bools": [True, False], "t.strs": ["a b", "ü"],
        "t.floats": [0.5, 1.5], "t.u8": np.uint8(5), "t.f64": np.float64(0.1),
        "t.i64_array": np.array([-1, 2**40], np.int64),
        "tokenizer.ggml.token_type": [1, 1, 3],
    }
    path = tmp_path / "md.gguf"
    write_gguf(path, "qwen3", {**base_metadata(), **md}, {"x.weight": (np.ones((2, 32), np.float32), Q.F32)})
    r = GGUFReader(path)
    assert field_type(r, "general.architecture") == [V.STRING]
    assert field_type(r, "t.uint") == [V.UINT32]
    assert field_type(r, "t.neg") == [V.INT32]
    assert field_type(r, "t.big") == [V.UINT64]
    assert field_type(r, "t.float") == [V.FLOAT32]
    assert field_type(r, "t.flag") == [V.BOOL]
    assert field_type(r, "t.text") == [V.STRING]
    assert field_type(r, "t.ints") == [V.ARRAY, V.INT32]  # as gguf's add_array / llama.cpp write
    assert field_type(r, "t.bools") == [V.ARRAY, V.BOOL]
    assert field_type(r, "t.strs") == [V.ARRAY, V.STRING]
    assert field_type(r, "t.floats") == [V.ARRAY, V.FLOAT32]
    assert field_type(r, "t.u8") == [V.UINT8]
    assert field_type(r, "t.f64") == [V.FLOAT64]
    assert field_type(r, "t.i64_array") == [V.ARRAY, V.INT64]
    assert field_type(r, "tokenizer.ggml.token_type") == [V.ARRAY, V.INT32]
    m = GGUFModel(path, check_tensors=False).metadata
    assert m["general.architecture"] == "qwen3"
    for key in ("t.uint", "t.neg", "t.big", "t.float", "t.flag", "t.text", "t.ints", "t.bools",
                "t.strs", "t.floats", "tokenizer.ggml.token_type"):
        assert m[key] == md[key], key
    assert m["t.u8"] == 5 and m["t.f64"] == 0.1 and m["t.i64_array"] == [-1, 2**40]


@pytest.mark.parametrize("md, error", [
    ({"general.architecture": "qwen3"}, ValueError),
    ({"t.empty": []}, ValueError),
    ({"t.mixed": [1, "a"]}, TypeError),
    ({"t.none": None}, TypeError),
    ({"t.matrix": np.zeros((2, 2), np.int32)}, ValueError),
])
def test_bad_metadata_is_rejected(tmp_path, md, error):
    with pytest.raises(error):
        write_gguf(tmp_path / "bad.gguf", "qwen3", md, {})


# ---- tensors -------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", quants.SUPPORTED, ids=lambda q: q.name)
def test_tensor_round_trip_per_type(tmp_path, qtype):
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((3, 5, 512)).astype(np.float32)  # 3-D: checks the axis order too
    path = tmp_path / f"{qtype.name}.gguf"
    write_gguf(path, "qwen3", base_metadata(), {"a.weight": (x, qtype), "b.bias": (x[0, 0, :64], Q.F32)})
    with GGUFModel(path, check_tensors=False) as m:
        info = m.tensors["a.weight"]
        assert (info.qtype, info.shape) == (qtype, x.shape)
        assert bytes(m.raw("a.weight")) == quants.quantize(x, qtype).tobytes()
        back = m.dequantize("a.weight")
        assert rel_rms(back, x) <= MAX_REL_RMS[qtype]
        if qtype == Q.F32:
            np.testing.assert_array_equal(back, x)
        np.testing.assert_array_equal(m.dequantize("b.bias"), x[0, 0, :64])
    ggml = {t.name: t for t in GGUFReader(path).tensors}
    assert [int(d) for d in ggml["a.weight"].shape] == [512, 5, 3]  # ggml ne: row length first
    assert ggml["a.weight"].tensor_type == qtype


def test_tensors_keep_the_given_order(tmp_path):
    names = ["z.weight", "a.weight", "m.bias"]
    write_gguf(tmp_path / "o.gguf", "qwen3", {}, {n: (np.zeros(32, np.float32), Q.F32) for n in names})
    assert [t.name for t in GGUFReader(tmp_path / "o.gguf").tensors] == names


@pytest.mark.parametrize("x, qtype, error", [
    (np.ones((2, 96), np.float32), Q.Q4_K, ValueError),     # row not a multiple of 256
    (np.ones((2, 40), np.float32), Q.Q8_0, ValueError),     # row not a multiple of 32
    (np.full((2, 32), np.nan, np.float32), Q.F32, ValueError),
    (np.ones((2, 32), np.int32), Q.F32, TypeError),
    (np.ones((2, 32), np.float32), Q.Q4_0, ValueError),     # a type luce does not compute with
])
def test_bad_tensors_are_rejected_before_writing(tmp_path, x, qtype, error):
    path = tmp_path / "bad.gguf"
    with pytest.raises(error):
        write_gguf(path, "qwen3", {}, {"t.weight": (x, qtype)})
    assert not path.exists()


# ---- config keys ----------------------------------------------------------------------------

def test_qwen35_keys_are_llama_cpp_names():
    # key names from llama.cpp src/llama-arch.cpp (LLM_KV_*), as conversion/qwen.py writes them
    md = config_metadata(tiny_qwen35_config())
    assert set(md) == {f"qwen35.{k}" for k in (
        "block_count", "context_length", "embedding_length", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "rope.dimension_sections",
        "rope.freq_base", "attention.layer_norm_rms_epsilon", "attention.key_length",
        "attention.value_length", "rope.dimension_count", "ssm.conv_kernel", "ssm.state_size",
        "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size", "attention.recurrent_layers",
        "full_attention_interval")}
    assert md["qwen35.full_attention_interval"] == 4
    assert md["qwen35.attention.recurrent_layers"] == [True, True, True, False]
    assert md["qwen35.ssm.group_count"] == 2 and md["qwen35.ssm.time_step_rank"] == 4


def test_dflash_keys_store_target_layers_plus_one():
    draft = tiny_dflash_config(tiny_qwen35_config(), target_layers=(0, 2), block_size=4)
    md = config_metadata(draft)
    assert md["dflash.target_layers"] == [1, 3]
    assert md["dflash.block_size"] == 4
    assert md["tokenizer.ggml.mask_token_id"] == draft.mask_token_id >= 0
    assert md["dflash.rope.dimension_sections"] == [16, 0, 0, 0]


def test_qwen2_writes_no_key_length_when_implied():
    md = config_metadata(tiny_dense_config("qwen2"))
    assert "qwen2.attention.key_length" not in md and "qwen2.rope.dimension_count" not in md
    assert config_metadata(tiny_dense_config("qwen3"))["qwen3.attention.key_length"] == 32


def test_irregular_layer_pattern_has_no_interval():
    config = tiny_qwen35_config(recurrent_layers=(True, False, False, True))
    md = config_metadata(config)
    assert "qwen35.full_attention_interval" not in md
    assert md["qwen35.attention.recurrent_layers"] == [True, False, False, True]


CONFIGS = {
    "qwen35": lambda: tiny_qwen35_config(),
    "qwen35-irregular": lambda: tiny_qwen35_config(n_layer=5, recurrent_layers=(True, False, True, True, False)),
    "qwen3": lambda: tiny_dense_config("qwen3"),
    "qwen3-tied": lambda: tiny_dense_config("qwen3", tied_embeddings=True),
    "qwen2": lambda: tiny_dense_config("qwen2"),
    "dflash": lambda: tiny_dflash_config(tiny_qwen35_config(), n_layer=3, target_layers=(1, 2, 3)),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_reader_parses_back_the_config(tmp_path, name):
    config = CONFIGS[name]()
    path = tmp_path / f"{name}.gguf"
    write_model(path, config, random_weights(config), "q8_0")
    with GGUFModel(path) as m:  # also runs the reader's per-arch tensor checks
        got = m.config
    for f in dataclasses.fields(ModelConfig):
        if f.name == "rms_eps":  # stored as FLOAT32
            assert got.rms_eps == float(np.float32(config.rms_eps))
        elif f.name != "extra":
            assert getattr(got, f.name) == getattr(config, f.name), f.name


def test_write_model_metadata_layers(tmp_path):
    config = tiny_dense_config("qwen3")
    path = tmp_path / "m.gguf"
    write_model(path, config, random_weights(config), "q8_0", tokenizer={"tokenizer.ggml.model": "gpt2"},
                extra_metadata={"general.name": "x", "qwen3.context_length": 77})
    md = GGUFModel(path).metadata
    assert md["general.file_type"] == 7 and md["general.quantization_version"] == 2
    assert md["tokenizer.ggml.model"] == "gpt2" and md["general.name"] == "x"
    assert md["qwen3.context_length"] == 77  # extra metadata wins
    write_model(path, config, random_weights(config), "f32")
    md = GGUFModel(path).metadata
    assert md["general.file_type"] == 0 and "general.quantization_version" not in md


# ---- quant mixes ----------------------------------------------------------------------------

def _use_more_bits(i: int, n: int) -> bool:  # llama.cpp src/llama-quant.cpp
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def test_q4_k_m_recipe_on_a_dense_model():
    config = tiny_dense_config("qwen3", n_layer=8, hidden=256, ffn=512)
    types = plan_tensor_types(config, tensor_shapes(config), "q4_k_m")
    more_bits = {0, 3, 6, 7}  # use_more_bits(i, 8), worked out by hand
    assert {i for i in range(8) if _use_more_bits(i, 8)} == more_bits
    for il in range(8):
        hi = Q.Q6_K if il in more_bits else Q.Q4_K
        assert types[f"blk.{il}.ffn_down.weight"] == hi
        assert types[f"blk.{il}.attn_v.weight"] == hi  # attn_v counter = layer here
        assert types[f"blk.{il}.attn_q.weight"] == Q.Q4_K
        assert types[f"blk.{il}.ffn_gate.weight"] == Q.Q4_K
        assert types[f"blk.{il}.attn_norm.weight"] == Q.F32
        assert types[f"blk.{il}.attn_q_norm.weight"] == Q.F32
    assert types["token_embd.weight"] == Q.Q4_K and types["output.weight"] == Q.Q6_K


def test_q4_k_m_on_qwen35_counts_attn_qkv_with_attn_v_and_falls_back():
    config = tiny_qwen35_config(hidden=256, ffn=512)
    types = plan_tensor_types(config, tensor_shapes(config), "q4_k_m")
    # attn_qkv (layers 0-2) and attn_v (layer 3) share llama.cpp's attn_v counter, n = 4
    assert [types[n] for n in ("blk.0.attn_qkv.weight", "blk.1.attn_qkv.weight",
                               "blk.2.attn_qkv.weight", "blk.3.attn_v.weight")] == \
        [Q.Q4_K, Q.Q4_K, Q.Q6_K, Q.Q6_K]
    assert types["blk.0.ssm_out.weight"] == Q.Q5_0        # row 64: Q4_K -> Q5_0
    assert types["blk.3.attn_output.weight"] == Q.Q5_0    # row 96
    for name in ("blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight"):
        assert types[name] == Q.F32
    assert types["blk.0.ssm_beta.weight"] == Q.Q4_K


def test_head_rules_tied_and_narrow():
    tied = tiny_dense_config("qwen3", hidden=256, ffn=512, tied_embeddings=True)
    assert plan_tensor_types(tied, tensor_shapes(tied), "q4_k_m")["token_embd.weight"] == Q.Q6_K
    narrow = tiny_dense_config("qwen3")  # hidden 96: the output row is not a 256 multiple
    types = plan_tensor_types(narrow, tensor_shapes(narrow), "q4_k_m")
    assert types["output.weight"] == Q.Q8_0 and types["token_embd.weight"] == Q.Q5_0
    assert plan_tensor_types(narrow, tensor_shapes(narrow), "iq4_xs")["blk.0.ffn_up.weight"] == Q.Q8_0


def test_iq4_xs_recipe():
    config = tiny_dense_config("qwen3", n_layer=8, hidden=256, ffn=512, n_head=8, n_head_kv=2)
    types = plan_tensor_types(config, tensor_shapes(config), "iq4_xs")
    assert types["output.weight"] == Q.Q6_K and types["token_embd.weight"] == Q.IQ4_XS
    assert types["blk.0.ffn_down.weight"] == Q.Q5_K and types["blk.1.ffn_down.weight"] == Q.IQ4_XS
    assert types["blk.5.attn_v.weight"] == Q.Q5_K  # n_head >= 4 n_head_kv
    assert types["blk.5.attn_k.weight"] == Q.IQ4_XS


def test_custom_mixes():
    config = tiny_dense_config("qwen3", hidden=256, ffn=512)
    shapes = tensor_shapes(config)
    types = plan_tensor_types(config, shapes, {r"ffn_(up|gate)": "q5_k", r"attn_": Q.Q8_0,
                                               r"\.weight$": "bf16"})
    assert types["blk.0.ffn_up.weight"] == Q.Q5_K and types["blk.0.attn_k.weight"] == Q.Q8_0
    assert types["blk.0.ffn_down.weight"] == Q.BF16 and types["blk.0.attn_k_norm.weight"] == Q.F32
    assert plan_tensor_types(config, shapes, {"ffn_down": "q6_k"})["blk.0.ffn_up.weight"] == Q.F32
    seen = []
    types = plan_tensor_types(config, shapes, lambda name, shape: seen.append(name) or "q4_k")
    assert types["blk.2.attn_output.weight"] == Q.Q5_0  # row 128: the fallback still applies
    assert set(seen) == {n for n, s in shapes.items() if is_quantizable(n, s)}
    with pytest.raises(ValueError, match="unknown quant mix"):
        plan_tensor_types(config, shapes, "q3_k_s")


def test_fallback_chain():
    assert fallback_type(Q.Q4_K, 512) == Q.Q4_K
    assert fallback_type(Q.Q4_K, 96) == Q.Q5_0
    assert fallback_type(Q.Q6_K, 96) == Q.Q8_0 and fallback_type(Q.IQ4_XS, 64) == Q.Q8_0
    assert fallback_type(Q.Q4_K, 40) == Q.F16 and fallback_type(Q.Q8_0, 40) == Q.F16
    assert mix_file_type("q4_k_m") == 15 and mix_file_type({"x": "f16"}) is None


def test_mixed_file_round_trips_within_each_types_error(tmp_path):
    config = tiny_qwen35_config(hidden=256, ffn=512)
    weights = random_weights(config)
    path = tmp_path / "mix.gguf"
    write_model(path, config, weights, "q4_k_m")
    planned = plan_tensor_types(config, tensor_shapes(config), "q4_k_m")
    with GGUFModel(path) as m:
        assert {n: t.qtype for n, t in m.tensors.items()} == planned
        assert len(set(planned.values())) == 4  # F32, Q4_K, Q6_K, Q5_0
        for name, x in weights.items():
            assert rel_rms(m.dequantize(name), x) <= MAX_REL_RMS[planned[name]], name
