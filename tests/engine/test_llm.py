"""luce.LLM on a tiny model: generate (batching, order, params per prompt), stream, errors."""
import pytest

import luce
from luce.engine.request import FinishReason
from luce.llm import LLM, GenerationError
from luce.models import generate_greedy
from luce.testing.tiny_models import make_qwen35


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("llm") / "q35.gguf"
    make_qwen35(path, seed=2)
    return LLM(path, backend="cpu", max_slots=2, ctx=256, token_budget=2 + 64)


def test_lazy_exports():
    assert luce.LLM is LLM and luce.SamplingParams is luce.engine.sampler.SamplingParams


def test_generate_keeps_order_and_matches_a_plain_greedy_loop(llm):
    prompts = ["def fib(n):", "hello", [5, 6, 7], "x" * 150]
    params = luce.SamplingParams(max_tokens=5, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert [o.prompt for o in outs] == ["def fib(n):", "hello", None, "x" * 150]
    for prompt, out in zip(prompts, outs):
        ids = llm.encode(prompt)
        assert out.prompt_token_ids == ids and out.prompt_tokens == len(ids)
        assert out.token_ids == generate_greedy(llm.model, ids, 5)
        assert out.text == llm.tokenizer.decode(out.token_ids, skip_special=True)
        assert out.finish_reason == FinishReason.LENGTH
    assert not llm.engine.requests and llm.engine.pool.n_used == llm.engine.pool.n_cache_only


def test_params_per_prompt_and_single_prompt_forms(llm):
    a = luce.SamplingParams(max_tokens=2, ignore_eos=True)
    b = luce.SamplingParams(max_tokens=4, temperature=1.0, seed=7, ignore_eos=True)
    outs = llm.generate(["ab", "ab"], [a, b])
    assert len(outs[0].token_ids) == 2 and len(outs[1].token_ids) == 4
    assert llm.generate("ab", b)[0].token_ids == outs[1].token_ids    # seeded: reproducible
    assert llm.generate([7, 8], a)[0].prompt_token_ids == [7, 8]
    with pytest.raises(ValueError, match="list of 2"):
        llm.generate(["a", "b"], [a])
    with pytest.raises(TypeError, match="a str or a list of token ids"):
        llm.generate([3.5])


def test_stream_yields_the_generated_text(llm):
    params = luce.SamplingParams(max_tokens=8, ignore_eos=True)
    pieces = list(llm.stream("def fib(n):", params))
    assert "".join(pieces) == llm.generate("def fib(n):", params)[0].text
    assert not llm.engine.requests


def test_closing_a_stream_early_cancels_it(llm):
    params = luce.SamplingParams(max_tokens=50, ignore_eos=True)
    stream = llm.stream("hello", params)
    next(stream)
    stream.close()
    assert not llm.engine.requests and llm.engine.pool.n_used == llm.engine.pool.n_cache_only and llm.engine.stats.cancelled >= 1


def test_engine_error_surfaces_in_stream_and_generate(llm):
    def fault(point, step):
        if point == "after_forward":
            raise RuntimeError("injected")

    llm.engine.fault_hook = fault
    try:
        with pytest.raises(GenerationError, match="injected"):
            list(llm.stream("hi", luce.SamplingParams(max_tokens=3)))
        out = llm.generate("hi", luce.SamplingParams(max_tokens=3))[0]
        assert out.finish_reason == FinishReason.ERROR and "injected" in out.error
    finally:
        llm.engine.fault_hook = None
    assert llm.generate("hi", luce.SamplingParams(max_tokens=2, ignore_eos=True))[0].finish_reason == "length"


def test_missing_model_and_draft_are_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="fetch the model"):
        LLM(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="d.gguf"):
        LLM("whatever.gguf", draft="d.gguf")


def test_speculative_llm_gives_the_plain_output(tmp_path):
    """draft= turns speculation on (chain by default; here ddtree with the model drafting for
    itself, and n-gram lookup without a draft): the text is the same as without."""
    path = tmp_path / "q35.gguf"
    make_qwen35(path, seed=2)
    prompts = ["def fib(n):", "hello hello hello"]
    params = luce.SamplingParams(max_tokens=8, ignore_eos=True)
    plain_llm = LLM(path, backend="cpu", max_slots=2, ctx=256, token_budget=2 + 64)
    plain = [o.token_ids for o in plain_llm.generate(prompts, params)]
    for options in (dict(draft=path), dict(draft=path, spec="ddtree", ddtree_budget=6), dict(draft_kind="ngram")):
        fast = LLM(path, backend="cpu", max_slots=2, ctx=256, token_budget=2 + 64, **options)
        assert fast.engine.spec is not None
        assert [o.token_ids for o in fast.generate(prompts, params)] == plain, options
        if "draft" in options:   # (n-gram lookup finds nothing to propose in this random text)
            assert fast.engine.spec.stats.accepted > 0


def test_n_sequences_and_logprobs_shaped_as_vllm(llm):
    import numpy as np
    from luce.models import SegmentSpec, build_batch
    from luce.models.kv_cache import pages_needed

    params = luce.SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.9, seed=11, n=3, logprobs=2)
    (out,) = llm.generate(["hello"], params)
    assert len(out.outputs) == 3 and [o.index for o in out.outputs] == [0, 1, 2]
    assert out.text == out.outputs[0].text and out.token_ids == out.outputs[0].token_ids
    for j, seq in enumerate(out.outputs):   # sequence j is the request with seed 11 + j alone
        (alone,) = llm.generate(["hello"], luce.SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.9,
                                                                seed=11 + j))
        assert seq.token_ids == alone.token_ids
    ids = llm.encode("hello") + out.outputs[0].token_ids
    state = llm.model.new_state(max_pages=pages_needed(len(ids)), max_slots=1)
    logits = llm.model.forward(build_batch([SegmentSpec(0, ids, 0, list(range(pages_needed(len(ids)))),
                                                        logits="all")]), state).logits
    x = np.asarray(llm.model.backend.to_numpy(logits), np.float64)[len(ids) - 5:-1]
    want = x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
    first = out.outputs[0]
    assert len(first.logprobs) == 4
    for j, (token, entry) in enumerate(zip(first.token_ids, first.logprobs)):
        assert entry[token].logprob == pytest.approx(want[j, token], abs=1e-4)
        ranked = sorted((lp.rank, t) for t, lp in entry.items() if lp.rank is not None)
        assert [t for _, t in ranked] == list(np.argsort(-want[j], kind="stable")[:2])
    assert first.cumulative_logprob == pytest.approx(sum(want[j, t] for j, t in enumerate(first.token_ids)), abs=1e-3)
