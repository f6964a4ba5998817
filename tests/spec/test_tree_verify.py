"""Tree rows through the models: every node's logits, the committed KV and recurrent state
are bitwise what AR decoding of its path gives; tree rows are batch invariant."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from luce.models import SegmentSpec, build_batch
from luce.models.tree_rows import commit_tree_rows, validate_batch
from luce.spec.batching import TreeSegment, build_spec_batch
from luce.spec.tree import DraftTree

PROMPT = [5, 17, 3, 99, 42, 8, 8, 1, 250, 7, 64, 2, 19]
PAGES = 4  # per slot


def slot_pages(slot):
    return list(range(slot * PAGES, (slot + 1) * PAGES))


def random_tree(root, n, max_depth, seed, vocab=420) -> DraftTree:
    rng = np.random.default_rng(seed)
    parents, depths, tokens = [-1], [0], [root]
    for i in range(1, n):
        p = int(rng.choice([j for j in range(i) if depths[j] < max_depth]))
        used = {tokens[c] for c in range(i) if parents[c] == p}
        t = int(rng.choice([x for x in range(vocab) if x not in used][:50]))
        parents.append(p)
        depths.append(depths[p] + 1)
        tokens.append(t)
    return DraftTree(np.array(tokens), np.array(parents), np.array(depths), np.zeros(n))


def prefill(model, state, slot, tokens):
    out = model.forward(build_batch([SegmentSpec(slot, tokens, 0, slot_pages(slot))]), state)
    return int(np.argmax(out.logits[0]))


def ar_path(model, state, slot, start, tokens):
    """Feed tokens one AR row at a time from `start`; -> logits [len, V]."""
    rows = []
    for i, t in enumerate(tokens):
        out = model.forward(build_batch([SegmentSpec(slot, [t], start + i, slot_pages(slot))]), state)
        rows.append(np.array(out.logits[0]))
    return np.stack(rows)


def recurrent_arrays(state, slot):
    rec = state.recurrent
    return {il: (np.array(rec.conv(il, slot)), np.array(rec.gdn(il, slot))) for il in rec.gdn_layers}


def kv_rows(state, slot, n):
    return {il: kv.gather_sequence(np.array(slot_pages(slot)), n) for il, kv in state.kv.items()}


def path_to(tree, node):
    return tree.path(node)


# GDN verify modes apply to the hybrid target only; the dense target has no GDN layers.
@pytest.mark.parametrize("arch,mode", [("qwen35", "factor"), ("qwen35", "baseline"), ("qwen3", None)])
def test_tree_nodes_and_commit_equal_ar_decoding(tiny_models, mode, arch):
    model = tiny_models[arch]
    if mode is not None:
        model.gdn_tree_mode = mode
    state = model.new_state(max_pages=2 * PAGES, max_slots=2)
    root = prefill(model, state, 0, PROMPT)
    assert prefill(model, state, 1, PROMPT) == root
    P = len(PROMPT)
    tree = random_tree(root, 14, 5, seed=1)
    batch, _ = build_spec_batch([TreeSegment(0, tree, P, slot_pages(0))])
    before = recurrent_arrays(state, 0) if state.recurrent is not None else {}
    logits = np.array(model.forward(batch, state).logits)
    after = recurrent_arrays(state, 0) if state.recurrent is not None else {}
    for il in before:  # verify leaves the slot's state alone
        assert all(np.array_equal(a, b) for a, b in zip(before[il], after[il]))
    snap = state.recurrent.snapshot(1) if state.recurrent is not None else None
    leaves = [i for i in range(tree.n_nodes) if not tree.children(i)]
    for leaf in leaves:
        path = path_to(tree, leaf)
        if snap is not None:
            state.recurrent.restore(1, snap)
        ar = ar_path(model, state, 1, P, [int(tree.tokens[i]) for i in path])
        assert np.array_equal(logits[path], ar), f"{mode}: path to {leaf}"
    # commit the path to the last leaf in slot 0; slot 1 has just AR-decoded it
    path = path_to(tree, leaves[-1])
    commit_tree_rows(state, 0, slot_pages(0), P, path)
    assert state.recurrent is None or not state.recurrent.has_tree(0)
    got, want = (recurrent_arrays(state, 0), recurrent_arrays(state, 1)) if snap is not None else ({}, {})
    for il in want:
        assert np.array_equal(got[il][0], want[il][0]) and np.array_equal(got[il][1], want[il][1]), il
    n = P + len(path)
    for il, (k, v) in kv_rows(state, 1, n).items():
        k0, v0 = kv_rows(state, 0, n)[il]
        assert np.array_equal(k0, k) and np.array_equal(v0, v)
    # and decoding goes on identically
    nxt = int(tree.tokens[leaves[0]])
    a = ar_path(model, state, 0, n, [nxt])
    b = ar_path(model, state, 1, n, [nxt])
    assert np.array_equal(a, b)


def test_tree_rows_are_batch_invariant(tiny_models):
    model = tiny_models["qwen35"]
    model.gdn_tree_mode = "factor"
    tree = random_tree(7, 9, 4, seed=2)
    P = len(PROMPT)

    def run(items_fn):
        state = model.new_state(max_pages=3 * PAGES, max_slots=3)
        prefill(model, state, 0, PROMPT)
        prefill(model, state, 2, PROMPT[:5])
        batch, first = build_spec_batch(items_fn())
        return np.array(model.forward(batch, state).logits), first

    tree_item = TreeSegment(0, tree, P, slot_pages(0))
    alone, _ = run(lambda: [tree_item])
    mixed, first = run(lambda: [SegmentSpec(1, PROMPT[:9], 0, slot_pages(1)), SegmentSpec(2, [3], 5, slot_pages(2)),
                                tree_item])
    assert np.array_equal(mixed[first[2]:first[2] + tree.n_nodes], alone)


def test_closed_form_mode_is_close_to_exact(tiny_models):
    model = tiny_models["qwen35"]
    tree = random_tree(9, 12, 5, seed=3)
    P = len(PROMPT)
    results = {}
    for mode in ("factor", "closed"):
        model.gdn_tree_mode = mode
        state = model.new_state(max_pages=PAGES, max_slots=1)
        prefill(model, state, 0, PROMPT)
        batch, _ = build_spec_batch([TreeSegment(0, tree, P, slot_pages(0))])
        logits = np.array(model.forward(batch, state).logits)
        commit_tree_rows(state, 0, slot_pages(0), P, path_to(tree, tree.n_nodes - 1))
        results[mode] = (logits, recurrent_arrays(state, 0))
    model.gdn_tree_mode = "factor"
    scale = np.abs(results["factor"][0]).max()
    assert np.abs(results["closed"][0] - results["factor"][0]).max() <= 1e-5 * scale
    for il, (conv, gdn) in results["factor"][1].items():  # later layers see slightly other inputs
        np.testing.assert_allclose(results["closed"][1][il][0], conv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(results["closed"][1][il][1], gdn, rtol=1e-5, atol=1e-5)


def test_dense_chain_as_causal_segment_equals_ar(tiny_models):
    model = tiny_models["qwen3"]
    state = model.new_state(max_pages=2 * PAGES, max_slots=2)
    root = prefill(model, state, 0, PROMPT)
    prefill(model, state, 1, PROMPT)
    chain = DraftTree(np.array([root, 4, 9, 16]), np.arange(-1, 3), np.arange(4), np.zeros(4))
    batch, _ = build_spec_batch([TreeSegment(0, chain, len(PROMPT), slot_pages(0))], chains_as_segments=True)
    assert batch.tree_parents is None
    logits = np.array(model.forward(batch, state).logits)
    assert np.array_equal(logits, ar_path(model, state, 1, len(PROMPT), chain.tokens.tolist()))
    commit_tree_rows(state, 0, slot_pages(0), len(PROMPT), [0, 1])


def test_validate_rejects_malformed_tree_rows(tiny_models):
    tree = random_tree(1, 5, 3, seed=4)
    batch, _ = build_spec_batch([TreeSegment(0, tree, 10, slot_pages(0))])
    validate_batch(batch)
    bad_pos = dataclasses.replace(batch, positions=batch.positions + 1)
    with pytest.raises(ValueError, match="depth"):
        validate_batch(bad_pos)
    tp = batch.tree_parents.copy()
    tp[0] = 0
    with pytest.raises(ValueError, match="root"):
        validate_batch(dataclasses.replace(batch, tree_parents=tp))
    with pytest.raises(ValueError, match="tree_parents"):
        validate_batch(dataclasses.replace(batch, tree_parents=tp[:2]))
    with pytest.raises(ValueError, match="no verified tree"):
        state = tiny_models["qwen35"].new_state(max_pages=PAGES, max_slots=1)
        commit_tree_rows(state, 0, slot_pages(0), 10, [0, 1])
