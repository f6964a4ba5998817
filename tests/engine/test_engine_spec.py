"""Speculation inside luce.engine.Engine: a draft that is always wrong still commits exactly
one correct token per verify; per-request statistics add up to the engine's; a fault before
the commit of a tree step changes nothing (digests) and retires no one (mixed steps:
tests/engine/test_step_rollback.py); lanes that do not fit the token budget decode as AR rows beside the prefill."""
from __future__ import annotations

import itertools

import pytest

from luce.engine import Engine, EngineConfig, SamplingParams
from luce.spec.config import SpecConfig
from luce.spec.drafters.bench_drafters import AlwaysWrongDrafter
from luce.testing.tiny_models import make_dense, make_qwen35
from tests.engine.faults import POINTS, domain_digests
from tests.engine.test_engine_ahead import count_fed

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 12, 13], [21, 22, 23, 21, 22], list(range(30, 100))]
MAX_TOKENS = 9


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from luce.models import load_model

    root = tmp_path_factory.mktemp("engine_spec")
    make_qwen35(root / "q35.gguf", seed=21)
    make_qwen35(root / "q35_attn.gguf", seed=23, recurrent_layers=(False,) * 4)   # no GDN layer at all
    make_dense(root / "q3.gguf", "qwen3", seed=22)
    return {name: load_model(root / f"{file}.gguf", "cpu")
            for name, file in (("qwen35", "q35"), ("q35_attn", "q35_attn"), ("qwen3", "q3"))}


def plain(model, prompts=PROMPTS, token_budget=80, max_tokens=MAX_TOKENS):
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=token_budget))
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens)) for p in prompts]
    engine.run()
    return [engine.take_output(i).token_ids for i in ids]


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
@pytest.mark.parametrize("target", ["qwen35", "qwen3"])
def test_always_wrong_draft_commits_one_correct_token_per_verify(models, target, mode):
    model = models[target]
    want = plain(model)
    drafter = AlwaysWrongDrafter([p + o for p, o in zip(PROMPTS, want)], model.config.vocab)
    spec = SpecConfig(spec=mode, draft_kind="model", draft="wrong", ddtree_budget=8, spec_top_k=2, chain_depth=3)
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=80, spec=spec), drafter=drafter)
    ids = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in PROMPTS]
    while engine.has_unfinished():
        engine.step()
        engine.check()
    outs = [engine.take_output(i) for i in ids]
    assert [o.token_ids for o in outs] == want
    s = engine.spec.stats
    assert drafter.depths and drafter.misses == 0 and s.verifies > 0
    assert s.accepted == 0 and s.emitted == s.verifies          # exactly one token per verify
    assert s.drafted > 0 and s.verify_rows == s.verifies + s.drafted
    assert sum(o.metrics.get("spec_verifies", 0) for o in outs) == s.verifies
    assert sum(o.metrics.get("spec_drafted", 0) for o in outs) == s.drafted


def test_perfect_draft_statistics_add_up(models):
    model = models["qwen35"]
    want = plain(model)
    spec = SpecConfig(spec="ddtree", draft_kind="model", draft="self", ddtree_budget=6, spec_top_k=2)
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=80, spec=spec), draft_model=model)
    ids = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in PROMPTS]
    engine.run()
    outs = [engine.take_output(i) for i in ids]
    assert [o.token_ids for o in outs] == want
    s = engine.spec.stats
    assert s.accepted > 0 and s.acceptance_length > 1.5
    assert sum(o.metrics.get("spec_accepted", 0) for o in outs) == s.accepted
    # every token is either sampled from a prompt tail / AR row or emitted by a verify
    assert engine.stats.generated_tokens == sum(len(o.token_ids) for o in outs)
    assert engine.stats.steps < len(PROMPTS) * MAX_TOKENS    # speculation saved steps


@pytest.mark.parametrize("mode", ["chain", "ddtree", "specla"])
def test_all_attention_qwen35_speculates(models, mode):
    """A qwen35 GGUF whose layers are all full attention (recurrent_layers all false) accepts
    drafted tokens like any other target (it used to fail at the first accepted draft: 'slot
    0 has no verified tree to commit')."""
    model = models["q35_attn"]
    assert not model.config.gdn_layers
    want = plain(model)
    spec = SpecConfig(spec=mode, draft_kind="model", draft="self", ddtree_budget=6, spec_top_k=2, chain_depth=3)
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=80, spec=spec), draft_model=model)
    ids = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in PROMPTS]
    engine.run()
    assert [engine.take_output(i).token_ids for i in ids] == want
    assert engine.spec.stats.accepted > 0 and engine.stats.failed == 0


@pytest.mark.parametrize("mode", ["chain", "ddtree", "specla"])
def test_all_attention_qwen35_speculates_with_a_dflash_draft(models, tmp_path, mode):
    """The all-attention qwen35 with a DFlash draft (behind an oracle with a set acceptance
    length, so drafts are accepted while the DFlash pass and the target features it reads
    run every step): greedy output equals --spec off."""
    from luce.models import load_model
    from luce.spec.drafters import DFlashDrafter
    from luce.spec.drafters.bench_drafters import OracleDrafter
    from luce.testing.tiny_models import make_dflash_draft

    model = models["q35_attn"]
    want = plain(model)
    make_dflash_draft(tmp_path / "d.gguf", model.config, seed=5, block_size=4, target_layers=(0, 2))
    dflash = DFlashDrafter(load_model(tmp_path / "d.gguf", "cpu", target_model=model), 4, 128)
    oracle = OracleDrafter([p + o for p, o in zip(PROMPTS, want)], model.config.vocab, inner=dflash,
                           acceptance_length=3)
    spec = SpecConfig(spec=mode, draft_kind="model", draft="oracle", ddtree_budget=6, spec_top_k=2, chain_depth=3)
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=80, spec=spec), drafter=oracle)
    ids = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in PROMPTS]
    engine.run()
    assert [engine.take_output(i).token_ids for i in ids] == want
    assert engine.spec.stats.accepted > 0 and engine.stats.failed == 0 and oracle.misses == 0


@pytest.mark.parametrize("point", POINTS)
def test_fault_before_commit_of_a_tree_step_changes_nothing_and_retires_no_one(models, point):
    """A fault at any point before the commit of steps that carry only trees: every domain
    (pages, slots, recurrent state, committed KV) is bitwise as before the step, no request
    ends with an error, and every output is what plain decoding gives."""
    model = models["qwen35"]
    want = plain(model)
    drafter = AlwaysWrongDrafter([p + o for p, o in zip(PROMPTS, want)], model.config.vocab)
    spec = SpecConfig(spec="specla", draft_kind="model", draft="wrong", ddtree_budget=5, spec_top_k=2)
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=80, spec=spec), drafter=drafter)
    faults, seen = [], {"tree steps": 0}

    def fault(at, step):
        if at == "before_forward":   # admitted, drafted, built and preflighted: nothing durable yet
            seen["before"] = domain_digests(engine)
            seen["tree steps"] += bool(step.cohort.tree and not step.durable)
        # every other tree-only step faults (a request failing max_step_retries + 1 times in a row errors)
        if at == point and step.cohort.tree and not step.durable and seen["tree steps"] % 2 and len(faults) < 3:
            faults.append(step.cohort.slots)
            raise RuntimeError("injected")

    engine.fault_hook = fault
    ids = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in PROMPTS]
    while engine.has_unfinished():
        n = len(faults)
        updates = engine.step()
        engine.check()
        if len(faults) > n:
            assert domain_digests(engine) == seen["before"] and not updates
    assert len(faults) == 3 and engine.stats.dropped_steps == 3 and engine.stats.failed == 0
    assert [engine.take_output(i).token_ids for i in ids] == want


def test_lanes_that_do_not_fit_the_budget_decode_as_ar_rows(models):
    """Budget 68 with 4 slots: while the 70-token prompt prefills (64 rows), the others have
    no room for a tree and run as AR rows; afterwards they speculate."""
    model = models["qwen3"]
    prompts = PROMPTS[:3] + [list(range(30, 100))]
    want = plain(model, prompts, token_budget=68)
    spec = SpecConfig(spec="chain", draft_kind="model", draft="self", chain_depth=4)
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=68, spec=spec), draft_model=model)
    shapes = []
    engine.fault_hook = lambda point, step: point == "before_forward" and shapes.append(
        (len(step.cohort.prefill), len(step.cohort.decode), len(step.cohort.tree)))
    ids = [engine.add_request(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
        engine.check()
    assert [engine.take_output(i).token_ids for i in ids] == want
    assert (1, 3, 0) in shapes                     # the 64-row chunk beside three AR rows
    assert any(p == 1 and t > 0 for p, _, t in shapes)   # the prompt's tail beside trees


class HostSamplingBackend:
    """The model's backend without `sample`: sampled rows are drawn on the host from
    downloaded logits."""

    def __init__(self, backend):
        self._backend = backend

    def __getattr__(self, name):
        if name == "sample":
            raise AttributeError(name)
        return getattr(self._backend, name)


class HostSamplingModel:
    """The model with a HostSamplingBackend (everything else, attribute writes included, is
    the model's)."""

    def __init__(self, model):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "backend", HostSamplingBackend(model.backend))

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __setattr__(self, name, value):
        setattr(self._model, name, value)


@pytest.mark.parametrize("spec_mode", ["off", "ddtree"])
def test_backend_drawn_tokens_equal_host_sampling(models, spec_mode):
    """Tokens drawn by backend.sample (only ids leave the device) equal the host sampler on
    downloaded logits, seeded, with and without trees (a greedy request shares the steps)."""
    model = models["qwen35"]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_k=40, top_p=0.9, seed=7),
              SamplingParams(max_tokens=MAX_TOKENS),
              SamplingParams(max_tokens=MAX_TOKENS, temperature=1.3, top_k=5, min_p=0.05, seed=8)]
    calls = []

    def run(target):
        spec = None if spec_mode == "off" else SpecConfig(spec=spec_mode, draft_kind="model", draft="self",
                                                          ddtree_budget=6, spec_top_k=2)
        engine = Engine(target, None, EngineConfig(max_slots=3, ctx=128, token_budget=80, spec=spec),
                        draft_model=model)
        ids = [engine.add_request(p, q) for p, q in zip(PROMPTS, params)]
        engine.run()
        return [engine.take_output(i).token_ids for i in ids]

    original = model.backend.sample

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    model.backend.sample = counting
    try:
        drawn = run(model)
    finally:
        del model.backend.sample
    assert calls                                   # the backend drew the sampled rows
    assert drawn == run(HostSamplingModel(model))


@pytest.mark.parametrize("target", ["qwen35", "qwen3"])
def test_steps_go_ahead_once_adaptive_speculation_steps_aside(models, target):
    """Adaptive depth (draft_min 0) with a draft that is always wrong settles on plain decoding;
    from then on steps are launched ahead of the last one's tokens (luce.engine.ahead, forced on
    here: the cpu backend runs each call to its end) and the tokens stay plain decoding's."""
    model = models[target]
    want = plain(model, max_tokens=60)
    drafter = AlwaysWrongDrafter([p + o for p, o in zip(PROMPTS, want)], model.config.vocab)
    spec = SpecConfig(spec="chain", draft_kind="model", draft="wrong", chain_depth=3, draft_min=0)
    engine = Engine(model, None, EngineConfig(max_slots=4, ctx=128, token_budget=80, spec=spec, async_steps=True),
                    drafter=drafter)
    assert engine.ahead
    engine.spec.clock = itertools.count(0, 1e-3).__next__     # every reading 1 ms on: the policy's choices repeat
    ids = [engine.add_request(p, SamplingParams(max_tokens=60)) for p in PROMPTS]
    fed = count_fed(engine)
    while engine.has_unfinished():
        engine.step()
        engine.check()
    assert [engine.take_output(i).token_ids for i in ids] == want
    assert engine.spec.stats.verifies > 0 and len(fed) > 10     # it tried, then went ahead
