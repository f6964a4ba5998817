"""The gated attention's query / gate interleave (attn_q gives each head [query (D), gate (D)])
on the CUDA backend's host code over the fake runtime: an AR step and a verify step of a tiny
qwen35 launch, a full-attention layer, no gather for the queries (luce_rope_kv reads them in
place, its q heads 2D apart) and one `mul_sigmoid` binary for the output gate, read in place from
the projection, where the composition (luce.ops.api.FusedOps: a split for the gate, then the
sigmoid and the mul) takes 4. Nothing computes here (the fake records launches);
tests/kernels/test_pointwise.py and test_rope_kv.py check the bits on a GPU."""
from __future__ import annotations

import inspect
from collections import Counter

import pytest

from luce.ops import get_backend
from tests.ops import fake_hip
from tests.ops.test_gdn_merge_launches import MIXES
from tests.ops.test_hip_runtime import install_fakes

TREES = [dict(parents=[-1, 0, 0, 2]), dict(parents=[-1])]


def one_step(tmp_path, monkeypatch, fused: bool, tree: bool, spied=("_cuda_pointwise", "binary"), mix=None):
    """One step of two segments (AR rows, or trees of 4 and 1 rows) through a tiny qwen35 (27B
    mix) -> (config, its launches, the calls' arguments of the wrapper `spied` (luce_binary's by
    default), the rows)."""
    import importlib

    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops.api import FusedOps
    from luce.ops.cuda_fused_ops import CudaFusedOps
    from luce.testing.tiny_models import make_qwen35

    tmp_path.mkdir(exist_ok=True)
    module = importlib.import_module(f"luce.{spied[0]}")
    signature = inspect.signature(getattr(module, spied[1]))   # the wrapper's own, before the fake replaces it
    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    if not fused:
        monkeypatch.setattr(CudaFusedOps, "gated_query", FusedOps.gated_query)
        monkeypatch.setattr(CudaFusedOps, "gate_output", FusedOps.gate_output)
    calls = fake_hip.spy_calls(monkeypatch, module, spied[1], signature)
    backend = get_backend("cuda")
    path = tmp_path / "q35.gguf"
    config = make_qwen35(path, seed=5, quant_mix=mix or MIXES["27b_like"], hidden=256, ffn=512, head_dim=64,
                         ssm_state_size=64)
    model = load_model(path, backend)
    state = model.new_state(max_pages=12, max_slots=4)
    if tree:
        specs = [SegmentSpec(1, [5, 6, 7, 8], 9, [0], **TREES[0]), SegmentSpec(2, [4], 3, [1], **TREES[1])]
    else:
        specs = [SegmentSpec(1, [5], 9, [0]), SegmentSpec(2, [4], 3, [0])]
    batch = build_batch(specs)
    before = len(fake.launches)
    model.forward(batch, state)
    return config, fake.launches[before:], calls, batch.token_ids.shape[0]


@pytest.mark.parametrize("tree", [False, True])
def test_the_gate_is_read_in_place(tmp_path, tree):
    with pytest.MonkeyPatch.context() as m:
        config, fused, calls, rows = one_step(tmp_path / "fused", m, True, tree)
    with pytest.MonkeyPatch.context() as m:
        _, apart, apart_calls, _ = one_step(tmp_path / "apart", m, False, tree)
    n_attn = config.n_layer - len(config.gdn_layers)
    assert n_attn > 0
    kinds = Counter(kernel for kernel, _, _ in fused)
    assert kinds["_cuda_pointwise.binary"] == kinds["_cuda_fused.rope_kv"] == n_attn   # the GDN layers take neither
    assert kinds["_cuda_gather.gather"] == kinds["_cuda_pointwise.unary"] == 0
    assert len(apart) - len(fused) == 3 * n_attn
    gates = [c for c in calls if c["op"] == "mul_sigmoid"]
    assert len(gates) == len(calls) == n_attn and not [c for c in apart_calls if c["op"] == "mul_sigmoid"]
    H, D = config.n_head, config.head_dim
    for c in gates:
        assert tuple(c["shape"]) == (1, rows, H, D)
        assert tuple(c["a_strides"]) == (0, H * D, D, 1)
        assert tuple(c["b_strides"]) == (0, 2 * H * D, 2 * D, 1)    # each head's gate after its query


@pytest.mark.parametrize("tree", [False, True])
def test_rope_kv_reads_the_queries_in_place(tmp_path, tree):
    """The step's rope_kv launches take q at the projection's address, its rows 2 H D apart and
    its heads 2D apart (each head's query before its gate), k and v after the H query | gate heads."""
    with pytest.MonkeyPatch.context() as m:
        config, launches, calls, rows = one_step(tmp_path, m, True, tree, ("_cuda_fused", "rope_kv"))
    H, Hkv, D = config.n_head, config.n_head_kv, config.head_dim
    assert len(calls) == config.n_layer - len(config.gdn_layers)
    for c in calls:
        assert (c["rows"], c["heads_q"], c["heads_kv"], c["head_dim"]) == (rows, H, Hkv, D)
        assert (c["q_stride"], c["q_head_stride"]) == (2 * H * D, 2 * D)


@pytest.mark.parametrize("tree", [False, True])
def test_the_gate_quantizes_the_out_projections_x(tmp_path, tree):
    """Where the (block-type) out projection would not quantize its x in lane (X_ONCE_MAX_K below
    H*D, as the 27B's 6,144), a decode-family step's gate is luce_gate_quant: o and the gates in place from qg,
    the out projection's x quantized in that launch, then the matmul reusing it (REUSE_X): one
    launch a full-attention layer fewer than the binary + quantize + matmul it replaces."""
    from luce.ops import cuda_backend

    runs = {}
    for name, k_max in (("quant", 0), ("in_lane", 1 << 20)):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(cuda_backend, "X_ONCE_MAX_K", k_max)
            config, launches, calls, rows = one_step(tmp_path / name, m, True, tree, ("_cuda_fused", "gate_quant"),
                                                     dict(MIXES["27b_like"], attn_output="q8_0"))
            runs[name] = (Counter(kernel for kernel, _, _ in launches), calls, len(launches))
    n_attn = config.n_layer - len(config.gdn_layers)
    H, D = config.n_head, config.head_dim
    (fused, calls, n_fused), (in_lane, no_calls, n_in_lane) = runs["quant"], runs["in_lane"]
    assert fused["_cuda_fused.gate_quant"] == len(calls) == n_attn and fused["_cuda_pointwise.binary"] == 0
    assert in_lane["_cuda_fused.gate_quant"] == len(no_calls) == 0 and in_lane["_cuda_pointwise.binary"] == n_attn
    for c in calls:
        assert (c["rows"], c["heads"], c["head_dim"], c["qg_stride"]) == (rows, H, D, 2 * H * D)
    assert n_fused <= n_in_lane


MERGED_MIX = dict(MIXES["27b_like"], attn_q="iq4_xs", attn_k="iq4_xs", attn_v="q5_k")   # the 27B's recipe


@pytest.mark.parametrize("tree", [False, True])
def test_merged_query_gate_and_key_are_read_in_place(tmp_path, tree):
    """attn_q (each head's query, then its gate) and attn_k of one type merge into one weight
    (CUDA merge_weights): one matmul a full-attention layer fewer; rope_kv and the output gate read
    the queries, the key and the gates from that one [q|gate | k] output at its row stride."""
    runs = {}
    for name, mix in (("merged", MERGED_MIX), ("apart", dict(MERGED_MIX, attn_k="q5_k"))):
        with pytest.MonkeyPatch.context() as m:
            config, launches, calls, rows = one_step(tmp_path / name, m, True, tree, ("_cuda_fused", "rope_kv"), mix)
        runs[name] = (Counter(kernel for kernel, _, _ in launches), calls, len(launches))
    n_attn = config.n_layer - len(config.gdn_layers)
    H, Hkv, D = config.n_head, config.n_head_kv, config.head_dim
    (merged, calls, n_merged), (apart, apart_calls, n_apart) = runs["merged"], runs["apart"]
    assert n_apart - n_merged == apart["_cuda_matmul.matmul"] - merged["_cuda_matmul.matmul"] == n_attn
    assert merged["_cuda_gather.gather"] == 0
    width = 2 * H * D + Hkv * D                          # [q|gate | k]
    assert len(calls) == len(apart_calls) == n_attn
    for c, a in zip(calls, apart_calls):
        assert (c["q_stride"], c["q_head_stride"], c["k_stride"]) == (width, 2 * D, width)
        assert c["k"] == c["q"] + 4 * 2 * H * D          # k's columns right after the query | gate heads
        assert (a["q_stride"], a["q_head_stride"], a["k_stride"]) == (2 * H * D, 2 * D, Hkv * D)
    with pytest.MonkeyPatch.context() as m:
        _, _, gates, rows = one_step(tmp_path / "gates", m, True, tree, mix=MERGED_MIX)
    assert len(gates) == n_attn
    for c in gates:
        assert c["op"] == "mul_sigmoid" and tuple(c["shape"]) == (1, rows, H, D)
        assert tuple(c["b_strides"]) == (0, width, 2 * D, 1)   # the gates at the merged row stride
