"""A dense layer's attention input fused into its attention launch on decode steps
(CudaFusedOps.rope_kv_attention, luce_rope_kv_attention) on the CUDA backend's host code over the
fake runtime (tests/ops/fake_hip.py): a decode step launches one kernel fewer a layer (no rope_kv),
its attention launch gets the projection's q | k | v blocks in place; a step with a prompt
segment, or a decode step at head_dim 256, keeps the two launches. Nothing computes here;
tests/kernels/test_rope_kv_attention.py checks the bits on a GPU."""
from __future__ import annotations

import inspect

import pytest

from luce.ops import get_backend
from tests.ops import fake_hip
from tests.ops.test_hip_runtime import install_fakes


def step(tmp_path, monkeypatch, segments, head_dim=64, fuse=True):
    """One forward of a tiny qwen3 (Q8_0: q, k, v merged) on the fake CUDA runtime -> (config,
    the step's launches, the attention calls' arguments)."""
    from luce import _cuda_attention
    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops.api import FusedOps
    from luce.ops.cuda_fused_ops import CudaFusedOps
    from luce.testing.tiny_models import make_dense

    tmp_path.mkdir(exist_ok=True)
    signature = inspect.signature(_cuda_attention.attention)   # the wrapper's own, before the fake replaces it
    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    if not fuse:
        monkeypatch.setattr(CudaFusedOps, "rope_kv_attention", FusedOps.rope_kv_attention)
    calls = fake_hip.spy_calls(monkeypatch, _cuda_attention, "attention", signature)
    backend = get_backend("cuda")
    path = tmp_path / f"dense_{head_dim}.gguf"
    config = make_dense(path, "qwen3", seed=3, quant_mix="q8_0", n_head=4, n_head_kv=2, head_dim=head_dim)
    model = load_model(path, backend)
    state = model.new_state(max_pages=16, max_slots=4)
    batch = build_batch([SegmentSpec(slot, tokens, start, [4 * slot, 4 * slot + 1])
                         for slot, tokens, start in segments])
    before = len(fake.launches)
    model.forward(batch, state)
    return config, fake.launches[before:], calls


def count(launches, kernel: str) -> int:
    return sum(name == kernel for name, _, _ in launches)


DECODE = [(0, [11], 5), (1, [12], 17), (2, [13], 30)]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_decode_step_launches_one_kernel_fewer_a_layer(tmp_path, head_dim):
    with pytest.MonkeyPatch.context() as m:
        config, fused, calls = step(tmp_path / "fused", m, DECODE, head_dim)
    with pytest.MonkeyPatch.context() as m:
        _, apart, _ = step(tmp_path / "apart", m, DECODE, head_dim, fuse=False)
    n = config.n_layer
    assert count(apart, "_cuda_fused.rope_kv") == n and count(fused, "_cuda_fused.rope_kv") == 0
    assert count(fused, "_cuda_attention.attention") == count(apart, "_cuda_attention.attention") == n
    assert len(apart) - len(fused) == n   # nothing launched instead
    D, H, Hkv = head_dim, config.n_head, config.n_head_kv
    for call in calls:   # q, k, v: the merged projection's column blocks, read in place
        q, k, v, q_norm, k_norm, kv_dst, positions, q_stride, k_stride, v_stride, rope_dim, theta, sections, eps = \
            call["rope"]
        assert (k, v) == (q + 4 * H * D, q + 4 * (H + Hkv) * D)
        assert q_stride == k_stride == v_stride == (H + 2 * Hkv) * D
        assert q_norm and k_norm and rope_dim == D and call["q"] == 0 and call["prompt_rows"] == 0


@pytest.mark.parametrize("segments,head_dim", [([(0, [1, 2, 3, 4], 0), (1, [12], 17)], 64), (DECODE, 256)],
                         ids=["prompt_segment", "head_dim_256"])
def test_other_steps_keep_the_two_launches(tmp_path, segments, head_dim):
    with pytest.MonkeyPatch.context() as m:
        config, fused, calls = step(tmp_path / "fused", m, segments, head_dim)
    with pytest.MonkeyPatch.context() as m:
        _, apart, _ = step(tmp_path / "apart", m, segments, head_dim, fuse=False)
    assert count(fused, "_cuda_fused.rope_kv") == config.n_layer
    assert [name for name, _, _ in fused] == [name for name, _, _ in apart]
    assert all(call.get("rope") is None for call in calls)
