"""A GDN layer's input projections merged (luce.models.gdn_layer GDNWeights.merge) on the CUDA
backend's host code over the fake runtime (tests/ops/fake_hip.py, tests/ops/fake_cuda.py): a
decode step runs fewer one-row matmul launches, and cuda/gdn_decode.cu gets the merged output's
column blocks in place, with their row strides. Nothing computes here (the fake records launches);
tests/models/test_gdn_merge_cuda.py checks the logits on a GPU."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from luce.ops import get_backend
from tests.ops import fake_hip
from tests.ops.test_hip_runtime import install_fakes

# qkv Q5_K beside gate, beta, alpha IQ4_XS (the 27B's iq4_xs mix); every projection Q8_0
MIXES = {"27b_like": {r"attn_qkv": "q5_k", r"attn_gate|ssm_beta|ssm_alpha": "iq4_xs"},
         "one_type": {r"attn_qkv|attn_gate|ssm_beta|ssm_alpha": "q8_0"}}
MERGED_RUNS = {"27b_like": 2, "one_type": 1}   # matmuls a GDN layer runs for its 4 projections


def decode_step(tmp_path, monkeypatch, mix: str, merge: bool):
    """One AR step of 3 slots through a tiny qwen35 on the fake CUDA runtime -> (model, fake,
    the step's launches, the gdn_decode calls' arguments)."""
    from luce import _cuda_gdn
    from luce.models import load_model
    from luce.models.gdn_layer import GDNWeights
    from luce.models.packer import SegmentSpec, build_batch
    from luce.testing.tiny_models import make_qwen35

    tmp_path.mkdir(exist_ok=True)
    signature = inspect.signature(_cuda_gdn.gdn_decode)   # the wrapper's own, before the fake replaces it
    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    if not merge:
        monkeypatch.setattr(GDNWeights, "merge", lambda self, backend: self)
    calls = fake_hip.spy_calls(monkeypatch, _cuda_gdn, "gdn_decode", signature)
    backend = get_backend("cuda")
    path = tmp_path / f"q35_{mix}.gguf"
    make_qwen35(path, seed=5, quant_mix=MIXES[mix], hidden=256, ffn=512, head_dim=64, ssm_state_size=64)
    model = load_model(path, backend)
    state = model.new_state(max_pages=12, max_slots=4)
    batch = build_batch([SegmentSpec(slot, [11 + slot], 5 + slot, [4 * slot]) for slot in (0, 1, 2)])
    before = len(fake.launches)
    model.forward(batch, state)
    return model, fake.launches[before:], calls


def matmuls(launches) -> int:
    return sum(kernel == "_cuda_matmul.matmul" for kernel, _, _ in launches)


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_merged_gdn_projections_launch_fewer_matmuls(tmp_path, mix):
    with pytest.MonkeyPatch.context() as m:
        model, merged, _ = decode_step(tmp_path / "merged", m, mix, merge=True)
    with pytest.MonkeyPatch.context() as m:
        _, apart, _ = decode_step(tmp_path / "apart", m, mix, merge=False)
    n_gdn = len(model.config.gdn_layers)
    assert all(len(layer.gdn.merged) == MERGED_RUNS[mix] for layer in model.layers if layer.gdn is not None)
    assert matmuls(apart) - matmuls(merged) == (4 - MERGED_RUNS[mix]) * n_gdn
    assert len(apart) - len(merged) == (4 - MERGED_RUNS[mix]) * n_gdn   # nothing else launched instead


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_gdn_decode_reads_the_merged_blocks_in_place(tmp_path, monkeypatch, mix):
    model, _, calls = decode_step(tmp_path, monkeypatch, mix, merge=True)
    c = model.config
    C, Z = 2 * c.ssm_n_k_heads * c.ssm_state_size + c.ssm_inner, c.ssm_inner
    Hv = c.ssm_n_v_heads
    assert len(calls) == len(c.gdn_layers)
    for call in calls:
        if mix == "one_type":   # [qkv | z | b | a] one part
            width = C + Z + 2 * Hv
            assert call["z"] == call["qkv"] + 4 * C
        else:                   # [qkv], [z | b | a]
            width = Z + 2 * Hv
            assert call["qkv_stride"] == C
        assert call["z_stride"] == call["b_stride"] == call["a_stride"] == width
        assert call["qkv_stride"] in (C, width)
        assert (call["b"], call["a"]) == (call["z"] + 4 * Z, call["z"] + 4 * (Z + Hv))


def test_gdn_decode_strides_of_separate_projections_are_their_widths(tmp_path, monkeypatch):
    model, _, calls = decode_step(tmp_path, monkeypatch, "27b_like", merge=False)
    c = model.config
    C = 2 * c.ssm_n_k_heads * c.ssm_state_size + c.ssm_inner
    assert [(k["qkv_stride"], k["z_stride"], k["b_stride"], k["a_stride"]) for k in calls] == \
        [(C, c.ssm_inner, c.ssm_n_v_heads, c.ssm_n_v_heads)] * len(c.gdn_layers)
    assert np.all([k["b"] != k["a"] for k in calls])
