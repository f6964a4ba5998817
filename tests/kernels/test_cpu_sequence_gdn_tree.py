"""The cpu backend's Gated DeltaNet tree verify and commit (luce/cpu/gdn_tree.c), through the
hooks luce.models.gdn_tree calls: against luce/ref/gdn_tree.py, and bitwise against the cpu AR
step along each node's root path: node outputs ('factor' and 'baseline' modes), stored node
states, and the committed state (factor replay, baseline copy) equal AR decoding's."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ops.api import TreeStage
from luce.ref import gdn_tree as ref_tree
from tests.kernels.cpu_sequence_harness import cpu_backend, same_bits, under_threads
from tests.kernels.gdn_harness import gdn_inputs, random_states
from tests.kernels.test_gdn_tree import leaves, random_tree, root_path
from tests.kernels.tolerances import tolerance


@pytest.fixture(scope="module")
def cpu():
    return cpu_backend()


def assert_close(got, want):
    rtol, atol = tolerance("gdn_recurrent")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def shaped_tree(kind: str, n: int, rng) -> np.ndarray:
    if kind == "chain":
        return np.arange(-1, n - 1)
    if kind == "star":
        return np.array([-1] + [0] * (n - 1))
    if kind == "binary":
        return np.array([-1] + [(i - 1) // 2 for i in range(1, n)])
    if kind == "caterpillar":
        return np.array([-1] + [i - 1 if i % 2 else i - 2 for i in range(1, n)])
    return random_tree(rng, n, chain=0.5)


def ar_along(cpu, inputs, h0, path):
    """The cpu AR step over the path's tokens -> (outputs [len, Hv, Dv], final state)."""
    return cpu.gdn_recurrent(*(x[path] for x in inputs), h0)


@pytest.mark.parametrize("n", [1, 2, 8, 23, 63, 64, 65, 129])
@pytest.mark.parametrize("H,dk,dv", [(3, 32, 32), (1, 128, 128), (2, 17, 40)])
def test_verify_parity_and_factors(cpu, n, H, dk, dv):
    rng = np.random.default_rng(n * 13 + dk + H)
    parents = random_tree(rng, n)
    inputs = gdn_inputs(rng, n, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    keep = h0.copy()
    o, kept = cpu.gdn_tree_verify("factor", *inputs, parents, h0)
    assert same_bits(h0, keep), "verify changed the resident state"
    want_o, factors, _ = ref_tree.gdn_tree_verify(*inputs, parents, h0)
    assert_close(o, want_o)
    f = kept["factors"]
    assert_close(f.u, factors.u)
    for got, src in ((f.k, inputs[1]), (f.g, inputs[3]), (f.beta, inputs[4])):
        assert same_bits(got, src)


@pytest.mark.parametrize("kind,n", [("chain", 31), ("star", 31), ("binary", 31), ("caterpillar", 31),
                                    ("random", 64), ("random", 129)])
def test_nodes_states_and_commits_bitwise_equal_ar_along_root_paths(cpu, kind, n):
    H, dk, dv = 3, 64, 48
    rng = np.random.default_rng(n + len(kind))
    parents = shaped_tree(kind, n, rng)
    inputs = gdn_inputs(rng, n, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    o_factor, kept = cpu.gdn_tree_verify("factor", *inputs, parents, h0)
    o_base, base = cpu.gdn_tree_verify("baseline", *inputs, parents, h0)
    assert same_bits(o_factor, o_base)
    for node in range(n):
        path = root_path(parents, node)
        ar_o, ar_h = ar_along(cpu, inputs, h0, path)
        assert same_bits(o_factor[node], ar_o[-1]), f"node {node} differs from its AR row"
        assert same_bits(base["node_states"][node], ar_h), f"node {node}'s stored state differs from AR"
    x = rng.standard_normal((n, 20)).astype(np.float32)
    conv0 = rng.standard_normal((3, 20)).astype(np.float32)
    for leaf in leaves(parents)[:6]:
        path = root_path(parents, leaf)
        _, ar_h = ar_along(cpu, inputs, h0, path)
        for mode, fields in (("factor", kept), ("baseline", base)):
            pending = TreeStage(conv_inputs=x, mode=mode, parents=parents, **fields)
            conv, gdn = cpu.gdn_tree_commit(pending, conv0, h0, path)
            assert same_bits(gdn, ar_h), f"{mode} commit of {path} differs from AR decoding"
            assert same_bits(conv, np.concatenate([conv0, x[path]])[-3:])


def test_verify_and_commit_are_thread_invariant(cpu):
    H, dk, dv = 48, 32, 32
    rng = np.random.default_rng(8)
    parents = random_tree(rng, 40)
    inputs = gdn_inputs(rng, 40, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    runs = under_threads(lambda: cpu.gdn_tree_verify("factor", *inputs, parents, h0))
    for o, kept in runs[1:]:
        assert same_bits(o, runs[0][0]) and same_bits(kept["factors"].u, runs[0][1]["factors"].u)
    pending = TreeStage(conv_inputs=np.zeros((40, 4), np.float32), mode="factor", parents=parents, **runs[0][1])
    path = root_path(parents, leaves(parents)[-1])
    states = under_threads(lambda: cpu.gdn_tree_commit(pending, np.zeros((3, 4), np.float32), h0, path)[1])
    assert all(same_bits(states[0], s) for s in states[1:])


@pytest.mark.parametrize("mode", ["factor", "baseline"])
def test_one_tree_primitives_against_the_numpy_backend(cpu, mode):
    """The primitives luce.ops.host_step_ops routes tree segments to: results match the numpy
    backend (the references), the inputs are unchanged, the commit is AR decoding of the path."""
    from luce.ops.numpy_backend import NumpyBackend

    ref = NumpyBackend()
    n, H, dk, dv, C, K = 23, 3, 64, 64, 40, 4
    rng = np.random.default_rng(31)
    parents = random_tree(rng, n)
    x = rng.standard_normal((n, C)).astype(np.float32)
    conv_state = rng.standard_normal((K - 1, C)).astype(np.float32)
    inputs = gdn_inputs(rng, n, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    before = h0.copy()
    o, kept = cpu.gdn_tree_verify(mode, *inputs, parents, h0)
    o_ref, kept_ref = ref.gdn_tree_verify(mode, *inputs, parents, h0)
    assert_close(o, o_ref)
    path = root_path(parents, leaves(parents)[-1])
    conv, gdn = cpu.gdn_tree_commit(TreeStage(conv_inputs=x, mode=mode, parents=parents, **kept), conv_state, h0, path)
    conv_ref, gdn_ref = ref.gdn_tree_commit(TreeStage(conv_inputs=x, mode=mode, parents=parents, **kept_ref),
                                            conv_state, h0, path)
    assert same_bits(conv, conv_ref)
    assert_close(gdn, gdn_ref)
    assert same_bits(h0, before)
    assert same_bits(gdn, ar_along(cpu, inputs, h0, path)[1])


def test_malformed_trees_and_paths_raise(cpu):
    H, dk, dv = 2, 16, 16
    rng = np.random.default_rng(9)
    inputs = gdn_inputs(rng, 4, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    for bad in ([0, 0, 1, 2], [-1, 0, 3, 1], [-1, -1, 0, 1]):
        with pytest.raises(ValueError, match="not a tree"):
            cpu.gdn_tree_verify("factor", *inputs, np.array(bad), h0)
    with pytest.raises(ValueError, match="parents"):
        cpu.gdn_tree_verify("factor", *inputs, np.array([-1, 0, 1]), h0)
    with pytest.raises(ValueError, match="mode"):
        cpu.gdn_tree_verify("fast", *inputs, np.array([-1, 0, 1, 1]), h0)
    parents = np.array([-1, 0, 1, 1])
    _, kept = cpu.gdn_tree_verify("factor", *inputs, parents, h0)
    pending = TreeStage(conv_inputs=np.zeros((4, 5), np.float32), mode="factor", parents=parents, **kept)
    for path in ([1, 2], [0, 2, 3], [0, 1, 7]):
        with pytest.raises(ValueError):
            cpu.gdn_tree_commit(pending, np.zeros((3, 5), np.float32), h0, path)
