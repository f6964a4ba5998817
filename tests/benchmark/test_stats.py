"""Statistics with hand-computed expected values: percentiles, TTFT/TBT, token apportioning,
output windows, window token accounting, stalls, and the staggered window summary."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luce.benchmark import stats
from luce.benchmark.records import RequestRecord
from luce.benchmark.staggered import summarize_round


def rec(times, n=None, texts=None, send=0.0, prompt_tokens=None, key="k") -> RequestRecord:
    """A finished record whose chunks arrived at `times` (one char 'x' each unless texts)."""
    texts = texts if texts is not None else ["x"] * len(times)
    return RequestRecord(key=key, prompt_id=key, max_tokens=n or len(times), send_time=send,
                         chunk_times=list(times), chunk_texts=list(texts), completion_tokens=n,
                         prompt_tokens=prompt_tokens, end_time=times[-1] if times else send)


# ------------------------------------------------------------------ percentiles

@pytest.mark.parametrize("values, q, expected", [
    ([1, 2, 3, 4], 50, 2.5),            # h = 1.5: 2 + 0.5 * (3 - 2)
    ([1, 2, 3, 4], 90, 3.7),            # h = 2.7: 3 + 0.7 * (4 - 3)
    ([5, 1, 3], 50, 3.0),               # sorted [1, 3, 5], h = 1
    ([5, 1, 3], 90, 4.6),               # h = 1.8: 3 + 0.8 * 2
    ([10.0], 90, 10.0),
    ([2, 4], 0, 2.0),
    ([2, 4], 100, 4.0),
    ([0.010, 0.020, 0.030, 0.040, 0.100], 90, 0.076),   # h = 3.6: 0.04 + 0.6 * 0.06
])
def test_percentile_hand_values(values, q, expected):
    assert stats.percentile(values, q) == pytest.approx(expected, abs=1e-12)


def test_percentile_empty_and_range():
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError, match="percentile q"):
        stats.percentile([1.0], 101)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), st.floats(0, 100))
def test_percentile_matches_numpy_linear(values, q):
    assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_summarize_skips_none():
    s = stats.summarize([0.3, None, 0.1, 0.2])
    assert s == {"n": 3, "p50": pytest.approx(0.2), "p90": pytest.approx(0.28), "mean": pytest.approx(0.2),
                 "min": 0.1, "max": 0.3}
    assert stats.summarize([])["p50"] is None


# ------------------------------------------------------------------ per request

def test_ttft_and_tbt():
    r = rec([1.0, 1.5, 2.0, 3.0], n=4, send=0.25)
    assert stats.ttft(r) == pytest.approx(0.75)
    assert stats.tbt(r) == pytest.approx(2.0 / 3.0)          # (3.0 - 1.0) / (4 - 1)
    assert stats.tbt(rec([1.0], n=1)) is None


def test_tbt_uses_usage_count_with_multi_token_chunks():
    r = rec([1.0, 2.0, 3.0], n=7)                            # 7 tokens in 3 chunks
    assert stats.tbt(r) == pytest.approx(2.0 / 6.0)


@pytest.mark.parametrize("texts, n, expected", [
    (["a", "b", "c"], 3, [1, 1, 1]),                        # one token per chunk: exact
    (["ab", "cd", "ef"], 6, [2, 2, 2]),
    (["a", "bbb", "cc"], 4, [1, 2, 1]),                     # cum round(4*1/6)=1, round(4*4/6)=3, 4
    (["a", "b", "c", "d"], 2, [1, 0, 1, 0]),                # fewer tokens than chunks
    (["", "abc"], 3, [1, 2]),                                # the first chunk gets at least one
])
def test_tokens_per_chunk_apportioning(texts, n, expected):
    r = rec([float(i) for i in range(len(texts))], n=n, texts=texts)
    assert r.tokens_per_chunk() == expected
    assert sum(r.tokens_per_chunk()) == n
    assert len(r.token_times()) == n


def test_chunk_count_when_no_usage():
    r = rec([1.0, 2.0], texts=["ab", "c"])
    assert r.n_tokens == 2 and r.token_source == "chunks"
    assert r.token_times() == [1.0, 2.0]


# ------------------------------------------------------------------ output windows

def test_output_window_two_requests():
    w = stats.output_window([rec([1.0, 2.0, 3.0], n=3), rec([1.5, 2.5, 3.5, 4.5], n=4)])
    assert (w.start, w.end, w.tokens) == (1.0, 4.5, 6)     # 3 + 4 - the opening token
    assert w.tok_s == pytest.approx(6 / 3.5)


def test_output_window_single_request_is_inverse_tbt():
    r = rec([1.0, 1.5, 2.0, 3.0], n=4)
    w = stats.output_window([r])
    assert w.tokens == 3 and w.duration == pytest.approx(2.0)
    assert w.tok_s == pytest.approx(1.0 / stats.tbt(r))


def test_output_window_excludes_the_whole_opening_chunk():
    w = stats.output_window([rec([1.0, 2.0, 3.0], n=6, texts=["ab", "cd", "ef"])])
    assert w.tokens == 4 and w.tok_s == pytest.approx(2.0)   # 2 tokens arrived at the start


def test_output_window_ignores_requests_without_output():
    empty = RequestRecord(key="e", prompt_id="e", max_tokens=4, error="HTTP 500")
    w = stats.output_window([empty, rec([2.0, 4.0], n=2)])
    assert (w.start, w.end, w.tokens) == (2.0, 4.0, 1)
    assert stats.output_window([empty]) is None


def test_pooled_tok_s_is_ratio_of_sums():
    windows = [stats.OutputWindow(1.0, 4.5, 6), stats.OutputWindow(0.0, 1.5, 3), None]
    assert stats.pooled_tok_s(windows) == pytest.approx(9 / 5.0)
    assert stats.pooled_tok_s([None]) is None


def test_tokens_between_half_open():
    r = rec([1.0, 2.0, 3.0], n=4, texts=["a", "bb", "c"])     # tokens at 1, 2, 2, 3
    assert stats.tokens_between([r], 1.0, 2.0) == 2           # (1, 2]: both tokens at 2
    assert stats.tokens_between([r], 0.0, 1.0) == 1
    assert stats.tokens_between([r, r], 2.0, 3.0) == 2


def test_longest_gap_inside_and_spanning():
    assert stats.longest_gap([0, 1, 1.5, 4, 4.2], 1.2, 2.0) == pytest.approx(2.5)
    assert stats.longest_gap([0, 5], 1.0, 2.0) == 5
    assert stats.longest_gap([0, 0.5], 1.0, 2.0) is None     # finished before the window


# ------------------------------------------------------------------ staggered window accounting

def _staggered_records():
    est1 = rec([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5], key="e1")
    est2 = rec([0.8, 1.2, 1.6, 3.0, 3.2, 3.6], key="e2")
    arriving = rec([3.1, 3.3], send=2.1, prompt_tokens=500, key="a")
    return [est1, est2], [arriving]


def test_staggered_summary_hand_values():
    established, arriving = _staggered_records()
    s = summarize_round(established, arriving, t0=0.0, origin=0.0, arrive_after_s=2.0)
    assert s["warnings"] == []
    assert s["arrived_at_s"] == pytest.approx(2.1)
    assert s["prefill_window"] == {"start_s": 2.1, "end_s": 3.1, "duration_s": pytest.approx(1.0)}
    assert s["established_tokens_in_window"] == 3                       # 2.5, 3.0 and 3.0
    assert s["established_goodput_tok_s"] == pytest.approx(3.0)
    assert s["established_tbt_effective_s"] == pytest.approx(2 * 1.0 / 3)
    assert s["established_goodput_before_tok_s"] == pytest.approx(5 / 1.3)   # (0.8, 2.1]: 5 tokens
    assert s["established_tbt_before_s"] == pytest.approx(2 * 1.3 / 5)
    assert s["established_max_gap_s"] == pytest.approx(1.4)             # e2: 1.6 -> 3.0
    assert s["arriving_ttft_s"]["p50"] == pytest.approx(1.0)
    assert s["arriving_prompt_tokens"] == 500
    assert s["prompt_tok_s"] == pytest.approx(500.0)
    assert s["round_time_s"] == pytest.approx(3.6)


def test_staggered_summary_warns_on_bad_settings():
    est = [rec([2.5, 2.6, 2.7], key="e")]                  # first token after the arrival, ends early
    arriving = [rec([3.1, 3.3], send=2.1, key="a")]        # no prompt token count
    s = summarize_round(est, arriving, t0=0.0, origin=0.0, arrive_after_s=2.0)
    text = " ".join(s["warnings"])
    assert "S = 2 s is too short" in text and "L too small" in text and "no prompt throughput" in text
    assert s["established_goodput_before_tok_s"] is None and s["prompt_tok_s"] is None
    assert s["established_tokens_in_window"] == 3


def test_staggered_summary_with_failed_request():
    established, _ = _staggered_records()
    failed = RequestRecord(key="a", prompt_id="a", max_tokens=2, send_time=2.1, error="HTTP 400: too long")
    s = summarize_round(established, [failed], t0=0.0, origin=0.0, arrive_after_s=2.0)
    assert s["prefill_window"] is None and s["established_goodput_tok_s"] is None
    assert s["errors"] == ["HTTP 400: too long"]
