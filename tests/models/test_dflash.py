"""DFlash draft (luce.models.dflash) against z-lab's reference `dflash` package.

The reference runs live (tools/dflash_oracle.py) when torch, transformers and dflash import;
otherwise the stored fixture tests/fixtures/dflash/reference.npz (its recorded calls) is
used. Either way the draft weights are rebuilt here from the stored seed and spec, converted
with luce.testing.dflash_convert and written as a GGUF, so no .gguf is ever committed.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from luce.gguf.reader import GGUFModel
from luce.gguf.writer import write_model
from luce.models import SegmentSpec, build_batch, load_model, pages_needed
from luce.models.dflash import DFlashDraft, TargetHead, features_from_captured
from luce.models.dflash2 import DFlash2Draft
from luce.testing.dflash_convert import (convert_qwen3_target, convert_reference_draft,
                                         qwen3_target_config, random_qwen3_target_state,
                                         random_reference_state, random_target_head,
                                         reference_hf_config, tiny_draft_spec)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "dflash" / "reference.npz"
SEED = 1234
# float32 torch vs the numpy reference backend (float64 inside norms/attention): measured
# worst 5.3e-7 of the largest |logit|
REL_TOL = 1e-5


def _load_oracle():
    spec = importlib.util.spec_from_file_location("dflash_oracle", ROOT / "tools" / "dflash_oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORACLE = _load_oracle()


def _reference_importable() -> bool:
    try:
        import dflash.model  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception:
        return False
    return True


LIVE = _reference_importable()


@pytest.fixture(scope="module")
def stored():
    return ORACLE.load_fixture(FIXTURE)


@pytest.fixture(scope="module")
def reference(stored):
    if not LIVE:
        return stored
    return {name: ORACLE.run_scenario(name, stored[name]["seed"]) for name in sorted(ORACLE.SCENARIOS)}


def build_draft(tmp_path: Path, spec: dict, seed: int, name: str = "draft") -> DFlashDraft:
    """Reference weights (seed) -> converter -> GGUF -> load_model (DFlash2Draft for DFlash2)."""
    parts = convert_reference_draft(random_reference_state(spec, seed), reference_hf_config(spec))
    path = tmp_path / f"{name}.gguf"
    write_model(path, parts.config, parts.tensors, "f32", None, parts.metadata)
    embedding, output = random_target_head(spec, seed)
    return load_model(path, "cpu", target_model=TargetHead(embedding, output))


def assert_logits_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < REL_TOL, f"{what}: max |diff| / max |logit| = {err:.2e}"


@pytest.mark.parametrize("scenario", sorted(ORACLE.SCENARIOS))
def test_draft_logits_match_reference(tmp_path, reference, scenario):
    """Replays every reference draft call (same features, same block, same cache history)."""
    ref = reference[scenario]
    draft = build_draft(tmp_path, ref["spec"], ref["seed"])
    seq = draft.new_sequence(64)
    for i, call in enumerate(ref["calls"]):
        ids, n_new = call["block_ids"], len(call["features"])
        assert ids.tolist() == draft.block_tokens(int(ids[0]), len(ids)), "reference block is not [last, MASK...]"
        # the reference's positions: new context rows, then the block, right after our cache
        want_positions = np.arange(seq.n_context, seq.n_context + n_new + len(ids))
        assert call["positions"].tolist() == want_positions.tolist(), f"call {i}: positions"
        logits = draft.propose(seq, call["features"], int(ids[0]), len(ids))
        assert_logits_close(logits, call["logits"], f"{scenario} call {i}")
    assert seq.n_context == sum(len(c["features"]) for c in ref["calls"])


def speculative_greedy(target, draft, prompt: list[int], max_new_tokens: int):
    """dflash_generate's greedy loop on luce models -> (output ids, draft logits per pass)."""
    block_size, be, layers = draft.block_size, target.backend, draft.target_layers
    max_length = len(prompt) + max_new_tokens
    state = target.new_state(max_pages=pages_needed(max_length + block_size), max_slots=1)
    pages = list(range(state.max_pages))
    seq = draft.new_sequence(max_length + block_size)
    out = target.forward(build_batch([SegmentSpec(0, prompt, 0, pages)], capture_layers=layers), state)
    output = list(prompt) + [int(be.argmax(out.logits)[0])]
    features = features_from_captured(out.captured, layers, be)
    start, draft_logits = len(prompt), []
    while start + 1 < max_length:
        verify = min(block_size, max_length - start)
        logits = draft.propose(seq, features, output[start], verify)
        draft_logits.append(logits)
        block = [output[start]] + be.argmax(logits).tolist()
        out = target.forward(build_batch([SegmentSpec(0, block, start, pages, logits="all")],
                                         capture_layers=layers), state)
        posterior = be.argmax(out.logits).tolist()
        accepted = next((i for i in range(verify - 1) if block[i + 1] != posterior[i]), verify - 1)
        output[start + 1:] = block[1:accepted + 1] + [posterior[accepted]]
        produced = min(accepted + 1, max_length - start - 1)
        start += produced
        features = features_from_captured(out.captured, layers, be)[:produced]
    return output[:min(start + 1, max_length)], draft_logits


def test_speculative_loop_on_luce_target_reproduces_reference(tmp_path, reference):
    """End to end: luce's qwen3 target (captured layer outputs -> features) and the draft,
    in dflash_generate's greedy loop, emit the reference's tokens; every draft pass matches."""
    ref = reference["generate"]
    spec, seed = ref["spec"], ref["seed"]
    target_path = tmp_path / "target.gguf"
    write_model(target_path, qwen3_target_config(spec), convert_qwen3_target(random_qwen3_target_state(spec, seed)))
    target = load_model(target_path, "cpu")
    draft = load_model(build_draft(tmp_path, spec, seed).gguf.path, "cpu", target_model=target)
    prompt = ref["output_ids"][:ref["args"]["prompt_len"]].tolist()
    output, draft_logits = speculative_greedy(target, draft, prompt, ref["args"]["max_new_tokens"])
    assert output == ref["output_ids"].tolist()
    assert len(draft_logits) == len(ref["calls"])
    for i, (got, call) in enumerate(zip(draft_logits, ref["calls"])):
        assert_logits_close(got, call["logits"], f"draft pass {i}")


def test_dflash2_selector_chain_matches_reference(tmp_path, reference):
    """DFlash2: logits (with the convolutions), the candidate sets, their scores along the
    chain and the greedy chain itself equal the reference selector's."""
    ref = reference["dflash2"]
    draft = build_draft(tmp_path, ref["spec"], ref["seed"])
    assert isinstance(draft, DFlash2Draft)
    seq = draft.new_sequence(64)
    for i, call in enumerate(ref["calls"]):
        path = draft.propose_path(seq, call["features"], int(call["block_ids"][0]), len(call["block_ids"]))
        assert_logits_close(path.logits, call["logits"], f"logits {i}")
        np.testing.assert_array_equal(path.candidates, call["candidates"])
        assert_logits_close(path.scores, call["scores"], f"selector scores {i}")
        np.testing.assert_array_equal(path.tokens, call["tokens"])


@pytest.mark.skipif(not LIVE, reason="torch / transformers / dflash not importable")
def test_stored_fixture_matches_live_reference(stored, reference):
    """The fixture the torch-less path relies on is what the reference computes today."""
    assert sorted(stored) == sorted(reference)
    for name in stored:
        assert stored[name]["spec"] == reference[name]["spec"]
        assert len(stored[name]["calls"]) == len(reference[name]["calls"]), name
        for a, b in zip(stored[name]["calls"], reference[name]["calls"]):
            np.testing.assert_array_equal(a["block_ids"], b["block_ids"])
            np.testing.assert_allclose(a["features"], b["features"], rtol=1e-5, atol=1e-5)
            assert_logits_close(a["logits"], b["logits"], f"stored {name}")


DFLASH2 = dict(conv_kernel_size=3, conv_group_size=8, selector_rank=6, selector_top_k=5)


@pytest.mark.parametrize("overrides", [{}, DFLASH2], ids=["dflash", "dflash2"])
def test_slots_batched_in_one_pass_equal_separate_passes(tmp_path, overrides):
    """Engine API: two slots' context injection and blocks in one batch each give bitwise
    the logits of each slot alone (batch invariance; DFlash2's convolutions stay inside
    each block)."""
    spec = tiny_draft_spec(**overrides)
    draft = build_draft(tmp_path, spec, SEED)
    rng = np.random.default_rng(5)
    feats = [rng.standard_normal((n, draft.feature_width)).astype(np.float32) for n in (5, 19)]
    alone = [draft.propose(draft.new_sequence(48), f, last, 4) for f, last in zip(feats, (3, 8))]

    state = draft.new_state(max_pages=6, max_slots=2)
    pages = [[0, 1, 2], [3, 4, 5]]
    ctx = build_batch([SegmentSpec(s, [0] * len(f), 0, pages[s], logits="none") for s, f in enumerate(feats)])
    draft.inject_context(ctx, np.concatenate(feats), state)
    block = build_batch([SegmentSpec(s, draft.block_tokens(last, 4), len(f), pages[s], logits="all")
                         for s, (f, last) in enumerate(zip(feats, (3, 8)))])
    block.logits_indices = np.array([1, 2, 3, 5, 6, 7], dtype=np.int32)
    together = draft.forward(block, state).logits
    np.testing.assert_array_equal(together[:3], alone[0])
    np.testing.assert_array_equal(together[3:], alone[1])


def test_truncate_then_same_context_gives_same_logits(tmp_path):
    """A rolled-back context (truncate) re-fed with the same rows reproduces the pass, and a
    block's own K/V never leak into the next pass as context."""
    draft = build_draft(tmp_path, tiny_draft_spec(), SEED)
    rng = np.random.default_rng(9)
    prompt, more = (rng.standard_normal((n, draft.feature_width)).astype(np.float32) for n in (6, 3))
    seq = draft.new_sequence(32)
    draft.propose(seq, prompt, 1)
    first = draft.propose(seq, more, 2)
    draft.propose(seq, rng.standard_normal((2, draft.feature_width)), 4)
    seq.truncate(6)
    np.testing.assert_array_equal(draft.propose(seq, more, 2), first)
    fresh = draft.new_sequence(32)
    draft.propose(fresh, np.concatenate([prompt, more]), 5)  # a different block at the same place
    np.testing.assert_array_equal(draft.propose(fresh, np.zeros((0, draft.feature_width)), 2), first)


def test_converter_writes_llama_cpp_names_and_keys(tmp_path):
    spec = tiny_draft_spec(layer_types=["sliding_attention", "full_attention"], sliding_window=5,
                           output_multiplier=0.5)
    state = random_reference_state(spec, SEED)
    parts = convert_reference_draft({"model." + k: v for k, v in state.items()}, reference_hf_config(spec))
    path = tmp_path / "d.gguf"
    write_model(path, parts.config, parts.tensors, "f32", None, parts.metadata)
    gguf = GGUFModel(path)
    assert gguf.get("dflash.target_layers") == [1, 3]           # HF hidden-state index = layer + 1
    assert gguf.config.target_layers == (0, 2)
    assert (gguf.config.block_size, gguf.config.mask_token_id, gguf.config.vocab) == (4, 95, 96)
    assert gguf.config.extra["swa_layers"] == [True, False] and gguf.config.extra["sliding_window"] == 5
    assert gguf.get("dflash.logit_scale") == pytest.approx(0.5)
    pairs = {"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight",
             "output_norm.weight": "norm.weight", "blk.1.attn_q.weight": "layers.1.self_attn.q_proj.weight",
             "blk.0.ffn_norm.weight": "layers.0.post_attention_layernorm.weight",
             "blk.1.attn_k_norm.weight": "layers.1.self_attn.k_norm.weight",
             "blk.0.ffn_down.weight": "layers.0.mlp.down_proj.weight"}
    for gguf_name, ref_name in pairs.items():
        np.testing.assert_array_equal(gguf.dequantize(gguf_name), state[ref_name])
    assert len(gguf.tensors) == 3 + 11 * spec["n_layer"]


@pytest.mark.parametrize("change, message", [
    (lambda s, h: s.__setitem__("candidate_selector.hidden_projection.weight", np.zeros((2, 32))),
     "DFlash2 draft .* without dflash_config"),
    (lambda s, h: h.__setitem__("attention_bias", True), "attention_bias"),
    (lambda s, h: s.pop("layers.1.mlp.up_proj.weight"), "layers.1.mlp.up_proj.weight"),
    (lambda s, h: s.__setitem__("layers.0.extra.weight", np.zeros(3)), "unexpected"),
    (lambda s, h: h["dflash_config"].pop("mask_token_id"), "mask_token_id"),
])
def test_converter_rejects_what_the_arch_cannot_express(change, message):
    spec = tiny_draft_spec()
    state, hf = random_reference_state(spec, SEED), reference_hf_config(spec)
    change(state, hf)
    with pytest.raises(ValueError, match=message):
        convert_reference_draft(state, hf)


def test_bad_inputs_are_named(tmp_path):
    draft = build_draft(tmp_path, tiny_draft_spec(), SEED)
    seq = draft.new_sequence(16)
    with pytest.raises(ValueError, match="at least one context row"):
        draft.propose(seq, np.zeros((0, draft.feature_width)), 1)
    with pytest.raises(ValueError, match=r"expected \[T, 64\]"):
        draft.fuse_features(np.zeros((2, 32), dtype=np.float32))
    with pytest.raises(ValueError, match="n_block"):
        draft.propose(seq, np.zeros((1, draft.feature_width)), 1, n_block=5)
    with pytest.raises(ValueError, match="holds 16 rows"):
        draft.propose(seq, np.zeros((13, draft.feature_width)), 1)


def test_load_model_dispatches_and_borrows_target_weights(tmp_path):
    spec = tiny_draft_spec()
    build_draft(tmp_path, spec, SEED)
    embedding, output = random_target_head(spec, SEED)
    target = type("Target", (), {})()  # what luce's dense / qwen35 models expose
    target.token_embd, target.output = embedding, output

    draft = load_model(tmp_path / "draft.gguf", "cpu", target_model=target)
    assert isinstance(draft, DFlashDraft) and draft.target_layers == (0, 2)
    assert draft.head.output is output and draft.head.embedding is embedding
    with pytest.raises(ValueError, match="needs its target"):
        load_model(tmp_path / "draft.gguf", "cpu")
    small = TargetHead(embedding[:, :16], output[:, :16])
    with pytest.raises(ValueError, match="not trained for this target"):
        DFlashDraft(tmp_path / "draft.gguf", small, "numpy")


def test_features_from_captured_follows_target_layer_order(tmp_path):
    draft = build_draft(tmp_path, tiny_draft_spec(target_layers=[2, 0]), SEED)
    a, b = np.ones((3, 32), np.float32), np.full((3, 32), 2.0, np.float32)
    feats = features_from_captured({0: a, 2: b, 1: a * 7}, draft.target_layers, draft.backend)
    np.testing.assert_array_equal(feats, np.concatenate([b, a], axis=1))
    with pytest.raises(KeyError, match="capture_layers"):
        features_from_captured({0: a}, draft.target_layers, draft.backend)
