"""Acceptance: greedy and sampled walks emit exactly what plain decoding emits."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from luce.engine.sampler import SamplingParams, sample_token
from luce.engine.speculation import accept_sampled
from luce.spec.acceptance import Acceptance, accept_greedy
from luce.spec.proposal import DraftProposal
from luce.spec.tree import DraftTree, chain_tree, ddtree

VOCAB = 9


def toy_logits(context) -> np.ndarray:
    """A deterministic 'target': logits [VOCAB] f32 as a function of the whole context."""
    key = zlib.crc32(np.asarray(context, dtype=np.int64).tobytes())
    return (np.random.default_rng(key).standard_normal(VOCAB) * 2.0).astype(np.float32)


def plain_decode(prompt, n, params, seed):
    out = []
    for _ in range(n):
        ctx = list(prompt) + out
        out.append(sample_token(toy_logits(ctx), params, seed, len(ctx), prompt, out))
    return out


def random_tree(root, truth, rng) -> DraftTree:
    """A DDTree over a proposal that sometimes ranks the true continuation first."""
    depth = int(rng.integers(0, 6))
    ids = np.zeros((depth, 3), np.int64)
    for d in range(depth):
        cand = list(rng.permutation(VOCAB)[:3])
        if d < len(truth) and rng.random() < 0.6 and truth[d] not in cand:
            cand[int(rng.integers(0, 3))] = truth[d]
        if d < len(truth) and truth[d] in cand and rng.random() < 0.7:
            cand.remove(truth[d])
            cand.insert(0, truth[d])
        ids[d] = cand
    lps = np.sort(-rng.uniform(0.0, 3.0, (depth, 3)), axis=1)[:, ::-1].astype(np.float32)
    return ddtree(root, DraftProposal(ids, lps), budget=int(rng.integers(0, 12)), top_k=3, tau=None)


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4),
    SamplingParams(temperature=0.9),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.9, presence_penalty=0.5),
]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "greedy_pen", "t0.9", "filtered_pen"])
@pytest.mark.parametrize("seed", [1, 2])
def test_speculative_walk_equals_plain_decoding(params, seed):
    prompt, n = [1, 4, 2], 40
    want = plain_decode(prompt, n, params, seed)
    rng = np.random.default_rng(seed)
    out = [want[0]]  # the first token comes from the prefill step
    accepted_total = 0
    while len(out) < n:
        root_pos = len(prompt) + len(out) - 1
        tree = random_tree(out[-1], want[len(out):], rng)
        # the target's logits at every node: the context is the committed text plus the path
        logits = np.stack([toy_logits(prompt + out + [int(tree.tokens[p]) for p in tree.path(i)[1:]])
                           for i in range(tree.n_nodes)])
        if params.greedy and not params.has_penalties:
            acc = accept_greedy(tree, np.argmax(logits, axis=1), max_tokens=n - len(out))
        else:
            acc = accept_sampled(tree, logits, params, seed, root_pos, prompt, out, max_tokens=n - len(out))
        assert len(acc.path) == len(acc.tokens) >= 1
        assert [int(tree.tokens[p]) for p in acc.path[1:]] == list(acc.tokens[:-1])
        accepted_total += acc.n_accepted
        out.extend(acc.tokens)
    assert out == want
    assert accepted_total > 0  # the trees did carry correct drafts sometimes


def test_every_draft_wrong_still_commits_exactly_one_correct_token():
    context = [3, 1]
    target = int(np.argmax(toy_logits(context)))
    wrong = [t for t in range(VOCAB) if t != target]
    ids = np.array([wrong[:4], wrong[4:8]])
    tree = ddtree(1, DraftProposal(ids, np.full((2, 4), -1.0, np.float32) - np.arange(4, dtype=np.float32)),
                  budget=20, top_k=4, tau=None)
    assert tree.n_drafted == 20
    logits = np.stack([toy_logits(context + [int(tree.tokens[p]) for p in tree.path(i)[1:]])
                       for i in range(tree.n_nodes)])
    acc = accept_greedy(tree, np.argmax(logits, axis=1))
    assert acc == Acceptance(path=(0,), tokens=(target,))
    sampled = accept_sampled(tree, logits, SamplingParams(temperature=0.0), 0, 1, [3], [1])
    assert sampled == acc


def test_full_chain_accepted_emits_depth_plus_one():
    tree = chain_tree(0, DraftProposal.from_chain([5, 6, 7]))
    acc = accept_greedy(tree, np.array([5, 6, 7, 2]))
    assert acc.path == (0, 1, 2, 3) and acc.tokens == (5, 6, 7, 2)
    assert acc.n_accepted == 3 and acc.bonus == 2


def test_branch_taken_by_target_and_truncation():
    tree = DraftTree(np.array([0, 5, 6, 7, 8]), np.array([-1, 0, 0, 2, 2]), np.array([0, 1, 1, 2, 2]), np.zeros(5))
    acc = accept_greedy(tree, np.array([6, 1, 8, 1, 3]))
    assert acc.path == (0, 2, 4) and acc.tokens == (6, 8, 3)
    assert accept_greedy(tree, np.array([6, 1, 8, 1, 3]), max_tokens=2) == Acceptance((0, 2), (6, 8))
    assert acc.truncated(1) == Acceptance((0,), (6,))
    with pytest.raises(ValueError):
        acc.truncated(0)
    with pytest.raises(ValueError, match="one argmax per tree node"):
        accept_greedy(tree, np.array([6, 1]))


def test_sampled_walk_reads_only_visited_rows():
    tree = chain_tree(0, DraftProposal.from_chain([1, 2, 3]))
    read = []

    class Rows:
        def __getitem__(self, i):
            read.append(i)
            row = np.full(VOCAB, -5.0, np.float32)
            row[[1, 7, 3, 4][i]] = 5.0
            return row

    acc = accept_sampled(tree, Rows(), SamplingParams(temperature=0.0), 0, 10)
    assert acc.tokens == (1, 7) and read == [0, 1]
