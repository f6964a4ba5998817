"""Exactness matrix, grammar-constrained rows: luce.engine.Engine with a JSON-schema grammar
(luce.engine.constraint) beside unconstrained requests, speculation off and on (chain and
ddtree, a perfect self-draft that drafts unconstrained tokens and an n-gram drafter): greedy
and seeded sampled outputs are equal token for token, every constrained output parses and
matches its schema, and drafted tokens the grammar forbids were rejected."""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from luce.engine import Engine, EngineConfig, SamplingParams
from luce.engine.constraint import Grammar
from luce.spec.config import SpecConfig
from luce.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "ok": {"type": "boolean"}},
    "required": ["name", "n", "ok"], "additionalProperties": False}
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8], [9, 10, 11, 12, 13], [21, 22, 23, 21, 22, 40, 41]]
CONSTRAINED = (0, 2)       # request 1 runs unconstrained in the same steps
SAMPLED = dict(temperature=0.9, top_k=40, top_p=0.95)


def params(i, sampled):
    grammar = Grammar.json_schema(SCHEMA) if i in CONSTRAINED else None
    return SamplingParams(max_tokens=40, seed=500 + i, grammar=grammar, **(SAMPLED if sampled else {}))


def run(model, tokenizer, sampled, spec=None, draft_model=None):
    engine = Engine(model, tokenizer, EngineConfig(max_slots=3, ctx=160, token_budget=69, spec=spec),
                    draft_model=draft_model)
    ids = [engine.add_request(p, params(i, sampled)) for i, p in enumerate(PROMPTS)]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        engine.check()
        steps += 1
        assert steps < 400
    outs = [engine.take_output(rid) for rid in ids]
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return tuple(tuple(o.token_ids) for o in outs), outs, engine


@pytest.fixture(scope="module")
def tokenizer(tiny_paths):
    return Tokenizer.from_gguf(tiny_paths["qwen3"])


@functools.lru_cache(maxsize=None)
def _plain(key, sampled):
    model, tokenizer = _CACHE[key]
    return run(model, tokenizer, sampled)


_CACHE = {}


def plain(model, tokenizer, sampled):
    _CACHE[id(model)] = (model, tokenizer)
    return _plain(id(model), sampled)


def check_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "n", "ok"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 6
    assert isinstance(value["n"], int) and 0 <= value["n"] <= 99 and isinstance(value["ok"], bool)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_constrained_output_is_valid_and_unconstrained_rows_are_unchanged(tiny_models, tokenizer, sampled):
    _, outs, _ = plain(tiny_models["qwen3"], tokenizer, sampled)
    for i in CONSTRAINED:
        assert outs[i].finish_reason == "stop", outs[i].text
        check_schema(outs[i].text)
    alone = Engine(tiny_models["qwen3"], tokenizer, EngineConfig(max_slots=1, ctx=160))
    rid = alone.add_request(PROMPTS[1], params(1, sampled))
    alone.run()
    assert alone.take_output(rid).token_ids == list(outs[1].token_ids)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode,kind", [("chain", "model"), ("ddtree", "model"), ("ddtree", "ngram")])
def test_constrained_output_equals_with_speculation_on_and_off(tiny_models, tokenizer, sampled, mode, kind):
    model = tiny_models["qwen3"]
    want, _, _ = plain(model, tokenizer, sampled)
    spec = SpecConfig(spec=mode, draft_kind=kind, draft="self" if kind == "model" else None,
                      ddtree_budget=10, spec_top_k=3, chain_depth=4)
    got, outs, engine = run(model, tokenizer, sampled, spec, draft_model=model if kind == "model" else None)
    assert got == want
    for i in CONSTRAINED:
        check_schema(outs[i].text)
    stats = engine.spec.stats
    assert stats.verifies > 0
    if kind == "model" and not sampled:
        # the self-draft drafts the unmasked argmax: where the grammar forbids it, it was rejected
        assert stats.accepted < stats.drafted


def test_a_drafted_token_the_grammar_forbids_is_never_accepted(tiny_models, tokenizer):
    """Acceptance over a tree whose every drafted token is one the grammar forbids at its
    node: the walk accepts none of them, and the constraint's state is unchanged after."""
    from luce.engine.constraint import TokenConstraint
    from luce.engine.speculation import accept_sampled
    from luce.spec.tree import DraftTree

    c = TokenConstraint(Grammar.json_schema(SCHEMA), tokenizer, tokenizer.vocab_size)
    before = c.mask().copy()
    forbidden = [int(t) for t in np.flatnonzero(~before)[:3]]
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((4, tokenizer.vocab_size)).astype(np.float32)
    for t in forbidden:
        logits[0, t] = 50.0                     # the unmasked argmax is a forbidden token
    tree = DraftTree([7] + forbidden, [-1, 0, 0, 0], [0, 1, 1, 1], [0.0, -1.0, -1.0, -1.0])
    acc = accept_sampled(tree, logits, SamplingParams(), 0, 10, constraint=c)
    assert acc.path == (0,) and len(acc.tokens) == 1 and before[acc.tokens[0]]
    assert np.array_equal(c.mask(), before)
