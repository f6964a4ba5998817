"""Tiny test models (luce.testing.tiny_models) and the tiny tokenizer (tiny_tokenizer).

Models are written to tmp_path and read back with luce's reader (config, names, shapes,
types, values) and gguf's GGUFReader (ggml `ne` order, independent of luce). The tokenizer
is checked with the Hugging Face `tokenizers` library built from the same arrays.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jinja2
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from luce.gguf.reader import GGUFModel
from luce.gguf.writer import plan_tensor_types
from luce.testing import tiny_tokenizer
from luce.testing.tensor_layout import tensor_shapes
from luce.testing.tiny_models import (make_dense, make_dflash_draft, make_qwen35, random_weights,
                                      tiny_dense_config, tiny_dflash_config, tiny_qwen35_config)
from luce.testing.tiny_tokenizer import (QWEN2_PRETOKENIZER_PATTERN, byte_to_unicode, learn_merges,
                                         tiny_tokenizer_metadata)

ROOT = Path(__file__).resolve().parent.parent
MAX_REL_RMS = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 8e-3, Q.Q8_0: 1e-2, Q.Q6_K: 3e-2,
               Q.Q5_K: 5e-2, Q.Q5_0: 6e-2, Q.Q4_K: 0.1, Q.IQ4_XS: 0.1}


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


def make(kind: str, path: Path, seed: int = 0, quant_mix: str = "f32"):
    if kind == "qwen35":
        return make_qwen35(path, seed=seed, quant_mix=quant_mix)
    if kind == "dflash":
        target = tiny_qwen35_config(**({"hidden": 256, "ffn": 512} if quant_mix == "q4_k_m" else {}))
        return make_dflash_draft(path, target, seed=seed, quant_mix=quant_mix)
    return make_dense(path, arch=kind, seed=seed, quant_mix=quant_mix)


# ---- determinism -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind, mix", [("qwen35", "q4_k_m"), ("qwen2", "f32"), ("dflash", "q8_0")])
def test_same_seed_gives_identical_bytes(tmp_path, kind, mix):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    make(kind, a, seed=3, quant_mix=mix)
    make(kind, b, seed=3, quant_mix=mix)
    make(kind, c, seed=4, quant_mix=mix)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes() and a.stat().st_size == c.stat().st_size


def test_tensor_streams_are_keyed_by_name():
    # a different layer count leaves the shared tensors unchanged
    small = random_weights(tiny_dense_config("qwen3"))
    large = random_weights(tiny_dense_config("qwen3", n_layer=5))
    np.testing.assert_array_equal(small["blk.1.ffn_up.weight"], large["blk.1.ffn_up.weight"])
    assert not np.array_equal(small["blk.1.ffn_up.weight"], small["blk.2.ffn_up.weight"])


# ---- every arch written and read back --------------------------------------------------------

@pytest.mark.parametrize("kind, mix", [
    ("qwen35", "f32"), ("qwen35", "q4_k_m"), ("qwen35", "iq4_xs"), ("qwen3", "q8_0"),
    ("qwen3", "bf16"), ("qwen2", "f16"), ("qwen2", "q4_k_m"), ("dflash", "f32"), ("dflash", "q4_k_m"),
])
def test_written_model_reads_back(tmp_path, kind, mix):
    path = tmp_path / f"{kind}-{mix}.gguf"
    config = make(kind, path, seed=1, quant_mix=mix)
    weights = random_weights(config, seed=1)
    planned = plan_tensor_types(config, tensor_shapes(config), mix)
    with GGUFModel(path) as m:  # runs luce's per-arch tensor checks too
        assert m.config == config
        assert list(m.tensors) == list(tensor_shapes(config))
        mask = {"tokenizer.ggml.mask_token_id": config.mask_token_id} if kind == "dflash" else {}
        assert m.tokenizer_metadata() == {**tiny_tokenizer_metadata(), **mask}
        assert m.metadata["general.name"] == f"luce-tiny-{config.arch}"
        for name, x in weights.items():
            info = m.tensors[name]
            assert (info.shape, info.qtype) == (x.shape, planned[name]), name
            back = m.dequantize(name)
            if info.qtype == Q.F32:
                np.testing.assert_array_equal(back, x)
            else:
                assert rel_rms(back, x) <= MAX_REL_RMS[info.qtype], name
    if mix in ("q4_k_m", "iq4_xs"):
        assert config.hidden == 256 and len(set(planned.values())) >= 3


def test_qwen35_layout_in_ggml_order(tmp_path):
    # ne as llama.cpp's create_tensor spells them in src/models/qwen35.cpp
    c = make_qwen35(tmp_path / "q.gguf")
    ne = {t.name: [int(d) for d in t.shape] for t in GGUFReader(tmp_path / "q.gguf").tensors}
    conv = 2 * c.ssm_n_k_heads * c.ssm_state_size + c.ssm_inner
    assert (c.hidden, c.n_head, c.head_dim, c.ssm_inner, conv) == (96, 3, 32, 64, 128)
    assert ne["blk.0.ssm_conv1d.weight"] == [c.ssm_conv_kernel, conv]
    assert ne["blk.0.attn_qkv.weight"] == [c.hidden, conv]
    assert ne["blk.0.attn_gate.weight"] == [c.hidden, c.ssm_inner]
    assert ne["blk.0.ssm_beta.weight"] == ne["blk.0.ssm_alpha.weight"] == [c.hidden, c.ssm_n_v_heads]
    assert ne["blk.0.ssm_a"] == ne["blk.0.ssm_dt.bias"] == [c.ssm_n_v_heads]
    assert ne["blk.0.ssm_out.weight"] == [c.ssm_inner, c.hidden]
    assert ne["blk.0.ssm_norm.weight"] == [c.ssm_state_size]
    assert ne["blk.3.attn_q.weight"] == [c.hidden, 2 * c.n_head * c.head_dim]
    assert ne["blk.3.attn_k.weight"] == [c.hidden, c.n_head_kv * c.head_dim]
    assert ne["blk.3.attn_output.weight"] == [c.n_head * c.head_dim, c.hidden]
    assert "blk.3.attn_qkv.weight" not in ne and "blk.0.attn_q.weight" not in ne
    assert c.recurrent_layers == (True, True, True, False) and c.ssm_n_v_heads > c.ssm_n_k_heads
    assert sum(c.rope_sections) * 2 == c.rope_dim == 8


def test_dflash_layout_in_ggml_order(tmp_path):
    target = tiny_qwen35_config()
    d = make_dflash_draft(tmp_path / "d.gguf", target, target_layers=(0, 2, 3))
    ne = {t.name: [int(x) for x in t.shape] for t in GGUFReader(tmp_path / "d.gguf").tensors}
    assert ne["fc.weight"] == [3 * target.hidden, target.hidden]  # src/models/dflash.cpp
    assert ne["enc.output_norm.weight"] == ne["output_norm.weight"] == [target.hidden]
    assert ne["blk.1.attn_q.weight"] == [target.hidden, d.n_head * d.head_dim]
    assert "token_embd.weight" not in ne and "output.weight" not in ne
    md = GGUFModel(tmp_path / "d.gguf").metadata
    assert md["dflash.target_layers"] == [1, 3, 4]
    assert md["tokenizer.ggml.tokens"][md["tokenizer.ggml.mask_token_id"]] == "<|mask|>"


def test_weight_statistics():
    c = tiny_qwen35_config()
    w = random_weights(c, seed=2)
    a = w["blk.0.ssm_a"]
    assert np.all((a <= -1) & (a >= -16))  # -exp(A_log), A in [1, 16]
    dt = np.log1p(np.exp(w["blk.0.ssm_dt.bias"]))  # softplus
    assert np.all((dt >= 0.999e-3) & (dt <= 1.001e-1))
    for name in ("blk.0.attn_norm.weight", "blk.3.attn_q_norm.weight", "output_norm.weight",
                 "blk.1.ssm_norm.weight"):
        assert abs(w[name].mean() - 1) < 0.1 and 0.03 < w[name].std() < 0.3, name
    x = np.random.default_rng(0).standard_normal((64, c.hidden)).astype(np.float32)
    for name in ("blk.0.attn_qkv.weight", "blk.3.attn_q.weight", "blk.1.ffn_gate.weight", "output.weight"):
        assert 0.7 < np.sqrt(np.mean((x @ w[name].T) ** 2)) < 1.4, name  # unit in, unit out


def _rmsnorm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + 1e-6) * w


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_dense_activations_stay_order_one(tmp_path, arch):
    # one token: attention over a single key returns its value (per KV group)
    c = make_dense(tmp_path / "m.gguf", arch=arch)
    with GGUFModel(tmp_path / "m.gguf") as m:
        w = {n: m.dequantize(n) for n in m.tensors}
    for token in (5, 300, c.vocab - 5):
        x = w["token_embd.weight"][token]
        for il in range(c.n_layer):
            p = f"blk.{il}."
            h = _rmsnorm(x, w[p + "attn_norm.weight"])
            v = w[p + "attn_v.weight"] @ h + (w[p + "attn_v.bias"] if c.qkv_bias else 0)
            heads = np.repeat(v.reshape(c.n_head_kv, c.head_dim), c.n_head // c.n_head_kv, axis=0)
            x = x + w[p + "attn_output.weight"] @ heads.reshape(-1)
            h = _rmsnorm(x, w[p + "ffn_norm.weight"])
            gate, up = w[p + "ffn_gate.weight"] @ h, w[p + "ffn_up.weight"] @ h
            x = x + w[p + "ffn_down.weight"] @ (gate / (1 + np.exp(-gate)) * up)
            assert 0.3 < np.sqrt(np.mean(x * x)) < 5, (token, il)
        logits = w["output.weight"] @ _rmsnorm(x, w["output_norm.weight"])
        assert 0.3 < logits.std() < 5


@pytest.mark.parametrize("call, match", [
    (lambda: tiny_dflash_config(tiny_qwen35_config(), target_layers=(2, 0)), "increasing"),
    (lambda: tiny_dflash_config(tiny_qwen35_config(), target_layers=(0, 4)), "increasing"),
    (lambda: tiny_qwen35_config(ssm_n_v_heads=3), "multiple"),
    (lambda: tiny_qwen35_config(rope_sections=(2, 2, 2, 0)), "rope_dim"),
    (lambda: tiny_dense_config("qwen2", head_dim=16), "n_head"),
    (lambda: tiny_dense_config("qwen3", n_heads=2), "unknown"),
])
def test_bad_configs_are_rejected(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_vocab_must_match_the_tokenizer(tmp_path):
    with pytest.raises(ValueError, match="tokenizer"):
        make_dense(tmp_path / "v.gguf", vocab=500)


def test_cli_writes_models(tmp_path):
    tool = ROOT / "tools" / "make_tiny_model.py"
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    for args in (["qwen35", target, "--seed", "2", "--quant-mix", "q8_0"], ["dflash", draft, "--target", target]):
        out = subprocess.run([sys.executable, tool, *map(str, args)], capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "wrote" in out.stdout
    assert GGUFModel(target).config == tiny_qwen35_config()
    assert GGUFModel(draft).config.target_layers == (0, 2)
    make_qwen35(tmp_path / "same.gguf", seed=2, quant_mix="q8_0")
    assert target.read_bytes() == (tmp_path / "same.gguf").read_bytes()
    bad = subprocess.run([sys.executable, tool, "qwen3", str(draft), "--target", str(target)],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--target" in bad.stderr


# ---- the tiny tokenizer ----------------------------------------------------------------------

def hf_tokenizer(md: dict) -> Tokenizer:
    """A Hugging Face byte-level BPE built from the GGUF arrays, split like qwen2."""
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    vocab = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k == 1}
    merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZER_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == 3])
    assert tok.get_vocab_size() == len(tokens)
    assert all(tok.token_to_id(t) == i for i, t in enumerate(tokens))
    return tok


@pytest.fixture(scope="module")
def hf() -> Tokenizer:
    return hf_tokenizer(tiny_tokenizer_metadata())


def test_byte_symbols_match_gpt2_byte_level():
    table = byte_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert table[ord("A")] == "A" and table[ord(" ")] == "\u0120" and table[ord("\n")] == "\u010a"


def test_vocabulary_structure():
    md = tiny_tokenizer_metadata()
    tokens, types, merges = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"], md["tokenizer.ggml.merges"]
    assert len(tokens) == len(set(tokens)) == len(types)
    assert set(tokens[:256]) == set(byte_to_unicode().values()) and tokens[0] == "!"
    assert 100 <= len(merges) <= 200
    known = set(tokens[:256])
    for merge in merges:  # each merge joins two tokens that exist by then, into a token
        a, b = merge.split(" ")
        assert a in known and b in known, merge
        known.add(a + b)
    assert known == set(tokens[:len(known)]) and len(known) == types.count(1)
    specials = [t for t, k in zip(tokens, types) if k == 3]
    assert specials == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
    assert tokens[md["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert tokens[md["tokenizer.ggml.bos_token_id"]] == tokens[md["tokenizer.ggml.padding_token_id"]] == "<|endoftext|>"
    assert (md["tokenizer.ggml.model"], md["tokenizer.ggml.pre"]) == ("gpt2", "qwen2")
    extra = tiny_tokenizer_metadata(extra_specials=("<tool>",))
    assert extra["tokenizer.ggml.tokens"][-1] == "<tool>" and extra["tokenizer.ggml.token_type"][-1] == 3
    with pytest.raises(ValueError):
        tiny_tokenizer_metadata(extra_specials=("!",))  # a byte symbol


def test_merges_are_deterministic():
    assert learn_merges.__wrapped__(160) == learn_merges(160)
    assert learn_merges.__wrapped__(20) == learn_merges(160)[:20]


def test_merges_fire(hf):
    md = tiny_tokenizer_metadata()
    n_bytes = len(tiny_tokenizer.CORPUS.encode())
    ids = hf.encode(tiny_tokenizer.CORPUS).ids
    assert len(ids) < 0.55 * n_bytes  # bytes alone: 1.0
    merged = {i for i in ids if i >= 256}
    assert len(merged) > 0.6 * (len(md["tokenizer.ggml.merges"]))
    unseen = "Then the other model will return the value to the forest."
    assert len(hf.encode(unseen).ids) < 0.6 * len(unseen)


@pytest.mark.parametrize("text", [
    "", " ", "hello", "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n\n",
    "naïve café — “quotes”", "日本語のテキスト", "emoji 🎉👍🏽👨‍👩‍👧 flags 🇫🇷",
    "e\u0301 combining",
    "def f(x):\n    return x ** 2  # comment", "<|im_start|>user\nhi<|im_end|>\n", "\x00\x01\x7f",
])
def test_round_trip_examples(hf, text):
    ids = hf.encode(text).ids
    assert hf.decode(ids, skip_special_tokens=False) == text


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_any_text(hf, text):
    assert hf.decode(hf.encode(text).ids, skip_special_tokens=False) == text


def test_chat_template_renders_chatml(hf):
    md = tiny_tokenizer_metadata()
    template = jinja2.Environment().from_string(md["tokenizer.chat_template"])
    text = template.render(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = hf.encode(text).ids
    assert ids.count(md["tokenizer.ggml.tokens"].index("<|im_start|>")) == 3
