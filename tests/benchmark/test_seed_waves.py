"""The seed's C1-C5 waves (luce/benchmark/seed_waves.py) at tiny size on the cpu backend: every
wave's outputs equal plain greedy decoding, AR and speculation give the same digests, the oracle's
set acceptance length shows, and the A/B/A comparison of three reports (through the CLI's JSON
too) gives ratios, drift and digest equality. Timings are reported, not asserted."""
from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from luce.benchmark.seed_waves import WaveConfig, compare_waves, prepare_waves, run_waves

ROOT = Path(__file__).resolve().parents[2]
CFG = WaveConfig(concurrency=(1, 3), waves=2, prompt_len=20, max_tokens=13, n_prompts=4, acceptance_length=3,
                 budget=5, top_k=2, token_budget=128)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from luce.models import load_model
    from luce.testing.tiny_models import make_dflash_draft, make_qwen35

    root = tmp_path_factory.mktemp("waves")
    q35 = make_qwen35(root / "t.gguf", seed=4)
    make_dflash_draft(root / "d.gguf", q35, seed=5, block_size=4, target_layers=(0, 2))
    target = load_model(root / "t.gguf", "cpu")
    return target, load_model(root / "d.gguf", "cpu", target_model=target), root


@pytest.fixture(scope="module")
def report(pair):
    target, draft, _ = pair
    prompts, truth = prepare_waves(target, CFG)
    return run_waves(target, draft, CFG, prompts, truth, log=lambda *_: None), truth


def test_waves_are_exact_in_both_arms(report):
    r, truth = report
    assert len(truth) == CFG.n_prompts and all(len(t) == CFG.max_tokens for t in truth)
    for arm in ("ar", "specla"):
        for C in CFG.concurrency:
            row = r[arm][C]
            assert row["matches_plain"] and row["tokens"] == CFG.waves * C * CFG.max_tokens
            assert len(row["wave_s"]) == CFG.waves and row["goodput_tok_s"] > 0
    assert r["summary"]["digests_equal"] and r["summary"]["matches_plain"]
    assert r["ar"][1]["digest"] != r["ar"][3]["digest"]      # other prompts, other outputs
    # the oracle's truth stops after acceptance_length - 1 drafted tokens: at most 3 per verify,
    # fewer only where a request has fewer tokens left
    for C in CFG.concurrency:
        assert 2.0 < r["specla"][C]["acceptance_length"] <= CFG.acceptance_length
    assert "acceptance_length" not in r["ar"][1]


def test_aba_comparison(report, tmp_path):
    r, _ = report
    b = copy.deepcopy(r)
    for C in CFG.concurrency:
        b["summary"]["goodput_tok_s"]["specla"][C] *= 2
    a2 = copy.deepcopy(r)
    a2["summary"]["goodput_tok_s"]["ar"][1] *= 1.1
    out = compare_waves([r, b, a2])
    assert out["specla"]["1"]["B_over_A"] == pytest.approx(2.0) and out["specla"]["1"]["A_A_drift"] == 0
    assert out["ar"]["1"]["A_A_drift"] == pytest.approx(0.1) and out["ar"]["1"]["B_over_A"] == pytest.approx(1 / 1.05)
    assert out["digests_equal"]
    b["specla"][3]["digest"] = "0" * 64
    assert not compare_waves([r, b, a2])["digests_equal"]
    with pytest.raises(ValueError, match="three reports"):
        compare_waves([r, b])
    # the CLI reads the reports back from JSON (concurrency keys become strings)
    paths = []
    for name, rep in (("a", r), ("b", r), ("a2", a2)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"waves": rep}, default=str))
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_seed_workload.py"), "--compare", *map(str, paths)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    cli = json.loads(run.stdout)
    assert cli["digests_equal"] and cli["ar"]["1"]["A_A_drift"] == pytest.approx(0.1)


def test_cli_waves_section(pair, tmp_path):
    _, _, root = pair
    out = tmp_path / "w.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_seed_workload.py"), str(root / "t.gguf"),
                          "--draft", str(root / "d.gguf"), "--backend", "cpu", "--sections", "waves",
                          "--concurrency", "2", "--waves", "1", "--wave-prompt-len", "12", "--wave-tokens", "6",
                          "--acceptance-length", "3", "--json", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    waves = json.loads(out.read_text())["waves"]
    assert list(waves["specla"]) == ["2"] and waves["summary"]["digests_equal"] and waves["summary"]["matches_plain"]
    assert "aba" not in json.loads(out.read_text())        # only the section asked for ran


def test_the_default_arm_is_the_servers_config_and_reports_the_depths_it_chose(pair):
    """'default' runs exactly the SpecConfig luce-serve builds for the draft (adaptive depth,
    down to plain decoding); 'chain@D' drafts D at every step (DFlash: at most its block - 1),
    a bound. Both exact; each row reports the depths chosen (depth -> steps, 0 = plain)."""
    from luce.benchmark.seed_workload import arm_spec
    from luce.server.engine_core import ServeOptions, serve_spec_config

    target, draft, _ = pair
    served = serve_spec_config(ServeOptions(draft_kind="dflash"), "oracle")
    assert arm_spec("default", draft, CFG) == served and served.draft_min == 0 and served.spec == "chain"
    fixed = arm_spec("chain@3", draft, CFG)
    assert fixed.draft_min is None and fixed.chain_depth == 3 and arm_spec("specla", draft, CFG).chain_depth == 15
    cfg = dataclasses.replace(CFG, concurrency=(1,))
    prompts, truth = prepare_waves(target, cfg)
    r = run_waves(target, draft, cfg, prompts, truth, arms=("default", "chain@3"), log=lambda *_: None)
    assert r["summary"]["matches_plain"] and r["summary"]["digests_equal"]
    assert set(r["chain@3"][1]["depths"]) <= {1, 2, 3} and r["chain@3"][1]["depths"].get(3, 0) > 0
    depths = r["default"][1]["depths"]
    assert depths and all(0 <= d <= 3 for d in depths)   # the DFlash block (4) caps the depth at 3


def test_gate_with_a_draft_model_pair(tmp_path):
    """The gate (run_gate) on a dense target + draft model pair, as `make serve`'s: per
    acceptance length and C, plain decoding, the default config and a fixed depth, all exact,
    the default's depth histogram reported; the CLI's `gate` section writes the same summary, with
    the A/A control (`ar2`, a second plain engine) beside. Whether it passes is a GPU measurement,
    not asserted here."""
    from luce.benchmark.seed_waves import run_gate
    from luce.models import load_model
    from luce.testing.tiny_models import make_dense

    make_dense(tmp_path / "t.gguf", "qwen3", seed=4)
    make_dense(tmp_path / "d.gguf", "qwen3", seed=5, n_layer=1)
    target, draft = load_model(tmp_path / "t.gguf", "cpu"), load_model(tmp_path / "d.gguf", "cpu")
    cfg = dataclasses.replace(CFG, concurrency=(1, 2), waves=1)
    prompts, truth = prepare_waves(target, cfg)
    lines = []
    r = run_gate(target, draft, cfg, prompts, truth, acceptance_lengths=(6, 2), arms=("ar", "default", "chain@4"),
                 log=lines.append)
    for a in ("AL6", "AL2"):
        assert set(r[a]["summary"]["goodput_tok_s"]) == {"ar", "default", "chain@4"}
        for C in (1, 2):
            row = r["summary"][a][C]
            assert row["exact"] and row["default_over_ar"] > 0 and sum(row["depths"].values()) > 0
            assert all(0 <= d <= 8 for d in row["depths"])                   # draft_max 8
            assert set(r[a]["chain@4"][C]["depths"]) <= {1, 2, 3, 4}
    assert isinstance(r["summary"]["pass"], bool) and lines[-1].startswith("gate: ")
    assert isinstance(r["summary"]["pass_within_noise"], bool)
    for a in ("AL6", "AL2"):
        for C in (1, 2):
            lo, hi = r["summary"][a][C]["wave_ratio_2se"]
            assert lo == hi and lo > 0          # one wave: no spread
    out = tmp_path / "g.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_seed_workload.py"), str(tmp_path / "t.gguf"),
                          "--draft", str(tmp_path / "d.gguf"), "--backend", "cpu", "--sections", "gate",
                          "--concurrency", "1", "--waves", "1", "--wave-prompt-len", "12", "--wave-tokens", "6",
                          "--gate-al", "3", "--arms", "ar,ar2,default,chain@2", "--json", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    gate = json.loads(out.read_text())["gate"]
    row = gate["summary"]["AL3"]["1"]
    assert row["exact"] and "default_over_ar" in row
    assert row["ar2_over_ar"] == pytest.approx(row["ar2"] / row["ar"]) and "depths" not in gate["AL3"]["ar2"]["1"]
    assert "A/A ar2/ar" in run.stdout + run.stderr and "gate AL3 C1" in run.stdout + run.stderr


def test_the_gate_s_wave_ratio_bounds():
    """Per wave, plain time over default time; mean -+ 2 standard errors."""
    from luce.benchmark.seed_waves import _ratio_bounds

    lo, hi = _ratio_bounds([1.0, 1.0, 1.0, 1.0], [1.0, 1.02, 0.98, 1.0])
    r = np.array([1.0, 1 / 1.02, 1 / 0.98, 1.0])
    se = r.std(ddof=1) / 2
    assert lo == pytest.approx(r.mean() - 2 * se) and hi == pytest.approx(r.mean() + 2 * se) and lo < 1 < hi


def test_interleaved_waves_take_turns_and_report_as_separate_runs(pair, monkeypatch):
    """interleave=True: after each arm's warm-up wave, timed wave w runs on every arm before wave
    w + 1 on any (a drift of the machine weighs on all arms alike); the rows equal what separate
    runs report (same digests, exact)."""
    import luce.benchmark.seed_waves as sw

    target, draft, _ = pair
    cfg = dataclasses.replace(CFG, concurrency=(1,), waves=3)
    prompts, truth = prepare_waves(target, cfg)
    order, wave = [], sw._wave
    monkeypatch.setattr(sw, "_wave", lambda engine, ps, n: (order.append((id(engine), ps[0][:3])), wave(engine, ps, n))[1])
    r = run_waves(target, draft, cfg, prompts, truth, arms=("ar", "specla"), log=lambda *_: None, interleave=True)
    engines = [e for e, _ in order]
    a, b = engines[0], engines[1]
    assert a != b and engines == [a, b] * 4                        # warm-ups, then waves 1, 2, 3 in turn
    assert [p for _, p in order[::2]] == [p for _, p in order[1::2]]   # the same prompts per wave
    assert r["summary"]["matches_plain"] and r["summary"]["digests_equal"]
    separate = run_waves(target, draft, cfg, prompts, truth, arms=("ar",), log=lambda *_: None)
    assert separate["ar"][1]["digest"] == r["ar"][1]["digest"]
