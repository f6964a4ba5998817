"""backend.attention_matmul on the CUDA backend's host code over the fake runtime
(tests/ops/fake_hip.py, tests/ops/fake_cuda.py): in a decode step the attention kernel gets the
wo matmul's workspace (x_workspace) and the matmul reuses it (REUSE_X: no quantize_x launch), one
launch fewer per attention layer, with LUCE_ATTN_QUANT=1; by default (off: slower on the H200), a
step with prompt rows and a head dim the kernels lack take the composition. Nothing computes here (the fake records launches);
tests/kernels/test_attention.py and tests/kernels/test_attention_quant_emulated.py check the bits.
"""
from __future__ import annotations

import inspect

import pytest

from luce.ops import get_backend
from tests.ops.test_hip_runtime import install_fakes

REUSE_X = 1


def step(tmp_path, monkeypatch, quant: str | None, head_dim: int = 64, prefill: bool = False):
    """One step of 3 slots (AR rows, or a 5-row prompt first) through a tiny Q8_0 qwen3 on the
    fake CUDA runtime -> (model, the step's launches, the attention calls' and matmul calls' arguments)."""
    from luce import _cuda_attention, _cuda_matmul
    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch
    from luce.testing.tiny_models import make_dense

    tmp_path.mkdir(exist_ok=True)
    if quant is None:
        monkeypatch.delenv("LUCE_ATTN_QUANT", raising=False)
    else:
        monkeypatch.setenv("LUCE_ATTN_QUANT", quant)
    spied = {}
    for module, name in ((_cuda_attention, "attention"), (_cuda_matmul, "matmul")):
        spied[name] = (module, inspect.signature(getattr(module, name)))   # the wrappers' own signatures
    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    calls = {"attention": [], "matmul": [], "order": []}   # order: (name, arguments) as called
    for name, (module, signature) in spied.items():
        recorded = getattr(module, name)

        def spy(*args, _recorded=recorded, _sig=signature, _name=name, **kwargs):
            bound = _sig.bind(*args, **kwargs)
            bound.apply_defaults()
            calls[_name].append(dict(bound.arguments))
            calls["order"].append((_name, calls[_name][-1]))
            return _recorded(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    backend = get_backend("cuda")
    path = tmp_path / f"qwen3_d{head_dim}.gguf"
    make_dense(path, "qwen3", seed=3, quant_mix="q8_0", head_dim=head_dim)
    model = load_model(path, backend)
    state = model.new_state(max_pages=12, max_slots=4)
    if prefill:
        specs = [SegmentSpec(0, list(range(3, 8)), 0, list(range(5)))] + \
            [SegmentSpec(slot, [11 + slot], 5 + slot, [4 * slot]) for slot in (1, 2)]
    else:
        specs = [SegmentSpec(slot, [11 + slot], 5 + slot, [4 * slot]) for slot in (0, 1, 2)]
    batch = build_batch(specs)
    before = len(fake.launches)
    model.forward(batch, state)
    return model, fake.launches[before:], calls


def kernel_launches(launches, calls) -> int:
    """The step's kernels: each recorded call, plus the quantize_x launch of a matmul call that
    quantizes its x itself (a block-type weight without REUSE_X)."""
    from luce import _cuda_matmul as km

    quantizing = sum(1 for c in calls["matmul"] if c["qtype"] not in km.FLOAT_QTYPES and not c["flags"] & REUSE_X)
    return len(launches) + quantizing


def test_decode_step_has_one_launch_fewer_per_attention_layer(tmp_path):
    with pytest.MonkeyPatch.context() as m:
        model, fused, fused_calls = step(tmp_path / "fused", m, "1")
    with pytest.MonkeyPatch.context() as m:
        _, apart, apart_calls = step(tmp_path / "apart", m, None)     # the default: off
    n_layers = model.config.n_layer
    assert len(fused) == len(apart), "the same calls (attention_matmul: attention, then the matmul)"
    assert kernel_launches(apart, apart_calls) - kernel_launches(fused, fused_calls) == n_layers
    quantizing = [c for c in fused_calls["attention"] if c["x_workspace"]]
    assert len(quantizing) == n_layers and all(c["x_workspace_bytes"] > 0 for c in quantizing)
    assert not any(c["x_workspace"] for c in apart_calls["attention"])
    # the call after each quantizing attention: the wo matmul on its output, reusing its workspace
    order = fused_calls["order"]
    for i, (name, c) in enumerate(order):
        if name == "attention" and c["x_workspace"]:
            after, m = order[i + 1]
            assert after == "matmul" and m["x"] == c["out"] and m["flags"] & REUSE_X
            assert (m["workspace"], m["workspace_bytes"]) == (c["x_workspace"], c["x_workspace_bytes"])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # head_dim 32: attention on the host, said once
def test_prompt_rows_and_unsupported_head_dims_take_the_composition(tmp_path):
    with pytest.MonkeyPatch.context() as m:
        _, _, calls = step(tmp_path / "prefill", m, "1", prefill=True)
    assert calls["attention"] and not any(c["x_workspace"] for c in calls["attention"])
    with pytest.MonkeyPatch.context() as m:
        _, _, calls = step(tmp_path / "d32", m, "1", head_dim=32)   # host attention: no kernel call
    assert not calls["attention"]
