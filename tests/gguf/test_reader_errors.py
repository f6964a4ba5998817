"""GGUFModel on broken files: each corruption raises its GGUFError subclass, and the message
names the file and the key or tensor at fault. Files are tiny valid models (see
test_reader.write_tiny_model) corrupted after writing."""
from __future__ import annotations

import pickle
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T

from luce.gguf.errors import (GGUFError, MissingKeyError, MissingTensorError, NotGGUFError,
                              TensorShapeError, TruncatedGGUFError, UnsupportedArchError,
                              UnsupportedQuantError)
from luce.gguf.reader import GGUFModel, read_config
from tests.gguf.test_reader import write_tiny_model

ARCHS = ["qwen2", "qwen3", "qwen35", "dflash"]


def raises(exc_type: type, path: Path, *names: str, **kw) -> GGUFError:
    """Open `path`, expect exc_type whose message names the file and every one of `names`."""
    with pytest.raises(exc_type) as info:
        GGUFModel(path, **kw)
    msg = str(info.value)
    assert str(path) in msg and info.value.file == str(path), msg
    for name in names:
        assert name in msg, f"{name!r} not in: {msg}"
    assert "To fix:" in msg, msg
    return info.value


@pytest.fixture
def model_file(tmp_path):
    def make(arch: str = "qwen2", **kw) -> Path:
        path = tmp_path / f"{arch}.gguf"
        write_tiny_model(path, arch, **kw)
        return path
    return make


def _cut(path: Path, n: int) -> Path:
    out = path.with_name(f"cut{n}-{path.name}")
    out.write_bytes(path.read_bytes()[:n])
    return out


# --- not a GGUF file ------------------------------------------------------------------------

def test_missing_path(tmp_path):
    raises(NotGGUFError, tmp_path / "nope.gguf", "no such file")


def test_directory(tmp_path):
    raises(NotGGUFError, tmp_path, "directory")


def test_empty_file(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    raises(NotGGUFError, tmp_path / "empty.gguf", "empty")


def test_bad_magic(model_file):
    path = model_file()
    data = bytearray(path.read_bytes())
    data[:4] = b"GGML"
    path.write_bytes(bytes(data))
    err = raises(NotGGUFError, path, "magic", "b'GGML'")
    assert err.expected == "b'GGUF'"


def test_text_file_is_not_gguf(tmp_path):
    (tmp_path / "x.gguf").write_text("hello, this is not a model\n")
    raises(NotGGUFError, tmp_path / "x.gguf", "magic")


def test_unsupported_version(model_file):
    path = model_file()
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 1)
    path.write_bytes(bytes(data))
    err = raises(NotGGUFError, path, "version")
    assert err.found == 1


# --- truncation -----------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_truncated_at_structural_points(model_file, arch):
    path = model_file(arch)
    oracle = gguf.GGUFReader(path)  # locates the fields and tensors independently
    kv = [f for k, f in oracle.fields.items() if not k.startswith("GGUF.")]
    data_end = max(t.data_offset + t.n_bytes for t in oracle.tensors)
    last = max(oracle.tensors, key=lambda t: t.data_offset)
    points = {
        6: "offset 4",                            # inside the version
        20: "offset 16",                          # inside the counts
        kv[1].offset + 3: "offset",               # inside a metadata key's length
        kv[-1].offset + 12: "offset",             # inside the last metadata entry
        oracle.tensors[0].field.offset + 5: "offset",  # inside the tensor table
        oracle.data_offset: oracle.tensors[0].name,    # tensor table complete, no data
        last.data_offset + last.n_bytes // 2: last.name,  # half of the last tensor
        data_end - 1: last.name,                  # one byte short
    }
    for n, named in points.items():
        err = raises(TruncatedGGUFError, _cut(path, n), named)
        assert "incomplete" in str(err) and str(n) in str(err)


def test_every_header_truncation_is_reported_as_truncated(model_file):
    path = model_file("qwen35")
    oracle = gguf.GGUFReader(path)
    data = path.read_bytes()
    cut = path.with_name("cut.gguf")
    for n in range(4, oracle.data_offset + 1, 7):  # every 7th byte: all fields, 1/7 of the cost
        cut.write_bytes(data[:n])
        with pytest.raises(TruncatedGGUFError) as info:
            GGUFModel(cut)
        assert str(cut) in str(info.value)


def test_data_truncation_is_found_before_reading_any_data(model_file, monkeypatch):
    path = model_file()
    cut = _cut(path, path.stat().st_size - 4096)
    import luce.gguf.reader as reader

    monkeypatch.setattr(reader, "_dequantize_bytes", lambda *a: pytest.fail("data touched"))
    raises(TruncatedGGUFError, cut, "tensor data runs past the end of the file")


def test_random_header_corruption_raises_only_gguf_errors(model_file):
    # flipping any header byte must give a GGUFError (or a valid open), never a raw
    # KeyError / IndexError / struct.error / numpy error, and never a hang
    path = model_file("qwen35")
    header_end = gguf.GGUFReader(path).data_offset
    data = path.read_bytes()
    rng = np.random.default_rng(7)
    bad = path.with_name("bad.gguf")
    kinds = set()
    for _ in range(300):
        b = bytearray(data)
        for pos in rng.integers(0, header_end, size=rng.integers(1, 4)):
            b[pos] = int(rng.integers(0, 256))
        bad.write_bytes(bytes(b))
        try:
            GGUFModel(bad).close()
        except GGUFError as e:
            assert str(bad) in str(e)
            kinds.add(type(e).__name__)
    assert len(kinds) >= 3, kinds  # the corruptions reached several different checks


# --- metadata -------------------------------------------------------------------------------

def test_unsupported_arch(model_file):
    path = model_file(set_keys={"general.architecture": ("llama", T.STRING)})
    err = raises(UnsupportedArchError, path, "general.architecture", "llama",
                 "qwen35", "qwen2", "qwen3", "dflash")
    assert err.key == "general.architecture" and err.found == "llama"


def test_missing_architecture_key(model_file):
    raises(MissingKeyError, model_file(drop_keys=["general.architecture"]), "general.architecture")


@pytest.mark.parametrize("arch, key", [
    ("qwen2", "qwen2.block_count"), ("qwen2", "qwen2.embedding_length"),
    ("qwen2", "qwen2.feed_forward_length"), ("qwen2", "qwen2.attention.head_count"),
    ("qwen2", "qwen2.attention.layer_norm_rms_epsilon"), ("qwen2", "qwen2.context_length"),
    ("qwen3", "qwen3.block_count"),
    ("qwen35", "qwen35.ssm.conv_kernel"), ("qwen35", "qwen35.ssm.state_size"),
    ("qwen35", "qwen35.ssm.group_count"), ("qwen35", "qwen35.ssm.time_step_rank"),
    ("qwen35", "qwen35.ssm.inner_size"), ("qwen35", "qwen35.rope.dimension_sections"),
    ("dflash", "dflash.target_layers"), ("dflash", "dflash.embedding_length"),
])
def test_missing_required_key(model_file, arch, key):
    err = raises(MissingKeyError, model_file(arch, drop_keys=[key]), key)
    assert err.key == key


@pytest.mark.parametrize("key, value, vtype", [
    ("qwen2.attention.head_count_kv", 3, T.UINT32),         # does not divide 4 heads
    ("qwen2.block_count", 0, T.UINT32),
    ("qwen2.attention.layer_norm_rms_epsilon", -1.0, T.FLOAT32),
    ("qwen2.embedding_length", "64", T.STRING),
    ("qwen2.feed_forward_length", [256, 128], T.ARRAY),     # per-layer values that differ
    ("qwen2.rope.dimension_count", 17, T.UINT32),           # odd rotary width
])
def test_invalid_metadata_value(model_file, key, value, vtype):
    err = raises(GGUFError, model_file(set_keys={key: (value, vtype)}), key)
    assert err.key == key


def test_inconsistent_ssm_inner_size(model_file):
    raises(GGUFError, model_file("qwen35", set_keys={"qwen35.ssm.inner_size": (48, T.UINT32)}),
           "qwen35.ssm.inner_size", "48")


def test_dflash_target_layers_must_be_hidden_state_indices(model_file):
    raises(GGUFError, model_file("dflash", set_keys={"dflash.target_layers": ([0, 3], T.ARRAY)}),
           "dflash.target_layers")


# --- tensors --------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, name, shape", [
    ("qwen2", "token_embd.weight", (160, 32)),              # hidden 32, metadata says 64
    ("qwen2", "token_embd.weight", (150, 64)),              # 150 rows, tokenizer has 160
    ("qwen2", "blk.1.attn_q.weight", (32, 64)),             # rows != n_head*head_dim
    ("qwen2", "blk.0.attn_k.bias", (64,)),
    ("qwen3", "blk.1.attn_q_norm.weight", (16,)),
    ("qwen3", "blk.0.ffn_down.weight", (256, 64)),          # transposed
    ("qwen35", "blk.1.attn_q.weight", (128, 64)),           # query without the packed gate
    ("qwen35", "blk.0.attn_qkv.weight", (96, 64)),
    ("qwen35", "blk.2.ssm_conv1d.weight", (128, 3)),
    ("qwen35", "blk.0.ssm_out.weight", (64, 32)),
    ("dflash", "fc.weight", (64, 192)),                     # 3 hidden widths, 2 target layers
    ("dflash", "enc.output_norm.weight", (32,)),
])
def test_tensor_shape_mismatch(model_file, arch, name, shape):
    err = raises(TensorShapeError, model_file(arch, shapes={name: shape}), name,
                 str(list(shape)))
    assert err.key == name and err.found == list(shape)


@pytest.mark.parametrize("arch, name", [
    ("qwen2", "token_embd.weight"), ("qwen2", "blk.1.ffn_up.weight"),
    ("qwen2", "blk.1.attn_v.bias"), ("qwen3", "blk.0.attn_k_norm.weight"),
    ("qwen35", "blk.0.ssm_a"), ("qwen35", "blk.3.attn_k.weight"),
    ("qwen35", "blk.2.post_attention_norm.weight"), ("dflash", "fc.weight"),
    ("dflash", "output_norm.weight"),
])
def test_missing_tensor(model_file, arch, name):
    err = raises(MissingTensorError, model_file(arch, drop_tensors={name}), name)
    assert err.key == name


@pytest.mark.parametrize("name, qtype", [("blk.0.attn_q.weight", Q.Q4_0),
                                         ("blk.1.ffn_down.weight", Q.Q2_K),
                                         ("token_embd.weight", Q.Q4_1)])
def test_unsupported_quant_type(model_file, name, qtype):
    from luce.gguf.quants import SUPPORTED
    err = raises(UnsupportedQuantError, model_file(qtypes={name: qtype}), name, qtype.name,
                 "llama-quantize", *(t.name for t in SUPPORTED))
    assert err.found == qtype.name


def test_unknown_tensor_type_id(model_file):
    path = model_file()
    data = bytearray(path.read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, 99)
    path.write_bytes(bytes(data))
    raises(UnsupportedQuantError, path, "blk.0.attn_q.weight", "type id 99")


# --- accessors ------------------------------------------------------------------------------

def test_accessor_errors_name_file_and_subject(model_file):
    path = model_file()
    m = GGUFModel(path)
    with pytest.raises(MissingKeyError, match="qwen2.no_such_key") as info:
        m.get("qwen2.no_such_key")
    assert str(path) in str(info.value)
    with pytest.raises(MissingTensorError, match=r"blk\.9\.attn_q\.weight") as info:
        m.tensor_info("blk.9.attn_q.weight")
    assert str(path) in str(info.value)
    with pytest.raises(TensorShapeError, match=r"expected \[64, 32\], found \[64, 64\]"):
        m.dequantize("blk.0.attn_q.weight", expect_shape=(64, 32))
    m.close()
    with pytest.raises(GGUFError, match="closed"):
        m.raw("blk.0.attn_q.weight")


def test_read_config_raises_the_same_errors(model_file):
    with pytest.raises(UnsupportedArchError):
        read_config(model_file(set_keys={"general.architecture": ("gemma3", T.STRING)}))


def test_errors_are_value_errors_and_pickle_intact(tmp_path):
    err = raises(NotGGUFError, tmp_path / "missing.gguf")
    assert isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NotGGUFError and str(back) == str(err) and back.file == err.file
