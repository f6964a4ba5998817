"""Prefix cache acceptance on the tiny qwen35 (hybrid) and qwen3 (dense) models: a multi-turn
conversation (each prompt the previous prompt + its output + a new message), a turn that edits
the middle, a repeat and a prompt shorter than a page give, with the cache on, exactly the
tokens and bit-for-bit the logits of the same requests with the cache off, greedy and seeded,
with and without speculation (n-gram drafts, DDTree) - and the cache really served tokens.
"""
import numpy as np
import pytest

from luce.engine import Engine, EngineConfig, SamplingParams
from luce.models import load_model
from luce.spec.config import SpecConfig
from luce.testing.tiny_models import make_dense, make_qwen35
from tests.engine.test_engine_tiny import LogitsRecorder

MAX_TOKENS = 7


@pytest.fixture(scope="module", params=["qwen35", "qwen3"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix") / f"{request.param}.gguf"
    if request.param == "qwen35":
        make_qwen35(path, seed=5)
    else:
        make_dense(path, arch="qwen3", seed=5)
    return request.param, load_model(path, "cpu")


def make_engine(model, cache: bool, spec: bool, max_slots: int = 2):
    ref = {}
    recorder = LogitsRecorder(model, ref)
    spec_config = SpecConfig(spec="ddtree", draft_kind="ngram", ddtree_budget=6) if spec else None
    engine = Engine(recorder, None, EngineConfig(max_slots=max_slots, ctx=1024, token_budget=160,
                                                 prefix_cache=cache, spec=spec_config, snapshot_interval=128))
    ref["engine"] = engine
    engine.fault_hook = lambda point, step: ref.__setitem__("step", step)
    return engine, recorder


def params_for(i: int, sampled: bool) -> SamplingParams:
    if sampled:
        return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, top_p=0.9, seed=40 + i)
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def conversation(engine, sampled: bool):
    """Run the turns one after the other (then two at once); returns [(tokens, cached)] and
    the request ids in order."""
    rng = np.random.default_rng(9)
    words = lambda n: rng.integers(0, 60, n).tolist()  # noqa: E731 - small alphabet: n-gram drafts hit
    system = words(150)
    prompt, results, ids = system + words(30), [], []

    def run(prompts):
        rids = [engine.add_request(p, params_for(len(ids) + j, sampled)) for j, p in enumerate(prompts)]
        while engine.has_unfinished():
            engine.step()
            engine.check()
        ids.extend(rids)
        outs = [engine.take_output(r) for r in rids]
        results.extend((o.token_ids, o.metrics.get("cached_tokens", 0)) for o in outs)
        return outs

    for turn in range(3):                                     # the conversation grows
        (out,) = run([prompt])
        prompt = prompt + out.token_ids + words(70 + 20 * turn)
    edited = prompt[:200] + words(5) + prompt[205:]            # an agent edits the middle
    run([edited])
    run([prompt])                                             # the unedited history again
    run([system[:10]])                                        # shorter than a page
    run([prompt + words(40), system + words(90)])             # two at once, sharing pages
    return results, ids


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "ddtree"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_cache_hit_is_byte_identical_to_cache_off(tiny, sampled, spec):
    name, model = tiny
    runs = {}
    for cache in (False, True):
        engine, recorder = make_engine(model, cache, spec)
        results, ids = conversation(engine, sampled)
        logits = {}
        for n, rid in enumerate(ids):
            logits[n] = {pos: row for (r, pos), row in recorder.rows.items() if r == rid}
        runs[cache] = results, logits, engine
    (cold, cold_logits, _), (warm, warm_logits, engine) = runs[False], runs[True]
    assert [t for t, _ in warm] == [t for t, _ in cold]
    for n in cold_logits:
        assert warm_logits[n].keys() == cold_logits[n].keys() and warm_logits[n] == cold_logits[n], f"request {n}"
    cached = [c for _, c in warm]
    assert all(c == 0 for _, c in cold)
    assert cached[0] == 0                                      # the first turn
    assert cached[5] == (0 if name == "qwen35" else 9)         # 10 tokens: dense copies 9 rows of a page
    assert all(c > 0 for i, c in enumerate(cached) if i not in (0, 5))
    if name == "qwen35":                                       # hybrid: resumed at a snapshot (multiple of 64)
        assert all(c % 64 == 0 for c in cached)
        assert cached[3] == 128                                # the edit at 200: the snapshot before it (every 128)
        s = engine.cache.stats
        assert s.snapshot_hits == sum(c > 0 for c in cached) and s.snapshots_taken >= 4
    else:                                                      # dense: up to the divergence, pages in part
        assert cached[3] == 200 and cached[1] == 176           # turn 1's full prompt pages (180 tokens)
    assert engine.stats.cached_prompt_tokens == sum(cached)
    if spec:
        assert engine.spec.stats.verifies > 0
    assert engine.pool.n_used == len(engine.cache.entries) + 0   # only the cache holds pages now
    engine.cache.clear()
    engine.check()
    assert engine.pool.n_used == 0 and engine.cache.bytes == 0
