"""Synthetic models (luce.testing.synthetic_model, tools/make_synthetic_model.py): random
quant blocks of a sane scale, files that match their plan byte for byte, load with
luce.models.load_model and run a forward on the numpy backend."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from luce.gguf.quants import dequantize
from luce.gguf.reader import GGUFModel, read_config
from luce.models import generate_greedy, load_model
from luce.model_paths import DEFAULT_DRAFT, DEFAULT_TARGET, model_path
from luce.testing import synthetic_model as sm
from luce.testing.synthetic_blocks import SYNTHESIZED_TYPES, TARGET_STD, random_tensor_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("qtype", SYNTHESIZED_TYPES, ids=lambda t: t.name)
def test_random_blocks_dequantize_to_sane_values(qtype):
    raw = random_tensor_bytes(qtype, 16, 1024, np.random.default_rng(3))
    x = dequantize(raw, qtype, (16, 1024))
    assert np.isfinite(x).all()
    assert 0.75 * TARGET_STD < x.std() < 1.3 * TARGET_STD
    assert abs(x.mean()) < 0.1 * TARGET_STD
    assert np.abs(x).max() < 10 * TARGET_STD
    assert len(np.unique(x)) > 200          # not a constant or a handful of levels
    # the blocks are valid for the gguf package's independent decoder too
    assert np.array_equal(gguf_dequantize(raw.reshape(16, -1), qtype).reshape(16, 1024), x)


def _write(tmp_path, preset, mix, **kw):
    config = sm.preset_config(preset, tiny=True, **kw)
    plan = sm.plan_synthetic(config, mix, preset)
    path = tmp_path / f"{preset}-{mix}.gguf"
    stats = sm.write_synthetic(path, plan, seed=7)
    return path, plan, stats


def _check_against_plan(path, plan):
    assert path.stat().st_size == sm.predicted_file_size(plan)
    reader = GGUFReader(path)                     # gguf's own reader: ggml order, absolute offsets
    by_name = {t.name: t for t in reader.tensors}
    assert list(by_name) == [t.name for t in plan.tensors]
    data_start = min(int(t.data_offset) for t in reader.tensors)
    for t in plan.tensors:
        r = by_name[t.name]
        assert Q(r.tensor_type) == t.qtype
        assert tuple(int(d) for d in r.shape[::-1]) == t.shape
        assert int(r.data_offset) - data_start == t.offset
        assert int(r.n_bytes) == t.nbytes


@pytest.mark.parametrize("preset,mix", [("qwen36-27b", "iq4_xs"), ("qwen36-27b", "q4_k_m"),
                                        ("qwen2.5-coder-1.5b", "q4_k_m"), ("qwen2.5-coder-0.5b", "iq4_xs")])
def test_tiny_preset_matches_plan_loads_and_runs(tmp_path, preset, mix):
    path, plan, stats = _write(tmp_path, preset, mix)
    _check_against_plan(path, plan)
    assert stats.file_bytes == path.stat().st_size
    assert read_config(path) == plan.config
    kinds = {t.qtype for t in plan.tensors}
    assert Q.Q6_K in kinds and (Q.IQ4_XS if mix == "iq4_xs" else Q.Q4_K) in kinds
    model = load_model(path, backend="numpy")
    tokens = generate_greedy(model, [1, 5, 9, 300], 4)
    assert len(tokens) == 4 and all(0 <= t < plan.config.vocab for t in tokens)


def test_layers_override_keeps_the_hybrid_pattern(tmp_path):
    path, plan, _ = _write(tmp_path, "qwen36-27b", "q4_k_m", n_layer=2)
    assert plan.config.n_layer == 2 and plan.config.recurrent_layers == (True, True)
    model = load_model(path, backend="numpy")
    assert len(generate_greedy(model, [3, 4], 2)) == 2


def test_dflash_draft_loads_against_its_target(tmp_path):
    target_path, target_plan, _ = _write(tmp_path, "qwen36-27b", "iq4_xs")
    config = sm.preset_config("dflash-27b", tiny=True, target=read_config(target_path), block_size=4)
    plan = sm.plan_synthetic(config, "q8_0", "dflash-27b")
    path = tmp_path / "draft.gguf"
    sm.write_synthetic(path, plan)
    _check_against_plan(path, plan)
    target = load_model(target_path, backend="numpy")
    draft = load_model(path, backend="numpy", target_model=target)
    assert draft.target_layers == sm.dflash_target_layers(target_plan.config.n_layer)
    seq = draft.new_sequence(16)
    feats = np.random.default_rng(0).standard_normal((5, draft.feature_width)).astype(np.float32)
    logits = draft.propose(seq, feats, last_token=7)
    assert logits.shape == (3, target_plan.config.vocab) and np.isfinite(logits).all()


def test_full_size_presets_have_the_documented_shapes_and_mixes():
    q36 = sm.preset_config("qwen36-27b")
    assert (q36.n_layer, q36.hidden, q36.ffn, q36.vocab) == (64, 5120, 17408, 248320)
    assert q36.full_attention_layers == tuple(range(3, 64, 4))
    assert sm.preset_config("dflash-27b").target_layers == (1, 16, 31, 46, 61)
    for mix, big in (("q4_k_m", Q.Q4_K), ("iq4_xs", Q.IQ4_XS)):
        types = {t.name: t.qtype for t in sm.plan_synthetic(q36, mix).tensors}
        assert types["output.weight"] == Q.Q6_K
        assert types["blk.8.ffn_gate.weight"] == big
        assert types["blk.0.ssm_conv1d.weight"] == Q.F32
    iq4 = {t.name: t.qtype for t in sm.plan_synthetic(q36, "iq4_xs").tensors}
    assert iq4["blk.0.attn_qkv.weight"] == Q.Q5_K            # n_head / n_head_kv >= 4
    assert iq4["blk.7.ffn_down.weight"] == Q.Q5_K and iq4["blk.8.ffn_down.weight"] == Q.IQ4_XS


def test_workers_do_not_change_the_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(sm, "CHUNK_BYTES", 4096)  # many chunks per tensor
    plan = sm.plan_synthetic(sm.preset_config("qwen2.5-coder-0.5b", tiny=True), "q4_k_m")
    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    sm.write_synthetic(one, plan, seed=1, workers=1)
    sm.write_synthetic(two, plan, seed=1, workers=2)
    assert one.read_bytes() == two.read_bytes()
    sm.write_synthetic(two, plan, seed=2, workers=1)
    assert one.read_bytes() != two.read_bytes()


def test_cli_plan_and_write(tmp_path):
    tool = [sys.executable, str(ROOT / "tools" / "make_synthetic_model.py")]
    plan = subprocess.run(tool + ["qwen2.5-coder-1.5b", "--plan"], capture_output=True, text=True, check=True)
    config = sm.preset_config("qwen2.5-coder-1.5b")
    size = sm.predicted_file_size(sm.plan_synthetic(config, "q4_k_m", "qwen2.5-coder-1.5b"))
    assert f"file size: {size:,} bytes" in plan.stdout
    out = tmp_path / "c05.gguf"
    run = subprocess.run(tool + ["qwen2.5-coder-0.5b", str(out), "--tiny", "--layers", "1", "--workers", "2"],
                         capture_output=True, text=True, check=True)
    assert out.stat().st_size > 0 and "MB/s" in run.stdout
    assert GGUFModel(out).config.n_layer == 1


@pytest.mark.real
@pytest.mark.parametrize("preset,name", [("qwen2.5-coder-1.5b", DEFAULT_TARGET), ("qwen2.5-coder-0.5b", DEFAULT_DRAFT)])
def test_plan_matches_the_real_file(preset, name):
    """Same tensors, shapes, type counts and data bytes as Qwen's own Q4_K_M file. Which
    layers get Q6_K differs: that file was quantized with its tensors in name order
    (blk.0, blk.1, blk.10, ...), and llama.cpp's use_more_bits counts tensors in file order."""
    path = model_path(name)
    if not path.exists():
        pytest.skip(f"{path} not fetched (make models)")
    real = GGUFModel(path)
    plan = sm.plan_synthetic(sm.preset_config(preset), "q4_k_m")
    infos = {n: real.tensor_info(n) for n in real.tensors}
    assert {t.name: t.shape for t in plan.tensors} == {n: tuple(i.shape) for n, i in infos.items()}
    real_counts = {}
    for i in infos.values():
        real_counts[i.qtype.name] = real_counts.get(i.qtype.name, 0) + 1
    assert {k: n for k, (n, _) in plan.type_counts().items()} == real_counts
    assert plan.data_bytes == sum(sm._pad(int(i.nbytes)) for i in infos.values())
