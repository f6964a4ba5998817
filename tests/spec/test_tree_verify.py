"""Tree rows through the models: every node's logits, the committed KV and recurrent state
are bitwise what AR decoding of its path gives (luce.models.commit promotes the path; the
verify leaves every slot's state alone); tree rows are batch invariant."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from luce.models import SegmentSpec, build_batch, validate_batch
from luce.models.commit import commit_trees, plan_tree_commit
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


def tree_segment(slot, tree, start):
    return SegmentSpec(slot, tree.tokens.tolist(), start, slot_pages(slot), parents=tree.parents.tolist())


def commit(state, batch, out, paths):
    """The accepted paths {slot: path} of `batch`'s trees into `state` (what txn.commit runs)."""
    commit_trees(state, out.staged, plan_tree_commit(batch, paths))


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
    batch = build_batch([tree_segment(0, tree, P)])
    before = recurrent_arrays(state, 0) if state.recurrent is not None else {}
    out = model.forward(batch, state)
    logits = np.array(out.logits)
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
    commit(state, batch, out, {0: path})
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


def test_a_chain_path_of_an_attention_only_model_commits_without_a_move(tiny_models, monkeypatch):
    """Every node of a chain's path is where the verify wrote its KV row: an attention-only
    model's commit moves nothing (no launch), and its KV equals AR decoding; a sibling's path
    moves rows in every layer."""
    from luce.models.commit import GraphedCommit

    model = tiny_models["qwen3"]
    state = model.new_state(max_pages=2 * PAGES, max_slots=2)
    root = prefill(model, state, 0, PROMPT)
    prefill(model, state, 1, PROMPT)
    P = len(PROMPT)
    tree = DraftTree(np.array([root, 11, 12, 13, 14]), np.array([-1, 0, 1, 2, 0]), np.array([0, 1, 2, 3, 1]),
                     np.zeros(5))
    batch = build_batch([tree_segment(0, tree, P)])
    out = model.forward(batch, state)
    moves = []
    monkeypatch.setattr(model.backend, "kv_move_rows", lambda kv, src, dst: moves.append(src))
    chain, sibling = plan_tree_commit(batch, {0: [0, 1, 2, 3]}), plan_tree_commit(batch, {0: [0, 4]})
    assert not chain.moves_kv and sibling.moves_kv
    GraphedCommit(model.backend)(state, out.staged, chain)
    assert moves == []
    ar_path(model, state, 1, P, [int(t) for t in tree.tokens[:4]])
    for il, (k, v) in kv_rows(state, 1, P + 4).items():
        k0, v0 = kv_rows(state, 0, P + 4)[il]
        assert np.array_equal(k0, k) and np.array_equal(v0, v)
    GraphedCommit(model.backend)(state, out.staged, sibling)
    assert len(moves) == len(state.kv)


def test_tree_rows_are_batch_invariant(tiny_models):
    model = tiny_models["qwen35"]
    model.gdn_tree_mode = "factor"
    tree = random_tree(7, 9, 4, seed=2)
    P = len(PROMPT)

    def run(items):
        state = model.new_state(max_pages=3 * PAGES, max_slots=3)
        prefill(model, state, 0, PROMPT)
        prefill(model, state, 2, PROMPT[:5])
        batch = build_batch(items)
        out = model.forward(batch, state)
        commit(state, batch, out, {0: path_to(tree, tree.n_nodes - 1)})
        return np.array(out.logits), recurrent_arrays(state, 0)

    alone, alone_state = run([tree_segment(0, tree, P)])
    # the tree beside a prompt chunk and an AR row: one step of every kind (its logits rows come last)
    mixed, mixed_state = run([SegmentSpec(1, PROMPT[:9], 0, slot_pages(1)), SegmentSpec(2, [3], 5, slot_pages(2)),
                              tree_segment(0, tree, P)])
    assert np.array_equal(mixed[2:], alone)
    for il in alone_state:
        assert all(np.array_equal(a, b) for a, b in zip(alone_state[il], mixed_state[il]))


def test_validate_rejects_malformed_tree_rows(tiny_models):
    tree = random_tree(1, 5, 3, seed=4)
    batch = build_batch([tree_segment(0, tree, 10)])
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
    with pytest.raises(ValueError, match="tree segments come last"):
        build_batch([tree_segment(0, tree, 10), SegmentSpec(1, [3], 5, slot_pages(1))]).validate()
    with pytest.raises(ValueError, match="parent links"):
        plan_tree_commit(batch, {0: [0, 2] if tree.parents[2] != 0 else [0, 3, 1]})
    with pytest.raises(ValueError, match="verifies trees of slots"):
        plan_tree_commit(batch, {})
    state = tiny_models["qwen35"].new_state(max_pages=PAGES, max_slots=1)
    with pytest.raises(ValueError, match="staged nothing"):   # a commit without its verify's data
        commit_trees(state, {}, plan_tree_commit(batch, {0: [0]}))
