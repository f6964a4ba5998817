"""GGUFModel on valid files: tiny random models of each arch written with gguf.GGUFWriter
(the helpers here are shared with test_reader_errors.py), and the real Qwen2.5-Coder file."""
from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T

from luce.gguf.config import ModelConfig
from luce.gguf.reader import GGUFModel, TensorInfo, read_config

# --- tiny model builder ---------------------------------------------------------------------

DIMS = dict(hidden=64, ffn=256, n_head=4, n_head_kv=2, vocab=160)


def _attention(p: str, H: int, q_rows: int, kv: int, q_out: int, *, bias=False, qk_norm=0) -> dict:
    t = {f"{p}.attn_q.weight": (q_rows, H), f"{p}.attn_k.weight": (kv, H),
         f"{p}.attn_v.weight": (kv, H), f"{p}.attn_output.weight": (H, q_out)}
    if bias:
        t.update({f"{p}.attn_q.bias": (q_out,), f"{p}.attn_k.bias": (kv,), f"{p}.attn_v.bias": (kv,)})
    if qk_norm:
        t.update({f"{p}.attn_q_norm.weight": (qk_norm,), f"{p}.attn_k_norm.weight": (qk_norm,)})
    return t


def _ffn(p: str, H: int, F: int) -> dict:
    return {f"{p}.ffn_gate.weight": (F, H), f"{p}.ffn_up.weight": (F, H),
            f"{p}.ffn_down.weight": (H, F)}


def tiny_layout(arch: str) -> tuple[dict, dict]:
    """-> (metadata {key: (value, GGUFValueType)}, tensor shapes {name: numpy-order shape})."""
    H, F, nh, nkv, V = DIMS["hidden"], DIMS["ffn"], DIMS["n_head"], DIMS["n_head_kv"], DIMS["vocab"]
    hd = {"qwen2": H // nh, "qwen3": 32, "qwen35": 32, "dflash": 16}[arch]
    n_layer = 4 if arch == "qwen35" else 2
    a = arch
    md = {f"{a}.block_count": (n_layer, T.UINT32), f"{a}.context_length": (4096, T.UINT32),
          f"{a}.embedding_length": (H, T.UINT32), f"{a}.feed_forward_length": (F, T.UINT32),
          f"{a}.attention.head_count": (nh, T.UINT32), f"{a}.attention.head_count_kv": (nkv, T.UINT32),
          f"{a}.rope.freq_base": (1e6, T.FLOAT32),
          f"{a}.attention.layer_norm_rms_epsilon": (1e-6, T.FLOAT32),
          "tokenizer.ggml.model": ("gpt2", T.STRING),
          "tokenizer.ggml.tokens": ([f"tok{i}" for i in range(V)], T.ARRAY),
          "tokenizer.ggml.eos_token_id": (V - 1, T.UINT32),
          "tokenizer.chat_template": ("{{ messages }}", T.STRING)}
    if arch != "qwen2":
        md[f"{a}.attention.key_length"] = (hd, T.UINT32)
        md[f"{a}.attention.value_length"] = (hd, T.UINT32)
    t = {"output_norm.weight": (H,)}
    if arch != "dflash":
        t["token_embd.weight"] = (V, H)
    if arch == "qwen2":
        t["output.weight"] = (V, H)  # untied; the other archs are tied (or borrow the target's)
    if arch == "qwen35":
        md.update({f"{a}.rope.dimension_count": (8, T.UINT32),
                   f"{a}.rope.dimension_sections": ([2, 2, 0, 0], T.ARRAY),
                   f"{a}.full_attention_interval": (2, T.UINT32),
                   f"{a}.ssm.conv_kernel": (4, T.UINT32), f"{a}.ssm.state_size": (16, T.UINT32),
                   f"{a}.ssm.group_count": (2, T.UINT32), f"{a}.ssm.time_step_rank": (4, T.UINT32),
                   f"{a}.ssm.inner_size": (64, T.UINT32)})
    if arch == "dflash":
        md.update({f"{a}.target_layers": ([2, 5], T.ARRAY), f"{a}.block_size": (16, T.UINT32),
                   "tokenizer.ggml.mask_token_id": (V - 2, T.UINT32)})
        t.update({"fc.weight": (H, 2 * H), "enc.output_norm.weight": (H,)})
    for il in range(n_layer):
        p = f"blk.{il}"
        t[f"{p}.attn_norm.weight"] = (H,)
        if arch == "qwen35":
            t[f"{p}.post_attention_norm.weight"] = (H,)
            if (il + 1) % 2 == 0:
                t.update(_attention(p, H, 2 * nh * hd, nkv * hd, nh * hd, qk_norm=hd))
            else:  # Gated DeltaNet: 2 key heads, 4 value heads of 16
                conv = 2 * 2 * 16 + 64
                t.update({f"{p}.attn_qkv.weight": (conv, H), f"{p}.attn_gate.weight": (64, H),
                          f"{p}.ssm_conv1d.weight": (conv, 4), f"{p}.ssm_dt.bias": (4,),
                          f"{p}.ssm_a": (4,), f"{p}.ssm_beta.weight": (4, H),
                          f"{p}.ssm_alpha.weight": (4, H), f"{p}.ssm_norm.weight": (16,),
                          f"{p}.ssm_out.weight": (H, 64)})
        else:
            t[f"{p}.ffn_norm.weight"] = (H,)
            t.update(_attention(p, H, nh * hd, nkv * hd, nh * hd, bias=arch == "qwen2",
                                qk_norm=0 if arch == "qwen2" else hd))
        t.update(_ffn(p, H, F))
    return md, t


def write_tiny_model(path: Path, arch: str = "qwen2", *, seed: int = 0, drop_keys=(),
                     set_keys: dict | None = None, drop_tensors=(), shapes: dict | None = None,
                     qtypes: dict | None = None) -> dict[str, np.ndarray]:
    """Write a tiny random model; returns {tensor name: the f32 values written}.

    set_keys {key: (value, GGUFValueType)} adds or replaces metadata; shapes overrides tensor
    shapes; qtypes {name: Q} stores a tensor in F16, Q8_0 or (random bytes of) any other type."""
    md, layout = tiny_layout(arch)
    md.update(set_keys or {})
    layout.update(shapes or {})
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    for key in drop_keys:
        md.pop(key, None)
        w.kv_data[0].pop(key, None)  # general.architecture is added by the writer itself
    for key, (value, vtype) in md.items():
        w.add_key_value(key, value, vtype)
    written = {}
    for name, shape in layout.items():
        if name in drop_tensors:
            continue
        x = rng.standard_normal(shape).astype(np.float32)
        qt = (qtypes or {}).get(name, Q.F32)
        if qt == Q.F32:
            w.add_tensor(name, x)
        elif qt == Q.F16:
            x = x.astype(np.float16)
            w.add_tensor(name, x)
        elif qt == Q.Q8_0:
            w.add_tensor(name, gguf.quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qt]
            blob = rng.integers(0, 256, (*shape[:-1], shape[-1] // block * size), dtype=np.uint8)
            w.add_tensor(name, blob, raw_dtype=qt)
        written[name] = x
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


@pytest.fixture
def tiny(tmp_path):
    """tiny(arch, **kw) -> path of a freshly written tiny model."""
    def make(arch: str = "qwen2", name: str | None = None, **kw) -> Path:
        path = tmp_path / (name or f"tiny-{arch}.gguf")
        write_tiny_model(path, arch, **kw)
        return path
    return make


# --- valid files ----------------------------------------------------------------------------

def test_qwen2_config_and_tensor_table_match_gguf_reader(tmp_path):
    path = tmp_path / "q2.gguf"
    write_tiny_model(path, "qwen2")
    with GGUFModel(path) as m:
        c = m.config
        assert (c.arch, c.n_layer, c.hidden, c.ffn, c.n_head, c.n_head_kv, c.head_dim) == \
            ("qwen2", 2, 64, 256, 4, 2, 16)
        assert (c.vocab, c.rope_dim, c.context_length) == (160, 16, 4096)
        assert c.qkv_bias and not c.qk_norm and not c.tied_embeddings and not c.is_hybrid
        assert c.rms_eps == float(np.float32(1e-6)) and c.rope_theta == 1e6  # FLOAT32 keys
        assert c.rope_sections == () and c.full_attention_layers == (0, 1)
        oracle = gguf.GGUFReader(path)  # the gguf package's own parser as the oracle
        assert set(m.tensors) == {t.name for t in oracle.tensors}
        for t in oracle.tensors:
            info = m.tensor_info(t.name)
            assert isinstance(info, TensorInfo)
            assert info.shape == tuple(reversed(t.shape.tolist()))
            assert (info.qtype, info.nbytes, info.offset) == (t.tensor_type, t.n_bytes, t.data_offset)
        for key, field in oracle.fields.items():
            if not key.startswith("GGUF."):
                assert m.metadata[key] == field.contents(), key
        assert set(m.metadata) == {k for k in oracle.fields if not k.startswith("GGUF.")}


def test_qwen3_key_length_and_tied_embeddings(tiny):
    c = read_config(tiny("qwen3"))
    assert isinstance(c, ModelConfig)
    assert (c.head_dim, c.rope_dim, c.qk_norm, c.qkv_bias, c.tied_embeddings) == (32, 32, True, False, True)


def test_qwen35_hybrid_layout_from_interval(tiny):
    c = read_config(tiny("qwen35"))
    assert c.recurrent_layers == (True, False, True, False)
    assert c.full_attention_layers == (1, 3) and c.gdn_layers == (0, 2) and c.is_hybrid
    assert (c.ssm_conv_kernel, c.ssm_state_size, c.ssm_n_k_heads, c.ssm_n_v_heads, c.ssm_inner) == \
        (4, 16, 2, 4, 64)
    assert (c.head_dim, c.rope_dim, c.rope_sections, c.qk_norm) == (32, 8, (2, 2, 0, 0), True)
    assert c.extra["nextn_layers"] == 0


def test_qwen35_recurrent_layers_array_wins_over_interval(tiny):
    # same tensors (layers 1 and 3 attention) described by an explicit array, with a
    # contradicting interval: the array must decide
    kinds = [True, False, True, False]
    c = read_config(tiny("qwen35", set_keys={
        "qwen35.attention.recurrent_layers": (kinds, T.ARRAY),
        "qwen35.full_attention_interval": (3, T.UINT32)}))
    assert c.recurrent_layers == tuple(kinds)


def test_qwen35_mtp_layers_are_not_trunk_layers(tiny):
    # llama.cpp appends MTP blocks after the trunk and counts them in block_count
    c = read_config(tiny("qwen35", set_keys={"qwen35.block_count": (5, T.UINT32),
                                             "qwen35.nextn_predict_layers": (1, T.UINT32)}))
    assert c.n_layer == 4 and c.recurrent_layers == (True, False, True, False)
    assert (c.extra["n_layer_all"], c.extra["nextn_layers"]) == (5, 1)


def test_dflash_draft_config(tiny):
    c = read_config(tiny("dflash"))
    assert c.target_layers == (1, 4)  # stored as hidden-state indices 2, 5
    assert (c.block_size, c.mask_token_id, c.vocab, c.head_dim, c.qk_norm) == (16, 158, 160, 16, True)
    assert c.tied_embeddings  # no head of its own


def test_dflash_vocab_falls_back_to_vocab_size_key(tiny):
    c = read_config(tiny("dflash", drop_keys=["tokenizer.ggml.tokens"],
                         set_keys={"dflash.vocab_size": (1000, T.UINT32)}))
    assert c.vocab == 1000


def test_raw_is_a_zero_copy_memmap_view(tmp_path):
    path = tmp_path / "m.gguf"
    written = write_tiny_model(path, "qwen2")
    m = GGUFModel(path)
    info = m.tensor_info("blk.1.ffn_down.weight")
    raw = m.raw(info.name)
    assert isinstance(raw, np.memmap) and raw.dtype == np.uint8 and raw.shape == (info.nbytes,)
    assert not raw.flags.owndata and not raw.flags.writeable
    with open(path, "rb") as f:
        f.seek(info.offset)
        assert f.read(info.nbytes) == raw.tobytes()
    np.testing.assert_array_equal(raw.view(np.float32).reshape(info.shape), written[info.name])
    m.close()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0])
def test_dequantize_returns_what_was_written(tmp_path, qtype):
    path = tmp_path / "m.gguf"
    name = "blk.0.attn_q.weight"
    written = write_tiny_model(path, "qwen2", qtypes={name: qtype})
    with GGUFModel(path) as m:
        assert m.tensor_info(name).qtype == qtype
        out = m.dequantize(name, expect_shape=(64, 64))
        assert out.dtype == np.float32 and out.shape == (64, 64)
        if qtype == Q.Q8_0:
            want = gguf.quants.dequantize(gguf.quants.quantize(written[name], Q.Q8_0), Q.Q8_0)
            np.testing.assert_array_equal(out, want)
            absmax = np.abs(written[name]).reshape(-1, 32).max(axis=1, keepdims=True)
            bound = absmax / 127 * 0.5 + absmax * 2.0**-10  # half a step + the f16 scale's rounding
            assert np.all(np.abs(out - written[name]).reshape(-1, 32) <= bound)
        else:
            np.testing.assert_array_equal(out, written[name].astype(np.float32))


def test_get_and_tokenizer_metadata(tiny):
    with GGUFModel(tiny("qwen2")) as m:
        assert m.get("qwen2.block_count") == 2
        assert m.get("no.such.key", None) is None
        tok = m.tokenizer_metadata()
        assert set(tok) == {"tokenizer.ggml.model", "tokenizer.ggml.tokens",
                            "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"}
        assert tok["tokenizer.ggml.tokens"][:2] == ["tok0", "tok1"]


def test_vocab_only_file_opens_without_tensor_checks(tiny):
    path = tiny("qwen2", drop_tensors=set(tiny_layout("qwen2")[1]))
    with GGUFModel(path, check_tensors=False) as m:
        assert m.tensors == {} and m.config.vocab == 160
        assert len(m.tokenizer_metadata()["tokenizer.ggml.tokens"]) == 160


def test_large_string_array_round_trips(tmp_path):
    # vocabulary-sized string arrays go through the parser's unchecked fast path
    path = tmp_path / "vocab.gguf"
    tokens = [f"token-{i}-\u00e9" for i in range(150_000)]
    write_tiny_model(path, "qwen2", set_keys={"tokenizer.ggml.tokens": (tokens, T.ARRAY)},
                     drop_tensors=set(tiny_layout("qwen2")[1]))
    with GGUFModel(path, check_tensors=False) as m:
        assert m.metadata["tokenizer.ggml.tokens"] == tokens


@pytest.mark.parametrize("arch", ["qwen35", "qwen2", "qwen3", "dflash"])
def test_reads_back_what_luce_gguf_writer_wrote(tmp_path, arch):
    # the writer (another module) encodes a ModelConfig the way llama.cpp's converter does;
    # reading it back must give the same config, and every tensor must pass the checks
    import dataclasses

    tiny = pytest.importorskip("luce.testing.tiny_models")
    path = tmp_path / f"{arch}.gguf"
    if arch == "qwen35":
        want = tiny.make_qwen35(path, full_attention_interval=2)
    elif arch == "dflash":
        want = tiny.make_dflash_draft(path, tiny.tiny_qwen35_config(), target_layers=(0, 3))
    else:
        want = tiny.make_dense(path, arch=arch)
    with GGUFModel(path) as m:
        got = m.config
        for f in dataclasses.fields(ModelConfig):
            if f.name != "extra":
                assert getattr(got, f.name) == getattr(want, f.name), f.name
        weights = tiny.random_weights(want)
        assert set(m.tensors) == set(weights)
        name = "blk.1.ffn_up.weight"
        np.testing.assert_array_equal(m.dequantize(name), weights[name])


# --- the real file (skipped when absent) ----------------------------------------------------

def _real_model(name: str) -> Path | None:
    for root in (os.environ.get("LUCE_MODELS"), Path.home() / ".cache" / "luce" / "models"):
        if root and (Path(root) / name).is_file():
            return Path(root) / name
    return None


REAL_FILES = {  # file: (n_layer, hidden, ffn, n_head, n_head_kv, head_dim, token_embd type)
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": (28, 1536, 8960, 12, 2, 128, Q.Q4_K),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": (24, 896, 4864, 14, 2, 64, Q.Q5_0),
}


@pytest.mark.parametrize("name", list(REAL_FILES))
def test_real_qwen25_coder_config(name):
    path = _real_model(name)
    if path is None:
        pytest.skip(f"{name} not in $LUCE_MODELS or ~/.cache/luce/models (make models)")
    n_layer, hidden, ffn, n_head, n_kv, head_dim, embd_type = REAL_FILES[name]
    with GGUFModel(path) as m:
        c = m.config
        assert (c.arch, c.n_layer, c.hidden, c.ffn, c.n_head, c.n_head_kv, c.head_dim) == \
            ("qwen2", n_layer, hidden, ffn, n_head, n_kv, head_dim)
        assert (c.vocab, c.qkv_bias, c.qk_norm, c.tied_embeddings) == (151936, True, False, False)
        assert (c.rope_theta, c.rope_dim, c.context_length) == (1e6, head_dim, 32768)
        embd = m.tensor_info("token_embd.weight")
        assert (embd.shape, embd.qtype) == ((151936, hidden), embd_type)
        assert m.get("tokenizer.ggml.pre") == "qwen2"
        assert len(m.tokenizer_metadata()["tokenizer.ggml.tokens"]) == 151936
        bias = m.dequantize("blk.0.attn_q.bias", expect_shape=(n_head * head_dim,))
        assert np.isfinite(bias).all() and np.abs(bias).max() > 0
