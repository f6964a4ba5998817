"""Draft trees: chain and DDTree construction, ancestor masks, positions, validation."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from luce.spec.proposal import DraftProposal
from luce.spec.tree import DraftTree, chain_tree, ddtree, root_only


def random_proposal(depth: int, k: int, seed: int, vocab: int = 50) -> DraftProposal:
    """Per-depth top-k of random softmax rows (distinct tokens, sorted best first)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((depth, vocab)) * 2.0
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return DraftProposal.from_logprobs(lp, k)


def brute_force_ddtree(proposal: DraftProposal, budget: int, k: int, tau):
    """The rank-sequences DDTree must pick: the whole top-1 chain (up to budget), then the
    best remaining prefixes by score, excluding those more than tau below the chain."""
    D = proposal.depth
    lp = proposal.logprobs.astype(np.float64)
    chain_score = np.concatenate([[0.0], np.cumsum(lp[:D, 0])])
    chain = [tuple([0] * d) for d in range(1, min(D, budget) + 1)]
    others = []
    for d in range(1, D + 1):
        for ranks in itertools.product(range(k), repeat=d):
            if all(r == 0 for r in ranks):
                continue
            score = sum(lp[i, r] for i, r in enumerate(ranks))
            if tau is not None and score < chain_score[d] - tau:
                continue
            others.append((score, ranks))
    others.sort(key=lambda x: -x[0])
    return set(chain) | {r for _, r in others[:budget - len(chain)]}


def tree_rank_paths(tree: DraftTree, proposal: DraftProposal) -> set:
    """Every drafted node as the tuple of per-depth candidate ranks of its path."""
    out = set()
    for node in range(1, tree.n_nodes):
        path = tree.path(node)[1:]
        ranks = tuple(int(np.nonzero(proposal.ids[tree.depths[n] - 1] == tree.tokens[n])[0][0]) for n in path)
        out.add(ranks)
    return out


def test_chain_tree_tokens_parents_depths_positions():
    prop = DraftProposal.from_chain([7, 8, 9, 10])
    tree = chain_tree(5, prop, max_depth=3)
    assert tree.tokens.tolist() == [5, 7, 8, 9]
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.depths.tolist() == [0, 1, 2, 3]
    assert tree.positions(100).tolist() == [100, 101, 102, 103]
    assert chain_tree(5, prop).n_drafted == 4
    assert chain_tree(5, prop, max_depth=0).n_nodes == 1


def test_chain_stops_at_first_empty_depth():
    ids = np.array([[3, 4], [-1, -1], [6, -1]])
    lps = np.array([[-0.1, -2.0], [-np.inf, -np.inf], [-0.5, -np.inf]], dtype=np.float32)
    prop = DraftProposal(ids, lps)
    assert prop.depth == 1
    assert chain_tree(1, prop).tokens.tolist() == [1, 3]
    assert ddtree(1, prop, budget=8, top_k=2).tokens.tolist() == [1, 3, 4]


@pytest.mark.parametrize("seed", range(12))
def test_ddtree_is_best_first_with_seeded_chain(seed):
    rng = np.random.default_rng(seed)
    depth, k = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    budget = int(rng.integers(0, 20))
    tau = [None, 1.0, 3.0][seed % 3]
    prop = random_proposal(depth, k, seed)
    tree = ddtree(99, prop, budget=budget, top_k=k, tau=tau)
    want = brute_force_ddtree(prop, budget, k, tau)
    assert tree_rank_paths(tree, prop) == want
    assert tree.n_drafted == len(want) <= budget
    # the seeded top-1 chain occupies nodes 1..
    n_chain = min(depth, budget)
    assert tree.tokens[1:n_chain + 1].tolist() == prop.ids[:n_chain, 0].tolist()
    assert tree.depths[1:n_chain + 1].tolist() == list(range(1, n_chain + 1))


def test_ddtree_scores_and_sibling_cap():
    prop = random_proposal(6, 8, seed=3)
    tree = ddtree(0, prop, budget=40, top_k=3, tau=None)
    lp = prop.logprobs.astype(np.float64)
    for node in range(1, tree.n_nodes):
        p, d = tree.parents[node], tree.depths[node]
        rank = int(np.nonzero(prop.ids[d - 1] == tree.tokens[node])[0][0])
        assert rank < 3
        assert tree.scores[node] == pytest.approx(tree.scores[p] + lp[d - 1, rank])
    assert max(len(tree.children(n)) for n in range(tree.n_nodes)) <= 3


def test_tau_zero_keeps_only_the_chain_and_budget_zero_only_the_root():
    prop = random_proposal(5, 4, seed=1)
    assert ddtree(3, prop, budget=30, top_k=4, tau=0.0).tokens.tolist() == [3] + prop.ids[:, 0].tolist()
    assert ddtree(3, prop, budget=0).n_nodes == 1
    assert root_only(3).n_drafted == 0


def test_tau_prunes_against_the_best_path_at_the_same_depth():
    ids = np.array([[1, 2], [3, 4]])
    lps = np.log(np.array([[0.9, 0.1], [0.6, 0.4]], dtype=np.float64)).astype(np.float32)
    prop = DraftProposal(ids, lps)
    # depth-1 sibling 2 is ln(0.9/0.1) = 2.2 below the chain; 4 under chain node 1 is 0.41 below
    loose = ddtree(0, prop, budget=10, top_k=2, tau=3.0)
    tight = ddtree(0, prop, budget=10, top_k=2, tau=1.0)
    assert loose.n_drafted == 6
    assert sorted(tight.tokens[1:].tolist()) == [1, 3, 4]


def test_ancestor_mask_matches_paths_and_dfs_visits_parents_first():
    prop = random_proposal(7, 3, seed=5)
    tree = ddtree(0, prop, budget=25, top_k=3, tau=None)
    mask = tree.ancestor_mask()
    for i in range(tree.n_nodes):
        assert set(np.nonzero(mask[i])[0].tolist()) == set(tree.path(i))
    order = tree.depth_first_order()
    assert sorted(order) == list(range(tree.n_nodes))
    seen = set()
    for node in order:
        assert node == 0 or tree.parents[node] in seen
        seen.add(node)
    # pre-order: every subtree is contiguous in the order
    for node in range(tree.n_nodes):
        subtree = [i for i in range(tree.n_nodes) if node in tree.path(i)]
        idx = sorted(order.index(i) for i in subtree)
        assert idx == list(range(idx[0], idx[0] + len(idx)))


def test_child_lookup():
    tree = DraftTree(np.array([0, 5, 6, 7]), np.array([-1, 0, 0, 1]), np.array([0, 1, 1, 2]), np.zeros(4))
    assert tree.child_with_token(0, 6) == 2
    assert tree.child_with_token(0, 7) == -1
    assert tree.child_with_token(1, 7) == 3
    assert tree.children(0) == [1, 2]


@pytest.mark.parametrize("tokens,parents,depths,match", [
    ([0, 1], [0, 0], [0, 1], "root"),
    ([0, 1, 2], [-1, 2, 0], [0, 2, 1], "earlier node"),
    ([0, 1], [-1, 0], [0, 2], "depth"),
    ([0, 1, 1], [-1, 0, 0], [0, 1, 1], "two children"),
])
def test_invalid_trees_are_rejected(tokens, parents, depths, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(np.array(tokens), np.array(parents), np.array(depths), np.zeros(len(tokens)))


def test_invalid_proposals_are_rejected():
    with pytest.raises(ValueError, match="twice"):
        DraftProposal(np.array([[1, 1]]), np.array([[-0.1, -0.2]], np.float32))
    pad = np.array([[4, -1, -1], [7, 5, 7]])   # two padding entries are not a repeat; depth 1 repeats 7
    with pytest.raises(ValueError, match="depth 1 lists a token twice"):
        DraftProposal(pad, np.array([[-0.1, -np.inf, -np.inf], [-0.1, -0.2, -0.3]], np.float32))
    assert DraftProposal(pad[:1], np.array([[-0.1, -np.inf, -np.inf]], np.float32)).depth == 1
    with pytest.raises(ValueError, match="sorted"):
        DraftProposal(np.array([[1, 2]]), np.array([[-0.3, -0.2]], np.float32))
    with pytest.raises(ValueError, match="padding"):
        DraftProposal(np.array([[1, 2]]), np.array([[-0.3, -np.inf]], np.float32))
    with pytest.raises(ValueError, match="<= 0"):
        DraftProposal(np.array([[1]]), np.array([[0.5]], np.float32))
    assert DraftProposal.empty().depth == 0
