"""A/B/A arithmetic and rules (hand-computed), output digests, and /metrics acceptance length."""
from __future__ import annotations

import hashlib
import random

import pytest

from luce.benchmark.bracket import bracket, compare_metric, run_metrics
from luce.benchmark.digests import (differing_keys, output_set, output_set_digest, record_digest,
                                    summarize_outputs, text_digest)
from luce.benchmark.records import RequestRecord
from luce.benchmark.server_metrics import acceptance_between, parse_prometheus

# ------------------------------------------------------------------ drift and significance


def test_change_against_bracket_mean_and_drift():
    c = compare_metric("c1.output_tok_s", a=100.0, b=110.0, a2=104.0, higher_is_better=True)
    assert c.drift == 4.0 and c.mean == 102.0 and c.change == 8.0
    assert c.change_rel == pytest.approx(8 / 102) and c.drift_rel == pytest.approx(4 / 102)
    assert c.significant and c.verdict == "better"           # 8 >= 2 * 4: exactly at the bar


def test_gain_smaller_than_twice_drift_is_not_significant():
    c = compare_metric("x", a=100.0, b=109.9, a2=104.0)      # change 7.9 < 8
    assert c.change == pytest.approx(7.9)
    assert not c.significant and c.verdict == "not significant"


def test_loss_beyond_twice_drift_is_significant_and_worse():
    c = compare_metric("x", a=100.0, b=90.0, a2=101.0)       # drift 1, change -10.5
    assert c.change == pytest.approx(-10.5) and c.significant and c.verdict == "worse"


@pytest.mark.parametrize("b, verdict", [(0.08, "better"), (0.12, "worse"), (0.10, "no change")])
def test_latency_direction_with_zero_drift(b, verdict):
    c = compare_metric("c1.tbt_p50_s", a=0.10, b=b, a2=0.10, higher_is_better=False)
    assert c.drift == 0.0 and c.verdict == verdict
    assert c.significant == (verdict != "no change")


def test_missing_values():
    c = compare_metric("x", a=1.0, b=None, a2=1.0)
    assert c.verdict == "missing" and not c.significant and c.change is None


# ------------------------------------------------------------------ bracket over run results

def _result(digest_by_key: dict, tok_s: float, ttft: float) -> dict:
    outputs = {k: [v] for k, v in digest_by_key.items()}
    return {
        "outputs": {"set_digest": output_set_digest(outputs), "outputs": outputs},
        "levels": [{"concurrency": 1, "output_tok_s": tok_s, "ttft_s": {"p50": ttft, "p90": ttft},
                    "tbt_s": {"p50": 0.01, "p90": 0.01}, "acceptance_length": None}],
        "staggered": None,
    }


def _changes(result: dict) -> dict:
    return {c["name"]: c for c in result["changes"]}


def test_bracket_same_outputs_compares_metrics():
    same = {"p1|max_tokens=8": "d1", "p2|max_tokens=8": "d2"}
    out = bracket(_result(same, 100, 0.5), _result(same, 130, 0.4), _result(same, 110, 0.5))
    assert out["valid"] and out["correctness_ok"] and out["baseline_reproducible"]
    assert out["quarantined"] is None
    tok = _changes(out)["c1.output_tok_s"]
    assert (tok["drift"], tok["mean"], tok["change"]) == (10, 105, 25) and tok["verdict"] == "better"
    ttft = _changes(out)["c1.ttft_p50_s"]
    assert ttft["change"] == pytest.approx(-0.1) and ttft["verdict"] == "better"
    assert _changes(out)["c1.acceptance_length"]["verdict"] == "missing"


def test_bracket_quarantines_a_candidate_with_different_outputs():
    base = {"p1|max_tokens=8": "d1", "p2|max_tokens=8": "d2"}
    wrong = {"p1|max_tokens=8": "d1", "p2|max_tokens=8": "OTHER"}
    out = bracket(_result(base, 100, 0.5), _result(wrong, 900, 0.1), _result(base, 101, 0.5))
    assert not out["correctness_ok"] and not out["valid"]
    assert out["candidate_differing_keys"] == ["p2|max_tokens=8"]
    assert out["changes"] == []
    assert out["quarantined"]["c1.output_tok_s"] == 900
    drift = {d["name"]: d for d in out["baseline_drift"]}
    assert drift["c1.output_tok_s"]["drift"] == 1


def test_bracket_flags_unreproducible_baseline():
    base = {"p1|max_tokens=8": "d1"}
    out = bracket(_result(base, 100, 0.5), _result(base, 100, 0.5), _result({"p1|max_tokens=8": "d9"}, 100, 0.5))
    assert out["correctness_ok"] and not out["baseline_reproducible"] and not out["valid"]
    assert out["baseline_differing_keys"] == ["p1|max_tokens=8"]


def test_run_metrics_names_and_directions():
    metrics = run_metrics(_result({}, 100, 0.5))
    assert metrics["c1.output_tok_s"] == (100, True)
    assert metrics["c1.ttft_p90_s"] == (0.5, False)
    assert metrics["c1.tbt_p50_s"] == (0.01, False)


# ------------------------------------------------------------------ digests

def _done(key: str, text: str) -> RequestRecord:
    return RequestRecord(key=key, prompt_id=key, max_tokens=1, chunk_times=[1.0], chunk_texts=[text])


def test_text_digest_is_sha256_of_utf8():
    assert text_digest("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert text_digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_output_set_digest_definition_and_order_independence():
    records = [_done("b", "x"), _done("a", "abc"), _done("b", "x")]
    lines = "a\t" + text_digest("abc") + "\n" + "b\t" + text_digest("x") + "\n"
    expected = hashlib.sha256(lines.encode()).hexdigest()
    for _ in range(5):
        random.shuffle(records)
        assert output_set_digest(output_set(records)) == expected


def test_inconsistent_and_incomplete_outputs():
    failed = RequestRecord(key="a", prompt_id="a", max_tokens=1, error="HTTP 500: boom")
    summary = summarize_outputs([_done("a", "abc"), _done("a", "abd"), failed, _done("b", "x")])
    assert summary["inconsistent_keys"] == ["a"]
    assert summary["incomplete"] == 1
    assert record_digest(failed) == "INCOMPLETE:HTTP 500: boom"
    assert len(summary["outputs"]["a"]) == 3
    assert differing_keys(summary["outputs"], output_set([_done("a", "abc"), _done("b", "x")])) == ["a"]


# ------------------------------------------------------------------ /metrics

METRICS_TEXT = """# HELP luce_tokens_per_step Tokens a request received from one engine step.
# TYPE luce_tokens_per_step histogram
luce_tokens_per_step_bucket{le="1"} 4
luce_tokens_per_step_bucket{le="+Inf"} 20
luce_tokens_per_step_sum 40
luce_tokens_per_step_count 20
luce_spec_acceptance_length NaN
luce_http_requests_total{endpoint="/v1/completions",status="200"} 3
luce_http_requests_total{endpoint="/health",status="200"} 2
"""


def test_parse_prometheus_sums_label_sets():
    m = parse_prometheus(METRICS_TEXT)
    assert m["luce_http_requests_total"] == 5
    assert m["luce_tokens_per_step_sum"] == 40 and m["luce_tokens_per_step_count"] == 20


def test_acceptance_from_histogram_delta():
    before = {"luce_tokens_per_step_sum": 10.0, "luce_tokens_per_step_count": 10.0}
    value, source = acceptance_between(before, parse_prometheus(METRICS_TEXT))
    assert (value, source) == (3.0, "luce_tokens_per_step")     # (40 - 10) / (20 - 10)


def test_acceptance_from_gauge_skips_nan():
    assert acceptance_between({}, {"luce_spec_acceptance_length": float("nan")}) == (None, None)
    assert acceptance_between({}, {"luce_acceptance_length": 2.5}) == (2.5, "luce_acceptance_length")


def test_acceptance_from_vllm_counters():
    before = {"vllm:spec_decode_num_accepted_tokens_total": 30.0, "vllm:spec_decode_num_drafts_total": 10.0}
    after = {"vllm:spec_decode_num_accepted_tokens_total": 90.0, "vllm:spec_decode_num_drafts_total": 40.0}
    assert acceptance_between(before, after) == (3.0, "vllm:spec_decode")   # 1 + 60 / 30


def test_acceptance_absent():
    assert acceptance_between({}, None) == (None, None)
    assert acceptance_between({}, {"other_metric": 1.0}) == (None, None)


def test_bracket_report_units_and_verdicts():
    from luce.benchmark.report import format_bracket
    same = {"p1|max_tokens=8": "d1"}
    text = format_bracket(bracket(_result(same, 100, 0.5), _result(same, 130, 0.4), _result(same, 110, 0.5)))
    tok_line = next(line for line in text.splitlines() if "c1.output_tok_s" in line)
    assert "130.0" in tok_line and "ms" not in tok_line and "better" in tok_line
    ttft_line = next(line for line in text.splitlines() if "c1.ttft_p50_s" in line)
    assert "400.0 ms" in ttft_line
