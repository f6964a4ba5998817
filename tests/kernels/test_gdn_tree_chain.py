"""A GDN layer's chain over a step of draft-tree rows only (the CUDA backend's conv_gdn_norm:
luce_gdn_tree_prepare, the tree verify, gated_rmsnorm; luce/ops/cuda_fused_ops.py _tree_chain):
bitwise the composition (luce.ops.api.FusedOps on the same device) in the output rows (padding
rows of the tree block zeros), in what the commit reads (the tree rows' conv inputs, factors or
per-node states) and in the states it leaves alone, for trees on scattered slots beside padding. tests/kernels/test_gdn_tree_prepare_emulated.py checks the
prepare launch on the CPU."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ops.api import FusedOps
from tests.kernels.test_gdn_decode import L2_EPS, RMS_EPS, SHAPES, initial_pools, layer_weights, step_inputs

TREES = [(5, 1, 7), (1, 23, 9), (6, 4, 3)]   # (slot, rows, tree seed): a root alone, a 23-row tree, a small one


def tree_batch(trees, pad: bool):
    """Tree segments of random trees (tests/spec/test_tree_verify.py random_tree), a padding
    segment first and the second tree padded by 3 rows where pad."""
    from luce.models import SegmentSpec, build_batch
    from tests.spec.test_tree_verify import random_tree

    specs = [SegmentSpec(-1, [0, 0], 0, [])] if pad else []
    for i, (slot, n, seed) in enumerate(trees):
        tree = random_tree(3, n, 6, seed=seed)
        specs.append(SegmentSpec(slot, tree.tokens.tolist(), 40, [4 * i + j for j in range(4)],
                                 parents=tree.parents.tolist(), pad_to=n + 3 if pad and i == 1 else None))
    return build_batch(specs)


def run(cuda, fused: bool, x, w, pools, batch, Hk, mode):
    """conv_gdn_norm over device copies -> (normed, the tree part's arrays, conv pool, gdn pool,
    the live tree rows' conv inputs) on the host (the composition's as the model stages them)."""
    conv_pool, gdn_pool = (cuda.asarray(p) for p in pools)
    dev = {k: cuda.asarray(v) for k, v in {**x, **w}.items()}
    zba = cuda.asarray(np.concatenate([x["z"], x["b"], x["a"]], axis=1))   # the 27B mix's merged [z | b | a]
    args = ([dev["qkv"], zba], dev["conv"], dev["dt_bias"], dev["ssm_a"], dev["norm"], conv_pool, gdn_pool, batch,
            Hk, L2_EPS, RMS_EPS, mode)
    normed, part = cuda.conv_gdn_norm(*args) if fused else FusedOps.conv_gdn_norm(cuda, *args)
    kept = [part["factors"].k, part["factors"].g, part["factors"].beta, part["factors"].u] if mode == "factor" \
        else [part["node_states"]]
    staged = part["conv_inputs"] if "conv_inputs" in part else cuda.stage_tree_rows(dev["qkv"], batch, conv_pool)
    live = np.concatenate([np.arange(batch.qo_indptr[s], batch.qo_indptr[s + 1])
                           for s in range(batch.n_segments) if batch.seq_slots[s] >= 0])
    return (cuda.to_numpy(normed), [cuda.to_numpy(a) for a in kept], cuda.to_numpy(conv_pool),
            cuda.to_numpy(gdn_pool), cuda.to_numpy(staged)[live - batch.tree_start])


@pytest.fixture(scope="module")
def cuda():
    from luce.ops import get_backend

    return get_backend("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["factor", "baseline"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tree_chain_is_the_composition_bits(cuda, shape, mode):
    rng = np.random.default_rng(shape[2] + len(mode))
    w = layer_weights(rng, shape)
    pools = initial_pools(rng, shape)
    batch = tree_batch(TREES, pad=True)
    x = step_inputs(rng, batch.n_rows, shape)
    got = run(cuda, True, x, w, pools, batch, shape[0], mode)
    want = run(cuda, False, x, w, pools, batch, shape[0], mode)
    t0 = batch.tree_start
    assert batch.n_rows - t0 > sum(n for _, n, _ in TREES), "no padding rows in the tree block"
    assert np.array_equal(got[0][t0:], want[0][t0:]), "normed rows of the tree block differ"
    assert len(got[1]) == len(want[1]) and all(np.array_equal(a, b) for a, b in zip(got[1], want[1])), \
        "what the commit reads differs"
    assert np.array_equal(got[4], want[4]) and np.array_equal(got[4], x["qkv"][np.concatenate(
        [np.arange(batch.qo_indptr[s], batch.qo_indptr[s + 1]) for s in range(batch.n_segments)
         if batch.seq_slots[s] >= 0])]), "the commit's conv inputs differ"
    for have, before in zip(got[2:4], pools):
        assert np.array_equal(have, before), "a tree step changed a durable state"


@pytest.mark.gpu
def test_tree_rows_alone_are_the_rows_beside_other_trees(cuda):
    shape = SHAPES[1]
    rng = np.random.default_rng(17)
    w = layer_weights(rng, shape)
    pools = initial_pools(rng, shape)
    together_batch = tree_batch(TREES, pad=False)
    x = step_inputs(rng, together_batch.n_rows, shape)
    together = run(cuda, True, x, w, pools, together_batch, shape[0], "factor")
    alone_batch = tree_batch(TREES[1:2], pad=False)
    r0 = together_batch.qo_indptr[1]
    alone_x = {k: v[r0:r0 + TREES[1][1]] for k, v in x.items()}
    alone = run(cuda, True, alone_x, w, pools, alone_batch, shape[0], "factor")
    assert np.array_equal(alone[0], together[0][r0:r0 + TREES[1][1]])
