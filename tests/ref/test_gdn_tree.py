"""GDN tree verify: exact factor capture == per-node-state baseline == AR decoding, bitwise;
closed form to f32 tolerance; tree conv windows and tree attention equal their AR rows."""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.kv_cache import PAGE_SIZE
from luce.ref.attention import paged_attention
from luce.ref.conv1d import causal_conv1d
from luce.ref.gdn_recurrent import gdn_recurrent
from luce.ref.gdn_tree import (gdn_tree_closed_form, gdn_tree_commit, gdn_tree_commit_baseline,
                               gdn_tree_commit_closed_form, gdn_tree_verify, gdn_tree_verify_baseline)
from luce.ref.tree_attention import paged_tree_attention
from luce.ref.tree_conv import conv_tree, conv_tree_commit
from tests.ref.test_gdn import gdn_inputs


def random_parents(n: int, max_depth: int, rng) -> np.ndarray:
    """A random tree of n nodes, no deeper than max_depth (root depth 0)."""
    parents, depth = [-1], [0]
    for _ in range(1, n):
        choices = [i for i in range(len(parents)) if depth[i] < max_depth]
        p = int(rng.choice(choices)) if rng.random() < 0.7 else max(choices, key=lambda i: (depth[i], i))
        parents.append(p)
        depth.append(depth[p] + 1)
    return np.array(parents)


def path_to(parents, node):
    out = []
    while node >= 0:
        out.append(node)
        node = int(parents[node])
    return out[::-1]


def tree_cases():
    rng = np.random.default_rng(7)
    cases = [("chain16", np.arange(-1, 16)), ("star", np.array([-1] + [0] * 9)), ("root", np.array([-1]))]
    for i in range(9):
        n = int(rng.integers(2, 66))
        cases.append((f"random{i}_n{n}", random_parents(n, 16, rng)))
    cases.append(("full64", random_parents(65, 16, rng)))
    return cases


CASES = tree_cases()


@pytest.mark.parametrize("name,parents", CASES, ids=[c[0] for c in CASES])
def test_factor_capture_equals_baseline_and_ar_bitwise(name, parents):
    n = len(parents)
    q, k, v, g, beta, state = gdn_inputs(n, seed=n, H=3, Dk=16, Dv=12)
    o, factors, peak = gdn_tree_verify(q, k, v, g, beta, parents, state)
    o_base, node_states = gdn_tree_verify_baseline(q, k, v, g, beta, parents, state)
    assert o.dtype == np.float32 and np.array_equal(o, o_base)
    n_branch = sum(1 for i in range(n) if (parents == i).sum() > 1)
    assert peak <= min(n_branch, int(np.log2(n)))
    for leaf in range(n):  # commit every possible accepted path
        path = path_to(parents, leaf)
        committed = gdn_tree_commit(state, factors, path, parents)
        assert np.array_equal(committed, gdn_tree_commit_baseline(node_states, path, parents))
        o_ar, h_ar = gdn_recurrent(q[path], k[path], v[path], g[path], beta[path], state)
        assert np.array_equal(committed, h_ar), f"path to {leaf}: replayed state != AR state"
        assert np.array_equal(o[path], o_ar), f"path to {leaf}: tree outputs != AR outputs"


def test_ar_split_token_by_token_equals_tree_walk():
    """AR decoding one call per token (the engine's decode rows) gives the same bits too."""
    parents = random_parents(30, 16, np.random.default_rng(3))
    q, k, v, g, beta, state = gdn_inputs(30, seed=3)
    o, factors, _ = gdn_tree_verify(q, k, v, g, beta, parents, state)
    path = path_to(parents, 29)
    h = state
    for node in path:
        sl = slice(node, node + 1)
        o_t, h = gdn_recurrent(q[sl], k[sl], v[sl], g[sl], beta[sl], h)
        assert np.array_equal(o_t[0], o[node])
    assert np.array_equal(h, gdn_tree_commit(state, factors, path, parents))


@pytest.mark.parametrize("name,parents", CASES, ids=[c[0] for c in CASES])
def test_closed_form_matches_baseline_to_f32_tolerance(name, parents):
    n = len(parents)
    q, k, v, g, beta, state = gdn_inputs(n, seed=100 + n)
    o_cf, U = gdn_tree_closed_form(q, k, v, g, beta, parents, state)
    o_base, node_states = gdn_tree_verify_baseline(q, k, v, g, beta, parents, state)
    _, factors, _ = gdn_tree_verify(q, k, v, g, beta, parents, state)
    assert_f32_close(o_cf, o_base)
    assert_f32_close(U, factors.u)
    for leaf in range(n):
        path = path_to(parents, leaf)
        assert_f32_close(gdn_tree_commit_closed_form(state, k, g, U, path, parents), node_states[leaf])


def assert_f32_close(got, want):
    """Within a few f32 ulps of the scale (measured worst: 1.2e-7 of scale over CASES)."""
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max())
    assert err <= 1e-6 * scale, f"closed form off by {err:.3g} (scale {scale:.3g})"


def test_bad_trees_and_paths_are_rejected():
    q, k, v, g, beta, state = gdn_inputs(3, seed=0)
    with pytest.raises(ValueError, match="parent"):
        gdn_tree_verify(q, k, v, g, beta, np.array([-1, 2, 0]), state)
    _, factors, _ = gdn_tree_verify(q, k, v, g, beta, np.array([-1, 0, 0]), state)
    with pytest.raises(ValueError, match="path"):
        gdn_tree_commit(state, factors, [0, 1, 2], np.array([-1, 0, 0]))
    with pytest.raises(ValueError, match="path"):
        gdn_tree_commit(state, factors, [1], np.array([-1, 0, 0]))


@pytest.mark.parametrize("name,parents", CASES[:5], ids=[c[0] for c in CASES[:5]])
def test_tree_conv_equals_ar_conv_along_every_path(name, parents):
    n, C, K = len(parents), 10, 4
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    state = rng.standard_normal((K - 1, C)).astype(np.float32)
    y = conv_tree(x, w, state, parents)
    for leaf in range(n):
        path = path_to(parents, leaf)
        y_ar, s_ar = causal_conv1d(x[path], w, state)
        assert np.array_equal(y[path], y_ar)
        assert np.array_equal(conv_tree_commit(x, state, path, parents), s_ar)
        h = state  # one call per token, as AR rows
        for node in path:
            y_t, h = causal_conv1d(x[node:node + 1], w, h)
            assert np.array_equal(y_t[0], y[node])
        assert np.array_equal(h, s_ar)


@pytest.mark.parametrize("prefix_len", [0, 5, 16, 37])
def test_tree_attention_equals_ar_rows_bitwise(prefix_len):
    rng = np.random.default_rng(prefix_len)
    parents = random_parents(20, 6, rng)
    n, hq, hkv, d = len(parents), 4, 2, 8
    n_pages = (prefix_len + n) // PAGE_SIZE + 2
    k_pages = rng.standard_normal((n_pages, PAGE_SIZE, hkv, d)).astype(np.float32)
    v_pages = rng.standard_normal((n_pages, PAGE_SIZE, hkv, d)).astype(np.float32)
    pages = rng.permutation(n_pages)
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    o = paged_tree_attention(q, k_pages, v_pages, pages, prefix_len, parents, 0.3)
    flat_k = k_pages[pages].reshape(-1, hkv, d)
    flat_v = v_pages[pages].reshape(-1, hkv, d)
    for leaf in range(n):
        path = path_to(parents, leaf)
        # the committed layout AR decoding would have: prefix then the path's rows in order
        seq_len = prefix_len + len(path)
        ar_k = np.concatenate([flat_k[:prefix_len], flat_k[prefix_len + np.array(path)]])
        ar_v = np.concatenate([flat_v[:prefix_len], flat_v[prefix_len + np.array(path)]])
        n_ar_pages = -(-seq_len // PAGE_SIZE)
        pad = n_ar_pages * PAGE_SIZE - seq_len
        kp = np.concatenate([ar_k, np.zeros((pad, hkv, d), np.float32)]).reshape(n_ar_pages, PAGE_SIZE, hkv, d)
        vp = np.concatenate([ar_v, np.zeros((pad, hkv, d), np.float32)]).reshape(n_ar_pages, PAGE_SIZE, hkv, d)
        # the last path node as a one-row AR segment over seq_len keys
        o_ar = paged_attention(q[path[-1]:path[-1] + 1], kp, vp, np.array([0, 1]), np.array([0, n_ar_pages]),
                               np.arange(n_ar_pages), np.array([seq_len - (n_ar_pages - 1) * PAGE_SIZE]),
                               np.array([0]), 0.3)
        assert np.array_equal(o[path[-1]], o_ar[0])


def test_batch_attention_with_trees_equals_its_parts():
    """An ordinary segment, padding and a tree segment in one call: each equals its own."""
    from luce.ref.tree_attention import paged_attention_with_trees

    rng = np.random.default_rng(11)
    hq, hkv, d, n_pages = 4, 2, 8, 8
    k_pages = rng.standard_normal((n_pages, PAGE_SIZE, hkv, d)).astype(np.float32)
    v_pages = rng.standard_normal((n_pages, PAGE_SIZE, hkv, d)).astype(np.float32)
    parents = random_parents(7, 4, rng)
    # segment 0: 5 ordinary rows over 20 KV rows (pages 0, 1); 1: padding; 2: tree of 7 over 18 + 7 rows
    qo = np.array([0, 5, 8, 15])
    kv_indptr = np.array([0, 2, 2, 4])
    kv_indices = np.array([0, 1, 5, 3])
    last = np.array([4, 0, 25 - 16])
    slots = np.array([0, -1, 1])
    tp = np.full(15, -1)
    tp[9:] = parents[1:] + 8
    q = rng.standard_normal((15, hq, d)).astype(np.float32)
    out = paged_attention_with_trees(q, k_pages, v_pages, qo, kv_indptr, kv_indices, last, slots, tp, 0.5)
    plain = paged_attention(q[:5], k_pages, v_pages, np.array([0, 5]), np.array([0, 2]), np.array([0, 1]),
                            np.array([4]), np.array([0]), 0.5)
    assert np.array_equal(out[:5], plain)
    assert not out[5:8].any()
    assert np.array_equal(out[8:], paged_tree_attention(q[8:], k_pages, v_pages, np.array([5, 3]), 18, parents, 0.5))
