"""Conv1d over draft trees (cuda/tree_conv.cu) against luce/ref/tree_conv.py and, bitwise,
against the AR kernel (cuda/conv1d.cu) run along each node's root path: node outputs, the
state gathered along a committed path (in place too), padding, malformed parents."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref.tree_conv import conv_tree, conv_tree_commit
from tests.kernels.harness import csr_indptr
from tests.kernels.test_conv1d import _run as run_conv1d
from tests.kernels.test_conv1d import conv_inputs
from tests.kernels.test_gdn_tree import global_parents, leaves, random_tree, root_path
from tests.kernels.tolerances import tolerance

SENTINEL = 321.25


def run_tree(x, w, states, trees, slots, tree_parents=None, silu=True, fill=np.nan, raw=False):
    """Launch luce_conv_tree, one tree per segment -> y [T, C]."""
    from luce import _cuda_tree_conv as kc
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    lib = load_kernels()
    qo = csr_indptr([len(t) for t in trees])
    tp = global_parents(trees) if tree_parents is None else tree_parents
    bufs = [DeviceBuffer.from_numpy(a) for a in (x, w, states, qo, np.asarray(slots, np.int32), tp)]
    y = GuardedOutput(x.shape, fill=fill)
    kc.conv_tree(bufs[0].ptr, bufs[1].ptr, y.ptr, *(b.ptr for b in bufs[2:]), len(trees), x.shape[1],
                 w.shape[1], max(len(t) for t in trees), silu)
    lib.synchronize()
    assert np.array_equal(bufs[2].download(states.shape, np.float32), states), "conv_tree wrote a state"
    return y.raw() if raw else y.result()


def run_commit(x, states, paths, in_slots, out_slots, in_place):
    """Launch luce_conv_tree_commit (paths: global rows of x) -> the state pool after."""
    from luce import _cuda_tree_conv as kc
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    lib = load_kernels()
    indptr = csr_indptr([len(p) for p in paths])
    rows = np.concatenate([np.asarray(p, np.int32) for p in paths])
    bufs = [DeviceBuffer.from_numpy(np.asarray(a, np.int32)) for a in (indptr, rows, in_slots, out_slots)]
    dx = DeviceBuffer.from_numpy(x)
    out = GuardedOutput.holding(states)
    state_in = out if in_place else DeviceBuffer.from_numpy(states)
    kc.conv_tree_commit(dx.ptr, state_in.ptr, out.ptr, *(b.ptr for b in bufs), len(paths), x.shape[1],
                        states.shape[1] + 1)
    lib.synchronize()
    return out.result()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 8, 23, 63, 64, 65, 129])
@pytest.mark.parametrize("C,K", [(300, 4), (10240, 4), (129, 8), (5, 2)])
def test_parity_and_bitwise_ar_along_root_paths(n, C, K):
    rng = np.random.default_rng(n * 5 + C + K)
    parents = random_tree(rng, n)
    x, w, states = conv_inputs(rng, n, C, K, 4)
    y = run_tree(x, w, states, [parents], [3])
    rtol, atol = tolerance("conv1d")
    np.testing.assert_allclose(y, conv_tree(x, w, states[3], parents), rtol=rtol, atol=atol)
    paths = [root_path(parents, leaf) for leaf in leaves(parents)][:8]
    rows = np.concatenate(paths)
    pool = np.repeat(states[3][None], len(paths), axis=0)
    ar_y, ar_states = run_conv1d(x[rows], w, pool, [len(p) for p in paths], np.arange(len(paths)),
                                 np.arange(len(paths)), in_place=True)
    offsets = csr_indptr([len(p) for p in paths])
    for i, path in enumerate(paths):
        assert np.array_equal(y[path], ar_y[offsets[i]:offsets[i + 1]]), "a node differs from the AR row"
        committed = run_commit(x, states, [path], [3], [1], in_place=False)
        assert np.array_equal(committed[1], ar_states[i]), "committed window differs from AR decoding"
        assert np.array_equal(committed[1], conv_tree_commit(x, states[3], path, parents))
        assert np.array_equal(np.delete(committed, 1, axis=0), np.delete(states, 1, axis=0))


@pytest.mark.gpu
def test_segments_padding_silu_off_and_batch_invariance():
    C, K = 257, 4
    rng = np.random.default_rng(9)
    trees = [random_tree(rng, n) for n in (5, 2, 17, 1)]
    slots = [2, -1, 0, 1]
    T = sum(len(t) for t in trees)
    x, w, states = conv_inputs(rng, T, C, K, 3)
    for silu in (True, False):
        y = run_tree(x, w, states, trees, slots, silu=silu, fill=SENTINEL)
        base = 0
        for tree, slot in zip(trees, slots):
            rows = slice(base, base + len(tree))
            base += len(tree)
            if slot < 0:
                assert (y[rows] == np.float32(SENTINEL)).all(), "a padding row was written"
                continue
            alone = run_tree(x[rows], w, states, [tree], [slot], silu=silu)
            assert np.array_equal(alone, y[rows]), "a tree's output changed among other trees"
            want = conv_tree(x[rows], w, states[slot], tree, silu=silu)
            np.testing.assert_allclose(alone, want, *tolerance("conv1d"))


@pytest.mark.gpu
def test_commit_in_place_several_segments():
    C, K = 300, 4
    rng = np.random.default_rng(3)
    trees = [random_tree(rng, n) for n in (9, 1, 4, 6)]
    T = sum(len(t) for t in trees)
    x, _, states = conv_inputs(rng, T, C, K, 5)
    offsets = csr_indptr([len(t) for t in trees])
    paths = [list(offsets[i] + np.asarray(root_path(t, len(t) - 1))) for i, t in enumerate(trees)]
    slots = [4, 0, -1, 2]
    got = run_commit(x, states, paths, slots, slots, in_place=True)
    for i, (tree, slot) in enumerate(zip(trees, slots)):
        if slot < 0:
            continue
        local = [p - offsets[i] for p in paths[i]]
        want = conv_tree_commit(x[offsets[i]:offsets[i + 1]], states[slot], local, tree)
        assert np.array_equal(got[slot], want)
    assert np.array_equal(got[[1, 3]], states[[1, 3]])


@pytest.mark.gpu
def test_parent_after_child_gives_nan():
    C, K = 64, 4
    rng = np.random.default_rng(1)
    tree = random_tree(rng, 6)
    x, w, states = conv_inputs(rng, 6, C, K, 1)
    tp = global_parents([tree])
    tp[2] = 4
    y = run_tree(x, w, states, [tree], [0], tree_parents=tp, raw=True)
    assert np.isnan(y[2]).all()
    np.testing.assert_allclose(y[:2], conv_tree(x, w, states[0], tree)[:2], *tolerance("conv1d"))
