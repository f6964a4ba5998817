"""Decode benchmark (luce.benchmark.decode_bench, tools/bench_decode.py) on tiny synthetic
models with the numpy backend: it runs end to end, and its figures agree with each other
and with what the drafters guarantee (the oracle commits depth + 1 tokens per verify, the
always-wrong drafter exactly one; speculative output equals greedy AR output)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from luce.benchmark.decode_bench import BenchSettings, run_decode_bench
from luce.benchmark.decode_report import format_report
from luce.gguf.reader import read_config
from luce.spec.drafters.base import DraftLane
from luce.spec.drafters.bench_drafters import AlwaysWrongDrafter, OracleDrafter
from luce.testing import synthetic_model as sm

ROOT = Path(__file__).resolve().parents[2]
FAST = BenchSettings(prompt_len=8, concurrency=(1, 2), warmup=1, steps=2, tree_widths=(1, 7),
                     depth=7, top_k=3, budget=6, spec_concurrency=(2,), prefill_lengths=(70, 300),
                     prefill_budget=128, prefill_reps=2)


def _synthetic(directory: Path, preset: str, mix: str = "q4_k_m", **kw) -> Path:
    path = directory / f"{preset}.gguf"
    if not path.exists():
        sm.write_synthetic(path, sm.plan_synthetic(sm.preset_config(preset, tiny=True, **kw), mix, preset))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_models")
    q36 = _synthetic(d, "qwen36-27b", "iq4_xs")
    return {"qwen35": q36, "dflash": _synthetic(d, "dflash-27b", "q8_0", target=read_config(q36), block_size=6),
            "qwen2": _synthetic(d, "qwen2.5-coder-1.5b"), "qwen2-draft": _synthetic(d, "qwen2.5-coder-0.5b")}


def _check_spec(report, settings, max_depth=None):
    cap = min(settings.depth, max_depth or settings.depth)
    if settings.spec_mode in ("ddtree", "specla"):
        cap = min(cap, settings.budget)
    assert sorted({r["concurrency"] for r in report["spec"]}) == sorted(settings.spec_concurrency)
    for C in settings.spec_concurrency:
        rows = [r for r in report["spec"] if r["concurrency"] == C]
        oracle, wrong = (next(r for r in rows if r["drafter"] == k) for k in ("oracle", "always-wrong"))
        for r in (oracle, wrong):
            assert "error" not in r, r.get("error")
            assert r["matches_ar"] and r["misses"] == 0
            assert r["verifies"] == len(r["proposal_depths"])
            assert r["steps"] >= 1 and r["tok_s"] > 0
        # the oracle commits its whole chain (cut at the tree budget) plus the bonus token per verify
        chains = [min(d, cap) for d in oracle["proposal_depths"]]
        assert oracle["accepted"] == sum(chains) and oracle["emitted"] == sum(chains) + len(chains)
        assert oracle["acceptance_length"] == pytest.approx(1 + sum(chains) / len(chains))
        # steady steps only: every lane commits a full chain per step
        assert oracle["steps"] == wrong["steps"] == settings.steps
        assert oracle["tokens_per_step"] == pytest.approx(C * (cap + 1))
        # the always-wrong drafter: one token per verify, so one per lane per step
        assert wrong["accepted"] == 0 and wrong["emitted"] == wrong["verifies"]
        assert wrong["acceptance_length"] == 1.0
        assert wrong["tokens_per_step"] == pytest.approx(C)
        assert oracle["tokens_per_step"] > wrong["tokens_per_step"]


def _check_timings(report, settings):
    assert [r["concurrency"] for r in report["ar"]] == list(settings.concurrency)
    for r in report["ar"]:
        assert r["steps"] == settings.steps
        assert r["step_ms"] >= r["launch_ms"] > 0
        assert r["tok_s"] == pytest.approx(r["concurrency"] / (r["step_ms"] / 1e3))
    ar1 = report["verify_ar_step_ms"]
    if 1 in settings.concurrency:
        assert ar1 == report["ar"][list(settings.concurrency).index(1)]["step_ms"]
    assert [r["width"] for r in report["verify"]] == list(settings.tree_widths)
    for r in report["verify"]:
        assert "error" not in r, r.get("error")
        assert r["tree_depth"] == min(settings.depth, r["width"] - 1)
        assert r["x_ar_step"] == pytest.approx(r["step_ms"] / ar1)


def test_hybrid_with_dflash_draft(models):
    report = run_decode_bench(str(models["qwen35"]), "numpy", str(models["dflash"]), FAST)
    _check_timings(report, FAST)
    assert [r["concurrency"] for r in report["draft_pass"]] == [1, 2]
    assert all(r["pass_ms"] > 0 and r["steps"] == FAST.steps for r in report["draft_pass"])
    _check_spec(report, FAST, max_depth=6 - 1)        # the DFlash block of 6 caps the depth at 5
    assert report["memory"]["host_peak_rss_bytes"] > 0
    assert [r["concurrency"] for r in report["engine_ar"]] == [1, 2]
    assert all(r["steps"] == FAST.steps and r["tok_s"] > 0 for r in report["engine_ar"])
    assert all(r["graphs"]["replays"] == 0 for r in report["engine_ar"])   # numpy: no graphs
    text = format_report(report)
    assert "AR decode" in text and "Speculation bounds" in text and "always-wrong" in text
    assert "through luce.engine.Engine" in text
    _check_prefill(report, FAST)
    assert "Prefill through luce.engine.Engine" in text


def _check_prefill(report, settings):
    assert [r["prompt_tokens"] for r in report["prefill"]] == list(settings.prefill_lengths)
    for r in report["prefill"]:
        assert "error" not in r and "skipped" not in r, r
        # chunks of the budget (a multiple of 64, the alignment) a step; the last one samples the first token
        assert r["steps"] == -(-r["prompt_tokens"] // settings.prefill_budget)
        assert r["reps"] == settings.prefill_reps
        assert 0 < r["ttft_s"] <= r["ttft_median_s"]
        assert r["tok_s"] == pytest.approx(r["prompt_tokens"] / r["ttft_s"])


def test_prefill_skips_lengths_past_the_trained_context(models):
    from luce.benchmark.prefill_bench import bench_prefill
    from luce.models.loader import load_model

    model = load_model(str(models["qwen2"]), "numpy")
    trained = model.config.context_length
    rows = bench_prefill(model, (130, trained), token_budget=128, reps=1, warmup=0)
    assert rows[0]["steps"] == 2 and rows[0]["tok_s"] > 0
    assert rows[1] == {"prompt_tokens": trained, "skipped": f"past the model's trained context ({trained} tokens)"}
    with pytest.raises(ValueError, match="reps >= 1"):
        bench_prefill(model, (130,), reps=0)


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_dense_with_draft_model(models, mode):
    settings = BenchSettings(**{**FAST.__dict__, "spec_mode": mode, "concurrency": (1,), "tree_widths": (1, 5),
                                "depth": 4, "budget": 3, "spec_concurrency": (1,)})
    report = run_decode_bench(str(models["qwen2"]), "numpy", str(models["qwen2-draft"]), settings,
                              sections=("ar", "verify", "spec"))
    _check_timings(report, settings)
    _check_spec(report, settings)
    assert "draft_pass" not in report


def test_cli_json(models, tmp_path):
    out = tmp_path / "report.json"
    cmd = [sys.executable, str(ROOT / "tools" / "bench_decode.py"), str(models["qwen35"]), "--backend", "numpy",
           "--prompt-len", "6", "--concurrency", "2", "--steps", "2", "--warmup", "1", "--widths", "1,3",
           "--depth", "3", "--spec-mode", "chain", "--prefill-lengths", "150", "--prefill-budget", "128",
           "--prefill-reps", "1", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert "medians of 2 steps after 1 warm-up steps" in run.stdout
    assert [r["concurrency"] for r in report["ar"]] == [2]
    assert [(r["prompt_tokens"], r["steps"]) for r in report["prefill"]] == [(150, 2)]
    assert "Prefill through luce.engine.Engine" in run.stdout
    assert report["backend"] == "numpy" and report["draft"] is None
    _check_spec(report, BenchSettings(prompt_len=6, depth=3, steps=2, warmup=1, spec_mode="chain"))


def test_drafters_know_right_from_wrong():
    seq = [5, 6, 7, 8, 9, 10]
    oracle, wrong = OracleDrafter([seq], vocab=12), AlwaysWrongDrafter([seq], vocab=12)
    lane = DraftLane(slot=0, tokens=seq[:3], depth=4, top_k=3)
    prop = oracle.propose([lane])[0]
    assert prop.depth == 3 and prop.ids[:, 0].tolist() == [8, 9, 10]       # the continuation ends
    assert all(len(set(row)) == 3 for row in prop.ids.tolist())
    bad = wrong.propose([lane])[0]
    assert bad.depth == 4 and not (bad.ids[:3] == np.array([[8], [9], [10]])).any(axis=1).any()
    assert oracle.propose([DraftLane(0, [5, 7], 2, 1)])[0].depth == 0 and oracle.misses == 1
