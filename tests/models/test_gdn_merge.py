"""A GDN layer's merged input projections (luce.models.gdn_layer GDNWeights.merge) through the
composition path (luce.ops.api FusedOps.conv_gdn_norm, luce.ops.gdn_inputs gdn_input_blocks; stage_tree_rows of a
merged part) on a host backend that merges: prefill, AR and tree steps give bitwise the logits,
states and tree stages of the weights kept apart. The host backends' own merge_weights answer
None (they keep the weights apart); tests/models/test_gdn_merge_cuda.py checks the CUDA one."""
from __future__ import annotations

import numpy as np
import pytest

from luce.models import SegmentSpec, build_batch, load_model
from luce.models.gdn_layer import gdn_projections
from luce.ops.numpy_backend import NumpyBackend
from luce.testing.tiny_models import make_qwen35


class ColumnwiseNumpy(NumpyBackend):
    """numpy whose matmul computes each output column alone (x @ w[n], the same call whatever
    matrix row n sits in), so a merged weight's columns are bitwise the separate weights'."""

    merge = True
    apart_rows = ()   # row counts of weights never merged (a qkv of another ggml type, as in the 27B)

    def matmul(self, x, w, bias=None, prefill_spans=()):
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
        for n in range(w.shape[0]):
            out[:, n] = x @ w[n]
        return out if bias is None else out + bias

    def merge_weights(self, weights):
        if not self.merge or len(weights) < 2 or len({w.shape[1] for w in weights}) != 1 \
                or any(w.shape[0] in self.apart_rows for w in weights):
            return None
        return np.concatenate(weights)


def run_steps(path, merge: bool, apart_rows=()):
    """Prefill of 2 slots, an AR step, then a tree step on slot 0 -> (model, logits per step,
    the tree step's staged conv inputs, the final states)."""
    backend = ColumnwiseNumpy()
    backend.merge, backend.apart_rows = merge, apart_rows
    model = load_model(path, backend)
    state = model.new_state(max_pages=8, max_slots=2)
    steps = [build_batch([SegmentSpec(0, [3, 9, 4, 7, 1], 0, [0]), SegmentSpec(1, [5, 2, 8], 0, [4])]),
             build_batch([SegmentSpec(0, [6], 5, [0]), SegmentSpec(1, [11], 3, [4])]),
             build_batch([SegmentSpec(1, [12], 4, [4]),
                          SegmentSpec(0, [13, 14, 15, 16], 6, [0], parents=[-1, 0, 0, 1])])]
    logits, staged = [], None
    for batch in steps:
        out = model.forward(batch, state)
        logits.append(np.asarray(out.logits))
        staged = out.staged or staged
    pools = [np.array(p) for il in model.config.gdn_layers for p in state.recurrent.pools(il)]
    return model, logits, staged, pools


@pytest.mark.parametrize("qkv_apart", [False, True], ids=["all_merged", "qkv_apart"])
def test_merged_gdn_projections_give_the_bits_of_separate_ones(tmp_path, qkv_apart):
    path = tmp_path / "q35.gguf"
    config = make_qwen35(path, seed=9, quant_mix="q8_0")
    apart_rows = (2 * config.ssm_n_k_heads * config.ssm_state_size + config.ssm_inner,) if qkv_apart else ()
    merged, got_logits, got_staged, got_pools = run_steps(path, True, apart_rows)
    apart, want_logits, want_staged, want_pools = run_steps(path, False)
    runs = 2 if qkv_apart else 1
    for il in merged.config.gdn_layers:
        assert len(gdn_projections(merged.layers[il].gdn)) == runs
        assert len(gdn_projections(apart.layers[il].gdn)) == 4
    for got, want in zip(got_logits, want_logits):
        assert np.array_equal(got, want)
    assert got_staged and set(got_staged) == set(want_staged)
    for il, stage in got_staged.items():
        assert np.array_equal(stage.conv_inputs, want_staged[il].conv_inputs)
        assert stage.conv_inputs.shape[1] == merged.gdn_dims.conv_channels
    for got, want in zip(got_pools, want_pools):
        assert np.array_equal(got, want)
