"""Dense qwen2/qwen3 against transformers on tiny random models (tools/hf_oracle_dense.py),
plus the step interface: incremental decode, chunked prefill and mixed batches must give
bitwise the rows a full prefill gives."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import dataclasses

from luce.models import SegmentSpec, build_batch, generate_greedy, load_model, register_arch
from luce.models.loader import model_class

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "dense"


def _load_oracle():
    spec = importlib.util.spec_from_file_location("hf_oracle_dense", ROOT / "tools" / "hf_oracle_dense.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hf_oracle_dense", module)
    spec.loader.exec_module(module)
    return module


ORACLE = _load_oracle()
NAMES = list(ORACLE.CONFIGS)


def transformers_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def assert_logits_close(got, want, what):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


@pytest.fixture(scope="module")
def reference(request):
    """name -> fixture arrays; recomputed with transformers when it is installed (and then the
    stored fixture must agree with it, so a stale fixture fails)."""
    cache = {}

    def get(name):
        if name not in cache:
            stored = dict(np.load(FIXTURES / f"{name}.npz"))
            if transformers_available():
                fresh = ORACLE.run_oracle(name)
                assert np.array_equal(fresh["tokens"], stored["tokens"])
                for key in ("prefill_logits", "incr_logits", "captured"):
                    assert_logits_close(stored[key], fresh[key], f"stored fixture {name}.npz is stale: {key}")
                stored = fresh
            cache[name] = stored
        return cache[name]

    return get


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            path = ORACLE.write_gguf(name, tmp_path_factory.mktemp("dense") / f"{name}.gguf")
            cache[name] = load_model(path, "cpu")
        return cache[name]

    return get


def prefill(m, tokens, pages, capture=()):
    state = m.new_state(max_pages=max(pages) + 1, max_slots=1)
    batch = build_batch([SegmentSpec(0, list(tokens), 0, pages, logits="all")], capture_layers=capture)
    return m.forward(batch, state)


@pytest.mark.parametrize("name", NAMES)
def test_prefill_matches_transformers(name, model, reference):
    ref, m = reference(name), model(name)
    layers = ref["capture_layers"].tolist()
    out = prefill(m, ref["tokens"], pages=[5, 0, 3], capture=layers)  # scattered, out of order
    assert out.logits.shape == ref["prefill_logits"].shape and out.logits.dtype == np.float32
    assert_logits_close(out.logits, ref["prefill_logits"], f"{name} prefill logits")
    for i, il in enumerate(layers):
        assert_logits_close(out.captured[il], ref["captured"][i], f"{name} layer {il} output")


@pytest.mark.parametrize("name", NAMES)
def test_incremental_decode_matches_transformers_and_full_prefill_bitwise(name, model, reference):
    ref, m = reference(name), model(name)
    tokens, p = ref["tokens"], int(ref["incr_prompt_len"])
    steps = len(ref["incr_logits"]) - 1
    pages = [2, 4]
    state = m.new_state(max_pages=5, max_slots=1)
    rows = [m.forward(build_batch([SegmentSpec(0, tokens[:p], 0, pages)]), state).logits[0]]
    for i in range(p, p + steps):
        rows.append(m.forward(build_batch([SegmentSpec(0, tokens[i:i + 1], i, pages)]), state).logits[0])
    rows = np.stack(rows)
    assert_logits_close(rows, ref["incr_logits"], f"{name} incremental logits")
    full = prefill(m, tokens[:p + steps], pages=[1, 3]).logits
    assert np.array_equal(rows, full[p - 1:p + steps]), "decode rows differ from the same rows in a prefill"


def test_chunked_prefill_and_mixed_batch_are_bitwise_invariant(model, reference):
    name = "qwen2_bias"
    m, tokens = model(name), reference(name)["tokens"]
    alone = prefill(m, tokens, pages=[0, 1, 2]).logits
    other = tokens[::-1].copy()
    other_alone = prefill(m, other[:21], pages=[0, 1]).logits

    state = m.new_state(max_pages=8, max_slots=3)
    a_pages, b_pages = [6, 1, 4], [0, 7]
    # step 1: padding rows, 17 rows of A (crosses a page), 9 rows of B
    step1 = build_batch([SegmentSpec(-1, [0, 0], 0, []), SegmentSpec(2, tokens[:17], 0, a_pages, "all"),
                         SegmentSpec(0, other[:9], 0, b_pages, "all")])
    out1 = m.forward(step1, state).logits
    # step 2: B's next 12 rows before A's remaining 20
    step2 = build_batch([SegmentSpec(0, other[9:21], 9, b_pages, "all"),
                         SegmentSpec(2, tokens[17:], 17, a_pages, "all")])
    out2 = m.forward(step2, state).logits
    assert np.array_equal(np.concatenate([out1[:17], out2[12:]]), alone)
    assert np.array_equal(np.concatenate([out1[17:], out2[:12]]), other_alone)


def test_generate_greedy_follows_argmax_of_full_forward(model):
    m = model("qwen3_gqa")
    prompt = [3, 17, 42, 99, 5]
    out = generate_greedy(m, prompt, 20)
    full = prefill(m, prompt + out[:-1], pages=[0, 1]).logits
    assert out == np.argmax(full[len(prompt) - 1:], axis=1).tolist()


@pytest.mark.parametrize("arch,mix", [("qwen3", "q8_0"), ("qwen2", "q4_k_m")])
def test_quantized_tiny_models_load_and_decode_consistently(arch, mix, tmp_path):
    from luce.testing.tiny_models import make_dense

    path = tmp_path / f"{arch}.gguf"
    config = make_dense(path, arch=arch, seed=3, quant_mix=mix)
    m = load_model(path, "cpu")
    assert m.config == config
    prompt = list(range(1, 20))
    out = generate_greedy(m, prompt, 6)
    full = prefill(m, prompt + out[:-1], pages=[0, 1]).logits
    assert np.isfinite(full).all()
    assert out == np.argmax(full[len(prompt) - 1:], axis=1).tolist()


# ---- interface --------------------------------------------------------------------------

def test_build_batch_layout():
    b = build_batch([SegmentSpec(1, [7, 8, 9], 14, [3, 5]), SegmentSpec(-1, [0], 0, []),
                     SegmentSpec(0, [4], 0, [2], logits="all")], capture_layers=[1])
    assert b.token_ids.tolist() == [7, 8, 9, 0, 4] and b.positions.tolist() == [14, 15, 16, 0, 0]
    assert b.qo_indptr.tolist() == [0, 3, 4, 5] and b.seq_slots.tolist() == [1, -1, 0]
    assert b.kv_indptr.tolist() == [0, 2, 2, 3] and b.kv_indices.tolist() == [3, 5, 2]
    assert b.kv_last_page_len.tolist() == [1, 0, 1] and b.logits_indices.tolist() == [2, 4]
    pages, offsets, kv_index = b.row_kv_locations()
    assert pages.tolist() == [3, 3, 5, -1, 2] and offsets.tolist() == [14, 15, 0, -1, 0]
    assert kv_index.tolist() == [14, 15, 16, -1, 0]
    b.validate()


def test_validate_names_the_problem():
    good = build_batch([SegmentSpec(0, [1, 2, 3], 5, [0])])
    bad = dataclasses.replace(good, positions=np.array([5, 6, 9], np.int32))
    with pytest.raises(ValueError, match="positions"):
        bad.validate()
    bad = dataclasses.replace(good, kv_last_page_len=np.array([2], np.int32))
    with pytest.raises(ValueError, match="3 rows but only 2 KV rows"):
        bad.validate()
    with pytest.raises(ValueError, match="node 0 is the root"):
        dataclasses.replace(good, segment_kind=None, tree_parents=np.zeros(3, np.int32)).validate()
    with pytest.raises(ValueError, match="need 2 pages"):
        build_batch([SegmentSpec(0, [1] * 3, 15, [0])])


def test_loader_registry():
    with pytest.raises(ValueError, match="no model for GGUF arch 'llama'"):
        model_class("llama")
    with pytest.raises(TypeError, match="from_gguf"):
        register_arch("nothing", object)
    assert model_class("qwen2").__name__ == "DenseModel"
