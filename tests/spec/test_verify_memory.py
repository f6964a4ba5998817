"""Tree-verify scratch plan: buffer sizes match the reference's arrays; the 27B table."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref.gdn_tree import gdn_tree_verify, gdn_tree_verify_baseline
from luce.spec.verify_memory import (QWEN35_27B, VerifyShape, format_plan_table, max_saved_states,
                                     peak_scratch_bytes, verify_scratch_plan)
from luce.testing.tiny_models import tiny_qwen35_config
from tests.ref.test_gdn import gdn_inputs
from tests.ref.test_gdn_tree import random_parents


def test_plan_sizes_match_reference_arrays():
    cfg = tiny_qwen35_config()
    shape = VerifyShape.of_config(cfg)
    n = 9
    hv, d, hk = cfg.ssm_n_v_heads, cfg.ssm_state_size, cfg.ssm_n_k_heads
    q, k, v, g, beta, state = gdn_inputs(n, seed=0, H=hv, Dk=d, Dv=d)
    parents = random_parents(n, 4, np.random.default_rng(0))
    _, factors, _ = gdn_tree_verify(q, k, v, g, beta, parents, state)
    _, node_states = gdn_tree_verify_baseline(q, k, v, g, beta, parents, state)
    L = len(cfg.gdn_layers)
    base = verify_scratch_plan(shape, n, "baseline")
    assert base["per-node GDN states"] == L * node_states.nbytes
    fac = verify_scratch_plan(shape, n, "factor")
    # k is kept per key head (value heads read it tiled); u in f32 on the device
    per_layer = factors.k.nbytes * hk // hv + factors.g.nbytes + factors.beta.nbytes + factors.u.nbytes // 2
    assert fac["GDN factors k, g, beta, u"] == L * per_layer
    assert fac["conv input rows"] == L * n * shape.conv_channels * 4
    assert base["per-node conv windows"] == (cfg.ssm_conv_kernel - 1) * fac["conv input rows"]
    kv_row = len(cfg.full_attention_layers) * 2 * cfg.n_head_kv * cfg.head_dim * 2
    assert fac["scratch KV rows (f16)"] == base["scratch KV rows (f16)"] == n * kv_row


@pytest.mark.parametrize("n", [2, 5, 23, 40, 65])
def test_save_bound_holds_for_random_trees(n):
    rng = np.random.default_rng(n)
    q, k, v, g, beta, state = gdn_inputs(n, seed=n, H=1, Dk=4, Dv=4)
    for _ in range(5):
        parents = random_parents(n, 16, rng)
        assert gdn_tree_verify(q, k, v, g, beta, parents, state)[2] <= max_saved_states(n)


def test_dense_model_has_no_gdn_scratch():
    from luce.testing.tiny_models import tiny_dense_config
    shape = VerifyShape.of_config(tiny_dense_config("qwen3"))
    assert peak_scratch_bytes(shape, 23, "factor") == peak_scratch_bytes(shape, 23, "baseline")
    with pytest.raises(ValueError, match="mode"):
        verify_scratch_plan(shape, 23, "per-node")


def test_27b_plan_table(capsys):
    table = format_plan_table(QWEN35_27B, (22, 64))
    with capsys.disabled():
        print("\nPeak tree-verify scratch, Qwen3.5 27B shape + 5-layer DFlash features:\n" + table)
    for b in (22, 64):
        f, base = (peak_scratch_bytes(QWEN35_27B, b + 1, m) for m in ("factor", "baseline"))
        assert f < base / 20  # per-node states dominate the baseline: 3 MiB per node per layer
        assert verify_scratch_plan(QWEN35_27B, b + 1, "baseline")["per-node GDN states"] == (b + 1) * 48 * 3 << 20
