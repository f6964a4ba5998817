"""LUCE_MATMUL_PAIR on the CUDA backend's host code over the fake runtime (tests/ops/fake_hip.py,
fake_cuda.py): in a one-row decode step of a q4_k_m model, each layer whose v is Q6_K beside a
Q4_K q|k (llama.cpp's use_more_bits layers) multiplies both with one luce_matmul_pair call in
place of two luce_matmul calls; steps of several rows, and every step with it off, make the two
calls. The kernel's bits: tests/kernels/test_matmul_pair_emulated.py and test_matmul_pair.py."""
from __future__ import annotations

from collections import Counter

import pytest

from tests.ops.test_hip_runtime import install_fakes
from tests.ops.test_matmul_x_once import tiny_q4km


def step_launches(tmp_path, monkeypatch, slots: int) -> tuple:
    """One decode step of `slots` rows through a tiny q4_k_m qwen3, with LUCE_MATMUL_PAIR on and
    off -> (model, Counter of kernel names on, off)."""
    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops import cuda_fused_ops, get_backend

    hip = install_fakes(monkeypatch, tmp_path, "cuda")
    model = load_model(tiny_q4km(tmp_path, "qwen3"), get_backend("cuda"))
    state = model.new_state(max_pages=12, max_slots=4)
    batch = build_batch([SegmentSpec(slot, [11 + slot], 5 + slot, [4 * slot]) for slot in range(slots)])
    counts = []
    for pair in (True, False):
        monkeypatch.setattr(cuda_fused_ops, "PAIR_ON", pair)
        before = len(hip.launches)
        model.forward(batch, state)
        counts.append(Counter(kernel for kernel, *_ in hip.launches[before:]))
    return model, *counts


@pytest.mark.parametrize("slots", [1, 2])
def test_a_decode_row_of_q4_k_and_q6_k_projections_is_one_launch(tmp_path, monkeypatch, slots):
    model, on, off = step_launches(tmp_path, monkeypatch, slots)
    pairs = sum(1 for layer in model.layers
                if [w.qtype for w in layer.attn.projections] == [12, 14])   # Q4_K q|k, Q6_K v
    assert pairs >= 1 and off["_cuda_matmul.matmul_pair"] == 0
    if slots == 1:
        assert on["_cuda_matmul.matmul_pair"] == pairs
        assert on["_cuda_matmul.matmul"] == off["_cuda_matmul.matmul"] - 2 * pairs
    else:
        assert on == off
