"""LUCE_MATMUL_PRODUCED on the CUDA backend's host code over the fake runtime (tests/ops/fake_hip.py,
fake_cuda.py): in a one-row decode step every norm that feeds one block-type weight (merged q|k|v,
gate|up, the LM head) and every SwiGLU goes to luce_matmul_produced with its matmul (one launch
where the one-row kernel forms x in lane: tests/kernels/test_matmul_produced_emulated.py), in place
of the producer's call and the matmul call; norms feeding two weights (the pair) keep theirs.
Steps of several rows, and every step with it off, make the producer's calls."""
from __future__ import annotations

from collections import Counter

import pytest

from tests.ops.test_hip_runtime import install_fakes
from tests.ops.test_matmul_x_once import tiny_q4km

NORM, SWIGLU, PRODUCED = "_cuda_fused.add_rmsnorm", "_cuda_fused.swiglu_quant", "_cuda_matmul.matmul_produced"


def step_launches(tmp_path, monkeypatch, slots: int):
    """One decode step of `slots` rows through a tiny q4_k_m qwen3 with LUCE_MATMUL_PRODUCED on and
    off -> (model, Counter of kernel names on, off)."""
    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops import cuda_fused_ops, get_backend

    hip = install_fakes(monkeypatch, tmp_path, "cuda")
    model = load_model(tiny_q4km(tmp_path, "qwen3"), get_backend("cuda"))
    state = model.new_state(max_pages=12, max_slots=4)
    batch = build_batch([SegmentSpec(slot, [11 + slot], 5 + slot, [4 * slot]) for slot in range(slots)])
    counts = []
    for produced in (True, False):
        monkeypatch.setattr(cuda_fused_ops, "PRODUCED_ON", produced)
        before = len(hip.launches)
        model.forward(batch, state)
        counts.append(Counter(kernel for kernel, *_ in hip.launches[before:]))
    return model, *counts


@pytest.mark.parametrize("slots", [1, 2])
def test_a_decode_rows_norms_and_swiglu_go_into_the_matmul(tmp_path, monkeypatch, slots):
    model, on, off = step_launches(tmp_path, monkeypatch, slots)
    layers = len(model.layers)
    single_attn = sum(1 for layer in model.layers if len(layer.attn.projections) == 1)
    assert off[PRODUCED] == 0 and off[SWIGLU] == layers and off[NORM] == 2 * layers + 1
    if slots == 1:
        norms = single_attn + layers + 1            # q|k|v merged, gate|up merged, the final norm (LM head)
        assert on[SWIGLU] == 0 and on[NORM] == off[NORM] - norms
        assert on[PRODUCED] == norms + layers
        assert on["_cuda_matmul.matmul"] == off["_cuda_matmul.matmul"] - norms - layers
        assert sum(on.values()) == sum(off.values()) - norms - layers
    else:
        assert on == off
