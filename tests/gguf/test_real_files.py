"""luce's GGUF reader and quant codecs on the real Qwen2.5-Coder files (`make models`).

Skips when the files are absent. Expected facts come from /work/shared/MODELS.md; decoded
values are compared bit for bit (as uint32) with `gguf.quants.dequantize`. The default run
checks every tensor of one full tensor per quant type per file plus sampled rows of the
largest ones; `-m real` decodes every tensor completely and checks the tensor table against
`gguf.GGUFReader` (slow to open: ~40 s for both files).
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from luce.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, find_model  # noqa: E402
from luce.gguf import quants as luce_quants  # noqa: E402
from luce.gguf.reader import GGUFModel  # noqa: E402

# MODELS.md, "Real weights available here"
FACTS = {
    "target": dict(file=DEFAULT_TARGET, size=1_117_320_768, n_layer=28, hidden=1536, ffn=8960,
                   n_head=12, n_head_kv=2, head_dim=128,
                   qtypes={Q.Q4_K, Q.Q6_K, Q.F32}, token_embd=Q.Q4_K, output=Q.Q6_K),
    "draft": dict(file=DEFAULT_DRAFT, size=491_400_064, n_layer=24, hidden=896, ffn=4864,
                  n_head=14, n_head_kv=2, head_dim=64,
                  qtypes={Q.Q5_0, Q.Q8_0, Q.Q6_K, Q.Q4_K, Q.F32}, token_embd=None, output=None),
}
VOCAB = 151_936
SAMPLED_ROWS = 48
ROW_CHUNK = 8192


def open_model(role: str) -> GGUFModel:
    path = find_model(FACTS[role]["file"])
    if path is None:
        pytest.skip(f"{FACTS[role]['file']} not in the model cache (run `make models`)")
    return GGUFModel(path)


@pytest.fixture(scope="module", params=["target", "draft"])
def role(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(role):
    m = open_model(role)
    yield m
    m.close()


def rows_view(m: GGUFModel, name: str) -> tuple[np.ndarray, int]:
    """The tensor's bytes as u8 [rows, row_nbytes] and its row length in values."""
    info = m.tensors[name]
    n = info.shape[-1]
    rows = int(np.prod(info.shape[:-1], dtype=np.int64))
    return m.raw(name).reshape(rows, info.nbytes // rows), n


def assert_same_decode(m: GGUFModel, name: str, rows: np.ndarray | None = None) -> None:
    """luce vs gguf on the given rows (all when None), compared as uint32 bit patterns."""
    info = m.tensors[name]
    raw, n = rows_view(m, name)
    chunks = [slice(s, s + ROW_CHUNK) for s in range(0, raw.shape[0], ROW_CHUNK)] \
        if rows is None else [np.asarray(rows)]
    for sel in chunks:
        part = np.ascontiguousarray(raw[sel])
        ours = luce_quants.dequantize(part, info.qtype, (part.shape[0], n))
        ref = np.asarray(gguf_quants.dequantize(part, info.qtype), dtype=np.float32)
        ref = ref.reshape(part.shape[0], n)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        ours_bits, ref_bits = ours.view(np.uint32), ref.view(np.uint32)
        if not np.array_equal(ours_bits, ref_bits):
            bad = tuple(int(i) for i in np.argwhere(ours_bits != ref_bits)[0])
            raise AssertionError(f"{m.path.name} {name} ({info.qtype.name}) differs from gguf at "
                                 f"local row/col {bad}: {ours[bad]!r} vs "
                                 f"{ref[bad]!r}")


def by_qtype(m: GGUFModel) -> dict:
    groups: dict = {}
    for info in m.tensors.values():
        groups.setdefault(info.qtype, []).append(info)
    return {q: sorted(infos, key=lambda i: (i.nbytes, i.name)) for q, infos in groups.items()}


# ---------------------------------------------------------------- metadata and table


def test_config_matches_models_md(role, model):
    f, c = FACTS[role], model.config
    assert model.path.stat().st_size == f["size"]
    assert (c.arch, c.n_layer, c.hidden, c.ffn) == ("qwen2", f["n_layer"], f["hidden"], f["ffn"])
    assert (c.n_head, c.n_head_kv, c.head_dim, c.vocab) == (
        f["n_head"], f["n_head_kv"], f["head_dim"], VOCAB)
    assert c.rope_theta == 1e6 and np.float32(c.rms_eps) == np.float32(1e-6)
    assert c.rope_dim == f["head_dim"] and c.rope_sections == ()
    assert c.qkv_bias and not c.qk_norm and not c.tied_embeddings and not c.is_hybrid
    assert c.full_attention_layers == tuple(range(f["n_layer"]))


def test_tokenizer_metadata_matches_models_md(model):
    md = model.metadata
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen2"
    assert md["tokenizer.ggml.bos_token_id"] == 151643
    assert md["tokenizer.ggml.eos_token_id"] == 151645
    assert len(md["tokenizer.ggml.tokens"]) == VOCAB
    assert "<|im_start|>" in md["tokenizer.chat_template"]


def test_both_files_share_the_token_array():
    target, draft = open_model("target"), open_model("draft")
    try:
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            assert target.metadata[key] == draft.metadata[key], key
    finally:
        target.close()
        draft.close()


def expected_shapes(f: dict) -> dict[str, tuple[int, ...]]:
    """Every qwen2 tensor and its numpy shape, from the MODELS.md sizes."""
    h, ffn = f["hidden"], f["ffn"]
    q, kv = f["n_head"] * f["head_dim"], f["n_head_kv"] * f["head_dim"]
    shapes = {"token_embd.weight": (VOCAB, h), "output.weight": (VOCAB, h),
              "output_norm.weight": (h,)}
    for i in range(f["n_layer"]):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_norm.weight": (h,), b + "ffn_norm.weight": (h,),
            b + "attn_q.weight": (q, h), b + "attn_q.bias": (q,),
            b + "attn_k.weight": (kv, h), b + "attn_k.bias": (kv,),
            b + "attn_v.weight": (kv, h), b + "attn_v.bias": (kv,),
            b + "attn_output.weight": (h, q),
            b + "ffn_gate.weight": (ffn, h), b + "ffn_up.weight": (ffn, h),
            b + "ffn_down.weight": (h, ffn),
        })
    return shapes


def test_tensor_table(role, model):
    f = FACTS[role]
    assert {n: i.shape for n, i in model.tensors.items()} == expected_shapes(f)
    assert {i.qtype for i in model.tensors.values()} == f["qtypes"]
    for name, want in (("token_embd.weight", f["token_embd"]), ("output.weight", f["output"])):
        if want is not None:
            assert model.tensors[name].qtype == want
    # tensors are 1-D F32 vectors exactly when they are norms or biases
    for name, info in model.tensors.items():
        assert (info.qtype == Q.F32) == (len(info.shape) == 1), name
    # the data region is the tensors back to back (aligned) up to the end of the file
    infos = sorted(model.tensors.values(), key=lambda i: i.offset)
    a = model.alignment
    for prev, nxt in zip(infos, infos[1:]):
        assert nxt.offset == -(-(prev.offset + prev.nbytes) // a) * a, (prev.name, nxt.name)
    assert infos[-1].offset + infos[-1].nbytes == model.path.stat().st_size


# ---------------------------------------------------------------- dequantize parity


def test_one_full_tensor_per_quant_type(role, model):
    groups = by_qtype(model)
    assert set(groups) == FACTS[role]["qtypes"]
    for qtype, infos in groups.items():
        chosen = infos if qtype == Q.F32 else infos[:1]     # F32: all norms and biases
        for info in chosen:
            assert_same_decode(model, info.name)


def test_sampled_rows_of_the_largest_tensors(model):
    rng = np.random.default_rng(1234)
    names = {infos[-1].name for infos in by_qtype(model).values() if len(infos[-1].shape) == 2}
    names |= {"token_embd.weight", "output.weight", "blk.0.ffn_down.weight"}
    for name in sorted(names):
        n_rows = model.tensors[name].shape[0]
        rows = np.unique(np.concatenate([
            [0, n_rows - 1], rng.choice(n_rows, size=min(SAMPLED_ROWS, n_rows), replace=False)]))
        assert_same_decode(model, name, rows)


def test_reader_dequantize_matches_gguf(model):
    name = "blk.1.attn_v.weight"
    info = model.tensors[name]
    ours = model.dequantize(name, expect_shape=info.shape)
    ref = np.asarray(gguf_quants.dequantize(np.asarray(model.raw(name)).reshape(info.shape[0], -1),
                                            info.qtype), dtype=np.float32)
    assert ours.shape == info.shape
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    assert np.isfinite(ours).all() and np.abs(ours).max() > 0


@pytest.mark.real
def test_every_tensor_decodes_like_gguf(model):
    for name in sorted(model.tensors):
        assert_same_decode(model, name)


@pytest.mark.real
def test_tensor_table_matches_gguf_reader(model):
    reader = gguf.GGUFReader(model.path)
    theirs = {t.name: t for t in reader.tensors}
    assert set(theirs) == set(model.tensors)
    for name, info in model.tensors.items():
        t = theirs[name]
        assert info.qtype == t.tensor_type, name
        assert info.shape == tuple(int(d) for d in reversed(t.shape)), name
        assert (info.offset, info.nbytes) == (t.data_offset, t.n_bytes), name
    for key in ("qwen2.block_count", "qwen2.embedding_length", "qwen2.rope.freq_base",
                "tokenizer.ggml.bos_token_id", "tokenizer.chat_template"):
        assert reader.fields[key].contents() == model.metadata[key], key
