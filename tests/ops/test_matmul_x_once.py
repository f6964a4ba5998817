"""LUCE_MATMUL_X_ONCE on the CUDA backend's host code over the fake runtime
(tests/ops/fake_hip.py, fake_cuda.py): a decode step flags exactly the matmul calls whose
quantized x no later call reuses (a matmuls call of one block-type weight: the attention out
projection, the LM head), never a call whose workspace a REUSE_X call then reads; the one-row
kernel then quantizes x in lane (cuda/matmul_gemv_x.cuh, one launch fewer: counted on a GPU by
tests/kernels/test_matmul.py). Nothing computes here (the fake records launches)."""
from __future__ import annotations

import inspect

import pytest

from luce.ops import get_backend
from tests.ops.test_hip_runtime import install_fakes

REUSE_X, X_ONCE = 1, 2


def tiny_q4km(tmp_path, arch: str):
    """Path of a tiny q4_k_m model of `arch` (qwen3 or the hybrid qwen35) written into tmp_path."""
    from luce.testing.tiny_models import make_dense, make_qwen35

    path = tmp_path / f"{arch}.gguf"
    if arch == "qwen35":
        make_qwen35(path, seed=5, quant_mix="q4_k_m", head_dim=64, ssm_state_size=64)
    else:
        make_dense(path, arch, seed=5, quant_mix="q4_k_m", head_dim=64)
    return path


def decode_step(tmp_path, monkeypatch, arch: str, slots: int):
    """One AR step of `slots` rows through a tiny q4_k_m model -> (model, events, the step's first
    event): ("matmul", workspace, flags, qtype) per luce_matmul call and ("write", pointers) per
    fused producer call (which may quantize into a workspace); later calls append to events."""
    from luce import _cuda_fused, _cuda_matmul
    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch

    signature = inspect.signature(_cuda_matmul.matmul)
    install_fakes(monkeypatch, tmp_path, "cuda")
    events = []
    recorded = _cuda_matmul.matmul

    def matmul(*args, **kwargs):
        a = signature.bind(*args, **kwargs)
        a.apply_defaults()
        events.append(("matmul", a.arguments["workspace"], a.arguments["flags"], a.arguments["qtype"]))
        return recorded(*args, **kwargs)

    monkeypatch.setattr(_cuda_matmul, "matmul", matmul)
    for name in ("add_rmsnorm", "swiglu_quant"):
        fn = getattr(_cuda_fused, name)

        def producer(*args, _fn=fn, **kwargs):
            events.append(("write", {v for v in (*args, *kwargs.values()) if isinstance(v, int)}))
            return _fn(*args, **kwargs)

        monkeypatch.setattr(_cuda_fused, name, producer)
    model = load_model(tiny_q4km(tmp_path, arch), get_backend("cuda"))
    state = model.new_state(max_pages=12, max_slots=4)
    batch = build_batch([SegmentSpec(slot, [11 + slot], 5 + slot, [4 * slot]) for slot in range(slots)])
    before = len(events)
    model.forward(batch, state)
    return model, events, before


@pytest.mark.parametrize("arch", ["qwen3", "qwen35"])
@pytest.mark.parametrize("slots", [1, 3])
def test_x_once_only_where_no_reuse_follows(tmp_path, monkeypatch, arch, slots):
    model, events, first = decode_step(tmp_path, monkeypatch, arch, slots)
    float_types = (0, 1, 30)
    written = {}   # workspace -> whether its quantized x is there for a REUSE_X call
    once = 0
    for event in events[first:]:
        if event[0] == "write":
            for p in event[1]:
                written[p] = True
            continue
        _, ws, flags, qtype = event
        if qtype in float_types:
            continue
        assert flags in (0, REUSE_X, X_ONCE), flags
        if flags & REUSE_X:
            assert written.get(ws), "a REUSE_X call reads a workspace the last call left unwritten (X_ONCE)"
        else:
            written[ws] = not flags & X_ONCE
            once += bool(flags & X_ONCE)
    c = model.config
    # every attention layer's out projection (the GDN layers' too, for qwen35); the LM head reuses
    # the final norm's quantized x (TokenIO.final_logits)
    assert once >= c.n_layer
    lm_head = [e for e in events[first:] if e[0] == "matmul"][-1]
    assert lm_head[2] == REUSE_X and written.get(lm_head[1])


def test_flags_of_matmuls_calls(tmp_path, monkeypatch):
    """Several block-type weights: the first quantizes (0), the others reuse (REUSE_X); one
    weight: X_ONCE (up to X_ONCE_MAX_K columns and X_ONCE_MAX_N rows); a float weight beside one
    block-type weight leaves it X_ONCE; prompt rows (the prefill GEMM) are never flagged X_ONCE."""
    import numpy as np

    from luce import _cuda_matmul

    model, events, _ = decode_step(tmp_path, monkeypatch, "qwen3", 1)
    b = model.backend
    qkv = [p for p in model.layers[0].attn.projections if p.qtype not in (0, 1, 30)][0]
    blocks = [qkv, qkv, qkv]   # three weights of one x (the same one thrice)
    x = b.upload(np.zeros((1, blocks[0].k), np.float32))

    def flags_of(run):
        before = len(events)
        run()
        return [e[2] for e in events[before:] if e[0] == "matmul"]

    assert flags_of(lambda: b.matmuls(x, blocks[:2])) == [0, REUSE_X]
    assert flags_of(lambda: b.matmul(x, blocks[0])) == [X_ONCE]
    from luce.ops import cuda_backend

    for limit in ("X_ONCE_MAX_K", "X_ONCE_MAX_N"):   # past either bound: quantize_x, then the matmul
        size = blocks[0].k if limit == "X_ONCE_MAX_K" else blocks[0].n
        monkeypatch.setattr(cuda_backend, limit, size - 1)
        assert flags_of(lambda: b.matmul(x, blocks[0])) == [0], limit
        monkeypatch.setattr(cuda_backend, limit, size)
        assert flags_of(lambda: b.matmul(x, blocks[0])) == [X_ONCE], limit
    x3 = b.upload(np.zeros((3, blocks[0].k), np.float32))
    assert flags_of(lambda: b.matmuls(x3, blocks)) == [0, REUSE_X, REUSE_X]
    assert flags_of(lambda: b.matmul(x3, blocks[0])) == [X_ONCE]   # luce_matmul ignores it past one row
    prefill = []
    monkeypatch.setattr(_cuda_matmul, "matmul_prefill", lambda *a, **k: prefill.append(a[10]))
    b.prefill_gemm = True
    b.matmul(x3, blocks[0], prefill_spans=[(0, 3)])
    assert prefill == [0]
