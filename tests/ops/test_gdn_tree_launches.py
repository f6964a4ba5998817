"""A verify step (tree rows only) through a tiny qwen35 on the CUDA backend's host code over the
fake runtime (tests/ops/fake_hip.py, tests/ops/fake_cuda.py): each GDN layer's chain takes one
luce_gdn_tree_prepare launch instead of the composition's conv, split, norm and gate launches and
the tree verify takes the gated norm, both reading the merged projection's column blocks in place. Nothing computes here (the fake
records launches); tests/kernels/test_gdn_tree_chain.py checks the bits on a GPU."""
from __future__ import annotations

import inspect
from collections import Counter

import pytest

from luce.ops import get_backend
from tests.ops import fake_hip
from tests.ops.test_gdn_merge_launches import MIXES
from tests.ops.test_hip_runtime import install_fakes

# The composition's kernel launches a GDN layer of the 27B mix ([qkv], [z | b | a]) that the fused
# chain replaces: z | b | a split (3 gathers), sigmoid, add, softplus, mul, conv_tree, q | k | v
# split (3 gathers), 2 l2norms, the q scale's mul, 2 tiling gathers, gated_rmsnorm (17; and the
# conv output's memset, which the fake does not count); the fused chain launches the prepare (1).
# The tree verify runs in both (the fused one with the norm epilogue).
SAVED_A_LAYER = 17 - 1


def verify_step(tmp_path, monkeypatch, fused: bool):
    """One verify step of two trees through a tiny qwen35 (27B mix) -> (model, its launches,
    the gdn_tree_prepare calls' arguments, its memsets and copies: {runtime call: count})."""
    from luce import _cuda_gdn
    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops import cuda_fused_ops
    from luce.testing.tiny_models import make_qwen35

    tmp_path.mkdir(exist_ok=True)
    signature = inspect.signature(_cuda_gdn.gdn_tree_prepare)   # the wrapper's own, before the fake replaces it
    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    monkeypatch.setattr(cuda_fused_ops, "GDN_TREE_FUSED", fused)
    calls = fake_hip.spy_calls(monkeypatch, _cuda_gdn, "gdn_tree_prepare", signature)
    backend = get_backend("cuda")
    path = tmp_path / "q35.gguf"
    make_qwen35(path, seed=5, quant_mix=MIXES["27b_like"], hidden=256, ffn=512, head_dim=64, ssm_state_size=64)
    model = load_model(path, backend)
    state = model.new_state(max_pages=12, max_slots=4)
    batch = build_batch([SegmentSpec(1, [5, 6, 7, 8], 9, [0], parents=[-1, 0, 0, 2]),
                         SegmentSpec(2, [4], 3, [1], parents=[-1])])
    before, api_before = len(fake.launches), len(fake.calls)
    model.forward(batch, state)
    copies = Counter("memset" if name == "hipMemsetAsync" else args[3].name for name, args in fake.calls[api_before:]
                     if name in ("hipMemsetAsync", "hipMemcpyAsync"))
    return model, batch, fake.launches[before:], calls, copies


def test_a_tree_step_runs_one_prepare_a_gdn_layer(tmp_path):
    with pytest.MonkeyPatch.context() as m:
        model, batch, fused, calls, _ = verify_step(tmp_path / "fused", m, True)
    with pytest.MonkeyPatch.context() as m:
        _, _, apart, none, _ = verify_step(tmp_path / "apart", m, False)
    n_gdn = len(model.config.gdn_layers)
    kinds = lambda launches: Counter(kernel for kernel, _, _ in launches)  # noqa: E731
    assert kinds(fused)["_cuda_gdn.gdn_tree_prepare"] == len(calls) == n_gdn and not none
    assert kinds(fused)["_cuda_tree_conv.conv_tree"] == 0 < kinds(apart)["_cuda_tree_conv.conv_tree"]
    assert kinds(fused)["_cuda_elementwise.gated_rmsnorm"] == 0 < kinds(apart)["_cuda_elementwise.gated_rmsnorm"]
    assert kinds(fused)["_cuda_gdn_tree.gdn_tree_verify"] == kinds(apart)["_cuda_gdn_tree.gdn_tree_verify"] == n_gdn
    assert len(apart) - len(fused) == SAVED_A_LAYER * n_gdn


def test_no_memset_nor_device_copy_beside_the_fused_chain(tmp_path):
    """The prepare zeroes the tree block's padding rows of normed and stages the commit's conv
    inputs: no memset and no device-to-device copy in the step (the composition takes both)."""
    with pytest.MonkeyPatch.context() as m:
        *_, fused = verify_step(tmp_path / "fused", m, True)
    with pytest.MonkeyPatch.context() as m:
        *_, apart = verify_step(tmp_path / "apart", m, False)
    assert fused["memset"] == fused["hipMemcpyDeviceToDevice"] == 0
    assert apart["memset"] > 0 and apart["hipMemcpyDeviceToDevice"] > 0


def test_the_prepare_reads_the_merged_blocks_in_place(tmp_path, monkeypatch):
    model, batch, _, calls, _ = verify_step(tmp_path, monkeypatch, True)
    c = model.config
    C, Z, Hv = 2 * c.ssm_n_k_heads * c.ssm_state_size + c.ssm_inner, c.ssm_inner, c.ssm_n_v_heads
    for call in calls:
        assert call["qkv_stride"] == C and call["z_stride"] == call["b_stride"] == call["a_stride"] == Z + 2 * Hv
        assert (call["b"], call["a"]) == (call["z"] + 4 * Z, call["z"] + 4 * (Z + Hv))
        assert call["max_tree_rows"] == batch.max_tree_rows == 4 and call["n_segments"] == batch.n_segments
        assert call["arrivals"] != 0 and call["normed"] != 0 and call["conv_stage"] != 0
        assert call["stage_row0"] == batch.tree_start
