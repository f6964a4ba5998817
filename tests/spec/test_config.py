"""SpecConfig: option names and defaults, impossible combinations, drafter factory."""
from __future__ import annotations

import numpy as np
import pytest

from luce.engine.sampler import SamplingParams
from luce.engine.speculation import accept_sampled
from luce.spec.config import SpecConfig, SpecConfigError, make_drafter
from luce.spec.drafters import DFlashDrafter, DraftModelDrafter, NgramDrafter
from luce.spec.proposal import DraftProposal
from luce.spec.speculator import Speculator
from luce.spec.tree import chain_tree


def test_defaults_follow_luce_dflash_names():
    c = SpecConfig()
    assert (c.spec, c.ddtree_budget, c.ddtree_tau, c.spec_top_k) == ("off", 22, 6.0, 4)
    assert not c.enabled
    assert SpecConfig(spec="specla", draft_kind="ngram").gdn_tree_mode == "factor"
    assert SpecConfig(spec="ddtree", draft_kind="ngram").gdn_tree_mode == "baseline"


@pytest.mark.parametrize("kwargs,match", [
    (dict(spec="tree"), "--spec"),
    (dict(spec="chain", draft_kind="eagle"), "--draft-kind"),
    (dict(spec="chain", draft_kind="dflash"), "--draft PATH"),
    (dict(spec="ddtree", draft_kind="model"), "--draft PATH"),
    (dict(ddtree_budget=0), "--ddtree-budget"),
    (dict(ddtree_tau=-1), "--ddtree-tau"),
    (dict(spec_top_k=0), "--spec-top-k"),
])
def test_impossible_combinations_are_rejected(kwargs, match):
    with pytest.raises(SpecConfigError, match=match):
        SpecConfig(**kwargs)


def test_specla_on_a_dense_model_says_it_only_affects_attention(tiny_models):
    notes = SpecConfig(spec="specla", draft_kind="ngram").notes_for(tiny_models["qwen3"].config)
    assert notes and "attention" in notes[0]
    assert SpecConfig(spec="specla", draft_kind="ngram").notes_for(tiny_models["qwen35"].config) == []


def test_make_drafter_picks_and_checks_the_kind(tiny_models, tiny_paths):
    target = tiny_models["qwen35"]
    assert make_drafter(SpecConfig(), target, 2, 64) is None
    assert isinstance(make_drafter(SpecConfig(spec="chain", draft_kind="ngram"), target, 2, 64), NgramDrafter)
    d = make_drafter(SpecConfig(spec="chain", draft_kind="dflash", draft=str(tiny_paths["dflash"])), target, 2, 64)
    assert isinstance(d, DFlashDrafter) and d.max_depth == 3
    m = make_drafter(SpecConfig(spec="chain", draft_kind="model", draft=str(tiny_paths["qwen3_draft"])), target, 2, 64)
    assert isinstance(m, DraftModelDrafter)
    with pytest.raises(SpecConfigError, match="DFlash draft"):
        make_drafter(SpecConfig(spec="chain", draft_kind="dflash", draft=str(tiny_paths["qwen3"])), target, 2, 64)
    with pytest.raises(SpecConfigError, match="dflash"):
        make_drafter(SpecConfig(spec="chain", draft_kind="model", draft="x"), target, 2, 64,
                     draft_model=tiny_models["dflash"])


def test_acceptance_stops_at_max_tokens_and_the_speculator_counts(tiny_models):
    spec = Speculator(SpecConfig(spec="chain", draft_kind="ngram"), tiny_models["qwen3"], NgramDrafter())
    tree = chain_tree(1, DraftProposal.from_chain([2, 3, 4]))
    logits = np.full((4, 420), -1.0, np.float32)
    for node, tok in enumerate([2, 3, 4, 5]):
        logits[node, tok] = 1.0
    acc = accept_sampled(tree, logits, SamplingParams(), 0, 10, [1], [1], max_tokens=10)
    assert acc.tokens == (2, 3, 4, 5)
    acc = accept_sampled(tree, logits, SamplingParams(), 0, 10, [1], [1], max_tokens=2)
    assert acc.tokens == (2, 3) and acc.path == (0, 1)
    spec.record(tree, acc.n_accepted, len(acc.tokens))
    assert spec.stats.verifies == 1 and spec.stats.accepted == 1 and spec.stats.drafted == 3
    assert spec.max_nodes() == 1 + 8
