"""Gated DeltaNet tree kernels (cuda/gdn_tree.cu) against luce/ref/gdn_tree.py and, bitwise,
against the AR kernel (cuda/gdn_recurrent.cu) run along each node's root path: verify with
factor capture (outputs, u, factor copies), commit by factor replay, saved states on chip
and in the workspace, padding, bad slots, malformed trees, batch invariance."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref.gdn_tree import gdn_tree_commit, gdn_tree_verify
from tests.kernels.gdn_harness import gdn_inputs, random_states
from tests.kernels.harness import csr_indptr
from tests.kernels.test_gdn_recurrent import run_kernel as run_recurrent
from tests.kernels.tolerances import tolerance

SENTINEL = -555.5


def random_tree(rng, n: int, chain: float = 0.6) -> np.ndarray:
    """Local parents [n] int64 (root -1, parents precede children): mostly a chain with
    side branches, like a DDTree (chain = probability of extending the previous node)."""
    parents = np.full(n, -1, dtype=np.int64)
    for i in range(1, n):
        parents[i] = i - 1 if rng.random() < chain else rng.integers(0, i)
    return parents


def root_path(parents, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(int(node))
        node = int(parents[node])
    return path[::-1]


def leaves(parents) -> list[int]:
    has_child = np.zeros(len(parents), bool)
    has_child[[p for p in parents if p >= 0]] = True
    return [i for i in range(len(parents)) if not has_child[i]]


def global_parents(trees) -> np.ndarray:
    """Concatenate local parent arrays into global parent rows [T] int32."""
    out, base = [], 0
    for parents in trees:
        out.append(np.where(np.asarray(parents) >= 0, np.asarray(parents) + base, -1))
        base += len(parents)
    return np.concatenate(out).astype(np.int32)


def run_verify(inputs, states, trees, slots, max_tree_rows=None, tree_parents=None, fill=np.nan,
               raw=False):
    """Launch luce_gdn_tree_verify for one tree per segment -> dict of out, u, k, g, beta."""
    from luce import _cuda_gdn_tree as kt
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    lib = load_kernels()
    q, k, v, g, beta = inputs
    T, H, dk = q.shape
    dv = v.shape[2]
    qo = csr_indptr([len(t) for t in trees])
    if tree_parents is None:
        tree_parents = global_parents(trees)
    max_tree_rows = max_tree_rows or max(len(t) for t in trees)
    bufs = [DeviceBuffer.from_numpy(a) for a in (q, k, v, g, beta, states, qo,
                                                 np.asarray(slots, np.int32), tree_parents)]
    outs = {"out": GuardedOutput((T, H, dv), fill=fill), "u": GuardedOutput((T, H, dv), fill=fill),
            "k": GuardedOutput((T, H, dk)), "g": GuardedOutput((T, H)), "beta": GuardedOutput((T, H))}
    ws_bytes = kt.verify_workspace_bytes(len(trees), H, dk, dv, max_tree_rows)
    ws = DeviceBuffer(ws_bytes)
    kt.gdn_tree_verify(*(b.ptr for b in bufs[:6]), outs["out"].ptr, outs["u"].ptr,
                       *(b.ptr for b in bufs[6:]), states.shape[0], len(trees), H, dk, dv,
                       max_tree_rows, ws.ptr, ws_bytes, outs["k"].ptr, outs["g"].ptr, outs["beta"].ptr)
    lib.synchronize()
    got = {name: (o.raw() if raw else o.result()) for name, o in outs.items()}
    got["workspace_bytes"] = ws_bytes
    assert np.array_equal(bufs[5].download(states.shape, np.float32), states), "verify wrote a state"
    return got


def run_commit(k, g, u, states, paths, slots):
    """Launch luce_gdn_tree_commit (paths: lists of global factor rows) -> states after."""
    from luce import _cuda_gdn_tree as kt
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    lib = load_kernels()
    indptr = csr_indptr([len(p) for p in paths])
    rows = np.concatenate([np.asarray(p, np.int32) for p in paths] + [np.zeros(0, np.int32)])
    bufs = [DeviceBuffer.from_numpy(a) for a in (k, g, u, indptr, rows, np.asarray(slots, np.int32))]
    state = GuardedOutput.holding(states)
    kt.gdn_tree_commit(bufs[0].ptr, bufs[1].ptr, bufs[2].ptr, state.ptr, *(b.ptr for b in bufs[3:]),
                       states.shape[0], len(paths), k.shape[1], k.shape[2], u.shape[2])
    lib.synchronize()
    return state.result()


def assert_close(got, want):
    rtol, atol = tolerance("gdn_recurrent")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def ar_along_paths(inputs, h0, paths):
    """cuda gdn_recurrent along each path (one segment per path, each on its own copy of
    h0) -> (outputs per path [len, Hv, Dv], final state per path)."""
    rows = np.concatenate([np.asarray(p) for p in paths])
    seq = tuple(a[rows] for a in inputs)
    qo = csr_indptr([len(p) for p in paths])
    pool = np.repeat(h0[None], len(paths), axis=0)
    out, pool = run_recurrent(seq, pool, qo, np.arange(len(paths)))
    return [out[qo[i]:qo[i + 1]] for i in range(len(paths))], pool


def test_tree_helpers():
    rng = np.random.default_rng(0)
    p = random_tree(rng, 30)
    assert p[0] == -1 and all(0 <= p[i] < i for i in range(1, 30))
    for leaf in leaves(p):
        path = root_path(p, leaf)
        assert path[0] == 0 and path[-1] == leaf
        assert all(p[b] == a for a, b in zip(path, path[1:]))
    assert list(global_parents([[-1, 0], [-1, 0, 1]])) == [-1, 0, -1, 2, 3]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 8, 23, 63, 64, 65, 129])
@pytest.mark.parametrize("H,dk,dv", [(3, 128, 128), (5, 64, 64), (1, 256, 32), (2, 128, 96)])
def test_verify_parity_and_factors(n, H, dk, dv):
    rng = np.random.default_rng(n * 13 + dk + H)
    parents = random_tree(rng, n)
    inputs = gdn_inputs(rng, n, H, dk, dv)
    states = random_states(rng, 3, H, dk, dv)
    got = run_verify(inputs, states, [parents], [2])
    want_o, factors, _ = gdn_tree_verify(*inputs, parents, states[2])
    assert_close(got["out"], want_o)
    assert_close(got["u"], factors.u)
    for name, src in (("k", inputs[1]), ("g", inputs[3]), ("beta", inputs[4])):
        assert np.array_equal(got[name], src), f"factor copy {name} differs from the input"


@pytest.mark.gpu
@pytest.mark.parametrize("shape,n,max_rows", [((4, 128, 128), 23, None), ((3, 128, 64), 64, None),
                                              ((2, 256, 64), 64, None), ((2, 64, 64), 40, 512)])
def test_nodes_and_commit_bitwise_equal_ar_along_root_paths(shape, n, max_rows):
    """Every node's output equals cuda gdn_recurrent's along its root path, and committing a
    leaf's path replays to the state gdn_recurrent leaves (Dk 256 x 64 rows keeps the saved
    states in the workspace, Dk 128 x 23 rows on chip; max 512 rows sizes the schedule arrays)."""
    H, dk, dv = shape
    rng = np.random.default_rng(n + dk)
    parents = random_tree(rng, n, chain=0.5)
    inputs = gdn_inputs(rng, n, H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    got = run_verify(inputs, states, [parents], [1], max_tree_rows=max_rows)
    if dk == 256 and n == 64:
        assert got["workspace_bytes"] > 0, "6 saved 256-row states should not fit on chip"
    elif dk == 128 and n < 32:  # 4 saves, 64 KB: on chip on every sm_80+ (6, 96 KB: not in 99 KB)
        assert got["workspace_bytes"] == 0
    paths = [root_path(parents, leaf) for leaf in leaves(parents)]
    ar_out, ar_states = ar_along_paths(inputs, states[1], paths)
    seen = set()
    for path, out in zip(paths, ar_out):
        for depth, node in enumerate(path):
            assert np.array_equal(got["out"][node], out[depth]), f"node {node} differs from the AR row"
            seen.add(node)
    assert seen == set(range(n))
    for i in rng.permutation(len(paths))[:4]:
        committed = run_commit(got["k"], got["g"], got["u"], states, [paths[i]], [1])
        assert np.array_equal(committed[1], ar_states[i]), "committed state differs from AR decoding"
        assert np.array_equal(committed[0], states[0]), "another slot's state changed"
        assert_close(committed[1], gdn_tree_commit(states[1], gdn_tree_verify(*inputs, parents, states[1])[1],
                                                   paths[i], parents))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["chain", "star", "binary", "caterpillar"])
def test_tree_shapes(kind):
    """Walks with no saves (chain), one wide branch point (star), the most nested saves
    (complete binary tree) and a spine with a leaf per node."""
    n = 31
    if kind == "chain":
        parents = np.arange(-1, n - 1)
    elif kind == "star":
        parents = np.array([-1] + [0] * (n - 1))
    elif kind == "binary":
        parents = np.array([-1] + [(i - 1) // 2 for i in range(1, n)])
    else:
        parents = np.array([-1] + [i - 1 if i % 2 else i - 2 for i in range(1, n)])
    H, dk, dv = 2, 128, 64
    rng = np.random.default_rng(7)
    inputs = gdn_inputs(rng, n, H, dk, dv)
    states = random_states(rng, 1, H, dk, dv)
    got = run_verify(inputs, states, [parents], [0])
    paths = [root_path(parents, leaf) for leaf in leaves(parents)]
    ar_out, _ = ar_along_paths(inputs, states[0], paths)
    for path, out in zip(paths, ar_out):
        assert np.array_equal(got["out"][path], out)


@pytest.mark.gpu
def test_segments_padding_bad_slot_and_batch_invariance():
    H, dk, dv = 3, 128, 64
    rng = np.random.default_rng(4)
    trees = [random_tree(rng, n) for n in (8, 3, 23, 1, 5)]
    slots = [4, -1, 0, 2, 9]  # padding segment, and slot 9 >= n_slots
    T = sum(len(t) for t in trees)
    inputs = gdn_inputs(rng, T, H, dk, dv)
    states = random_states(rng, 5, H, dk, dv)
    got = run_verify(inputs, states, trees, slots, fill=SENTINEL, raw=True)
    base = 0
    for tree, slot in zip(trees, slots):
        rows = slice(base, base + len(tree))
        base += len(tree)
        if slot < 0:
            assert (got["out"][rows] == np.float32(SENTINEL)).all(), "a padding row was written"
            continue
        if slot >= len(states):
            assert np.isnan(got["out"][rows]).all() and np.isnan(got["u"][rows]).all()
            continue
        one = tuple(a[rows] for a in inputs)
        alone = run_verify(one, states, [tree], [slot])
        assert np.array_equal(alone["out"], got["out"][rows]), "tree output changed among other trees"
        assert np.array_equal(alone["u"], got["u"][rows])
        assert_close(alone["out"], gdn_tree_verify(*one, tree, states[slot])[0])


@pytest.mark.gpu
def test_malformed_tree_and_oversized_tree_get_nan():
    H, dk, dv = 1, 64, 32
    rng = np.random.default_rng(2)
    good, bad = random_tree(rng, 6), random_tree(rng, 6)
    tp = global_parents([good, bad])
    tp[6 + 3] = 6 + 4  # a parent after its child
    inputs = gdn_inputs(rng, 12, H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    got = run_verify(inputs, states, [good, bad], [0, 1], tree_parents=tp, raw=True)
    assert np.isnan(got["out"][6:]).all()
    assert_close(got["out"][:6], gdn_tree_verify(*(a[:6] for a in inputs), good, states[0])[0])
    big = random_tree(rng, 9)
    inputs = gdn_inputs(rng, 9, H, dk, dv)
    got = run_verify(inputs, states, [big], [0], max_tree_rows=8, raw=True)
    assert np.isnan(got["out"]).all()


@pytest.mark.gpu
def test_commit_skips_padding_and_bad_slots():
    H, dk, dv = 2, 64, 64
    rng = np.random.default_rng(5)
    n = 6
    parents = random_tree(rng, n)
    inputs = gdn_inputs(rng, n, H, dk, dv)
    states = random_states(rng, 3, H, dk, dv)
    got = run_verify(inputs, states, [parents], [2])  # factors of slot 2's tree
    path = root_path(parents, n - 1)
    after = run_commit(got["k"], got["g"], got["u"], states, [path, path, path], [-1, 7, 2])
    assert np.array_equal(after[:2], states[:2])
    _, ar_states = ar_along_paths(inputs, states[2], [path])
    assert np.array_equal(after[2], ar_states[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dk,dv,max_rows", [(96, 64, 8), (128, 48, 8), (128, 64, 513)])
def test_unsupported_sizes_raise(dk, dv, max_rows):
    from luce import _cuda_gdn_tree as kt
    from luce.ops.native import load_kernels

    load_kernels()
    with pytest.raises(ValueError, match="gdn_tree_verify"):
        kt.verify_workspace_bytes(1, 1, dk, dv, max_rows)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["factor", "baseline"])
def test_step_ops_over_every_segment_kind(mode):
    """The CUDA backend's step ops (luce/ops/cuda_step_ops.py: conv1d_step, gdn_step,
    tree_commit; one launch per op over [prefill][AR][tree][tree]) against the numpy
    backend's (the references), both GDN tree modes on the device; the committed states are
    bitwise the AR kernel's along the accepted paths."""
    from luce.models import SegmentSpec, build_batch
    from luce.models.commit import plan_tree_commit
    from luce.ops.api import TreeStage
    from luce.ops.cuda_backend import CudaBackend
    from luce.ops.numpy_backend import NumpyBackend

    dev, ref = CudaBackend(), NumpyBackend()
    H, dk, dv, C, K, n_slots = 3, 128, 128, 200, 4, 4
    rng = np.random.default_rng(41 + len(mode))
    trees = [random_tree(rng, 9), random_tree(rng, 6)]
    pages = lambda s: list(range(8 * s, 8 * s + 8))  # noqa: E731
    batch = build_batch([SegmentSpec(0, [1] * 70, 30, pages(0)), SegmentSpec(1, [2], 17, pages(1)),
                         SegmentSpec(2, [3] * 9, 20, pages(2), parents=trees[0].tolist()),
                         SegmentSpec(3, [4] * 6, 8, pages(3), parents=trees[1].tolist())])
    T, t0 = batch.n_rows, batch.tree_start
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = (rng.standard_normal((C, K)) * 0.5).astype(np.float32)
    conv0 = rng.standard_normal((n_slots, K - 1, C)).astype(np.float32)
    inputs = gdn_inputs(rng, T, H, dk, dv)
    h0 = random_states(rng, n_slots, H, dk, dv)
    conv_ref, gdn_ref = conv0.copy(), h0.copy()
    up = dev.upload
    conv_dev, gdn_dev = up(conv0), up(h0)
    y_ref = ref.conv1d_step(x, w, conv_ref, batch)
    y_dev = dev.to_numpy(dev.conv1d_step(up(x), up(w), conv_dev, batch))
    live = np.arange(T) < batch.qo_indptr[-1]
    np.testing.assert_allclose(y_dev[live], y_ref[live], *tolerance("conv1d"))
    o_ref, part_ref = ref.gdn_step(*inputs, gdn_ref, batch, mode)
    o_dev, part_dev = dev.gdn_step(*(up(a) for a in inputs), gdn_dev, batch, mode)
    assert_close(dev.to_numpy(o_dev), o_ref)
    for slot in (0, 1):                                  # prefill and AR slots advanced in place
        assert_close(dev.to_numpy(gdn_dev[slot]), gdn_ref[slot])
    for slot in (2, 3):                                  # tree slots: read only
        assert np.array_equal(dev.to_numpy(gdn_dev[slot]), h0[slot])
    paths = {2: root_path(trees[0], leaves(trees[0])[-1]), 3: root_path(trees[1], leaves(trees[1])[0])}
    commit = plan_tree_commit(batch, paths)
    ref.tree_commit(conv_ref, gdn_ref, TreeStage(x[t0:], mode, **part_ref), commit)
    dev.tree_commit(conv_dev, gdn_dev, TreeStage(dev.take_rows(up(x), np.arange(t0, T)), mode, **part_dev), commit)
    assert np.array_equal(dev.to_numpy(conv_dev), conv_ref)
    got = dev.to_numpy(gdn_dev)
    assert_close(got, gdn_ref)
    for slot, parents in zip((2, 3), trees):              # bitwise the AR kernel along the path
        r0 = int(batch.qo_indptr[batch.tree_segments()[slot - 2]])
        rows = [r0 + node for node in paths[slot]]
        _, ar = ar_along_paths(inputs, h0[slot], [rows])
        assert np.array_equal(got[slot], ar[0]), f"{mode}: slot {slot} commit differs from AR decoding"
    assert dev.host_fallbacks == {}
