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
         "one_type": {r"attn_qkv|attn_gate|ssm_beta|ssm_alpha": "q8_0"},
         "out_q8_0": {r"attn_qkv": "q5_k", r"attn_gate|ssm_beta|ssm_alpha": "iq4_xs", r"ssm_out": "q8_0"}}
MERGED_RUNS = {"27b_like": 2, "one_type": 1, "out_q8_0": 2}   # matmuls a GDN layer runs for its 4 projections


def decode_step(tmp_path, monkeypatch, mix: str, merge: bool, matmul_calls: list | None = None):
    """One AR step of 3 slots through a tiny qwen35 on the fake CUDA runtime -> (model, the
    step's launches, the gdn_decode calls' arguments); matmul_calls gets the matmul calls'."""
    from luce import _cuda_gdn, _cuda_matmul
    from luce.models import load_model
    from luce.models.gdn_layer import GDNWeights
    from luce.models.packer import SegmentSpec, build_batch
    from luce.testing.tiny_models import make_qwen35

    tmp_path.mkdir(exist_ok=True)
    signature = inspect.signature(_cuda_gdn.gdn_decode)   # the wrappers' own, before the fake replaces them
    matmul_signature = inspect.signature(_cuda_matmul.matmul)
    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    if not merge:
        monkeypatch.setattr(GDNWeights, "merge", lambda self, backend: self)
    calls = fake_hip.spy_calls(monkeypatch, _cuda_gdn, "gdn_decode", signature)
    spied = fake_hip.spy_calls(monkeypatch, _cuda_matmul, "matmul", matmul_signature)
    backend = get_backend("cuda")
    path = tmp_path / f"q35_{mix}.gguf"
    make_qwen35(path, seed=5, quant_mix=MIXES[mix], hidden=256, ffn=512, head_dim=64, ssm_state_size=64)
    model = load_model(path, backend)
    state = model.new_state(max_pages=12, max_slots=4)
    batch = build_batch([SegmentSpec(slot, [11 + slot], 5 + slot, [4 * slot]) for slot in (0, 1, 2)])
    before = len(fake.launches)
    model.forward(batch, state)
    if matmul_calls is not None:
        matmul_calls.extend(spied)
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


@pytest.mark.parametrize("in_lane", [False, True])
def test_the_chain_quantizes_the_out_projections_x(tmp_path, monkeypatch, in_lane):
    """Where the out projection would not quantize its x in lane (X_ONCE_MAX_K below Hv*Dv, as the
    27B's 6,144 against 4,096), gdn_decode gets a workspace for the step's rows and the out
    projection's matmul reads normed from it (REUSE_X): no quantize launch of its own. Where it
    would, gdn_decode gets none and the matmul quantizes in lane (X_ONCE), as before."""
    from luce import _cuda_matmul as km
    from luce.ops import cuda_backend

    monkeypatch.setattr(cuda_backend, "X_ONCE_MAX_K", 1 << 20 if in_lane else 0)
    matmul_calls = []
    model, _, calls = decode_step(tmp_path, monkeypatch, "out_q8_0", True, matmul_calls)
    gdn_layers = [layer.gdn for layer in model.layers if layer.gdn is not None]
    assert len(calls) == len(gdn_layers) > 0
    for call, gdn in zip(calls, gdn_layers):   # in layer order
        outs = [m for m in matmul_calls if m["w"] == gdn.out.ptr]
        assert len(outs) == 1 and outs[0]["x"] == call["normed"] and outs[0]["rows"] == 3
        if in_lane:
            assert call.get("workspace", 0) == 0 and outs[0]["flags"] == km.X_ONCE
        else:
            assert call["workspace"] != 0 and call["rows"] == 3
            assert (outs[0]["workspace"], outs[0]["workspace_bytes"]) == (call["workspace"], call["workspace_bytes"])
            assert outs[0]["flags"] == km.REUSE_X
