"""On a GPU: a tiny qwen35 whose GDN projections the CUDA backend merges (GDNWeights.merge:
[gate | beta | alpha] beside a qkv of another type, or all four) gives bitwise the logits and
states of the same model with the projections apart, through prefill, AR (cuda/gdn_decode.cu
reading the merged output in place) and tree steps; so does one whose attention's attn_q (query |
gate heads) and attn_k merge (AttentionWeights.merge: rope_kv and the output gate read the merged
output in place). Not run without a GPU; the host-side half (launch counts, strides) is
tests/ops/test_gdn_merge_launches.py and test_gated_attention_launches.py."""
from __future__ import annotations

import numpy as np
import pytest

from tests.ops.test_gated_attention_launches import MERGED_MIX
from tests.ops.test_gdn_merge_launches import MERGED_RUNS, MIXES

pytestmark = pytest.mark.gpu


def run_cuda(path, merge: bool, kind=None):
    from luce.models import SegmentSpec, build_batch, load_model
    from luce.models.gdn_layer import GDNWeights
    from luce.ops import get_backend

    with pytest.MonkeyPatch.context() as m:
        if not merge:
            m.setattr(kind or GDNWeights, "merge", lambda self, backend: self)
        backend = get_backend("cuda")
        model = load_model(path, backend)
    state = model.new_state(max_pages=8, max_slots=2)
    steps = [build_batch([SegmentSpec(0, [3, 9, 4, 7, 1], 0, [0]), SegmentSpec(1, [5, 2, 8], 0, [4])]),
             build_batch([SegmentSpec(0, [6], 5, [0]), SegmentSpec(1, [11], 3, [4])]),
             build_batch([SegmentSpec(0, [10], 6, [0]), SegmentSpec(1, [12], 4, [4])]),
             build_batch([SegmentSpec(1, [13], 5, [4]),
                          SegmentSpec(0, [13, 14, 15, 16], 7, [0], parents=[-1, 0, 0, 1])])]
    logits = [backend.to_numpy(model.forward(batch, state).logits) for batch in steps]
    pools = [backend.to_numpy(p) for il in model.config.gdn_layers for p in state.recurrent.pools(il)]
    return model, logits, pools


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_merged_gdn_projections_give_bitwise_the_logits(tmp_path, mix):
    from luce.testing.tiny_models import make_qwen35

    path = tmp_path / "q35.gguf"
    make_qwen35(path, seed=5, quant_mix=MIXES[mix], hidden=256, ffn=512, head_dim=64, ssm_state_size=64)
    merged, got, got_pools = run_cuda(path, True)
    _, want, want_pools = run_cuda(path, False)
    assert all(len(layer.gdn.merged) == MERGED_RUNS[mix] for layer in merged.layers if layer.gdn is not None)
    for step, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(a, b), f"logits differ at step {step}"
    for a, b in zip(got_pools, want_pools):
        assert np.array_equal(a, b)



@pytest.mark.parametrize("q_gate_type", ["iq4_xs", "q4_k"])
def test_merged_attention_query_gate_and_key_give_bitwise_the_logits(tmp_path, q_gate_type):
    from luce.models.layers import AttentionWeights
    from luce.testing.tiny_models import make_qwen35

    path = tmp_path / "q35.gguf"
    make_qwen35(path, seed=7, quant_mix=dict(MERGED_MIX, attn_q=q_gate_type, attn_k=q_gate_type), hidden=256,
                ffn=512, head_dim=64, ssm_state_size=64)
    merged, got, got_pools = run_cuda(path, True)
    _, want, want_pools = run_cuda(path, False, AttentionWeights)
    attn = [layer.attn for layer in merged.layers if layer.attn is not None]
    assert attn and all(len(a.projections) == 2 for a in attn)   # [q|gate | k], v
    for step, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(a, b), f"logits differ at step {step}"
    for a, b in zip(got_pools, want_pools):
        assert np.array_equal(a, b)
