"""The streaming client, waves and staggered rounds against the fake server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import time

import pytest

from luce.benchmark.client import Endpoint, _SSEParser, request_body, stream_request
from luce.benchmark.prompts import Prompt
from luce.benchmark.server_process import free_port
from luce.benchmark.staggered import StaggerConfig, run_staggered
from luce.benchmark.waves import run_level, wave_prompts
from tests.benchmark.fake_server import FakeServer, fake_tokens

PROMPT = Prompt(id="p0", text="def add(a, b):", corpus_words=3)
SUBSET = [Prompt(id=f"p{i}", text=f"def f{i}(x): return x + {i}", corpus_words=5) for i in range(10)]


def stream(endpoint: Endpoint, prompt: Prompt = PROMPT, max_tokens: int = 10):
    return asyncio.run(stream_request(endpoint, prompt, max_tokens))


# ------------------------------------------------------------------ request bodies and SSE

def test_request_body_is_greedy_forced_length_and_overridable():
    body = request_body(Endpoint("http://127.0.0.1:1", api="chat", model="m"), "hi", 32)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["model"] == "m"
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"], body["temperature"]) == (32, 32, True, 0.0)
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    custom = request_body(Endpoint("http://127.0.0.1:1", extra_body={"ignore_eos": None, "top_k": 1}), "hi", 4)
    assert "ignore_eos" not in custom and custom["top_k"] == 1 and custom["prompt"] == "hi"


def test_endpoint_rejects_bad_urls_and_apis():
    with pytest.raises(ValueError, match="http://host:port"):
        Endpoint("127.0.0.1:8080")
    with pytest.raises(ValueError, match="api must be"):
        Endpoint("http://127.0.0.1:8080", api="embeddings")
    assert Endpoint("http://127.0.0.1:8080/v1/").root == "http://127.0.0.1:8080"
    assert Endpoint("http://127.0.0.1:8080/v1/").path == "/v1/completions"
    assert Endpoint("http://h:1/proxy/v1", api="chat").path == "/proxy/v1/chat/completions"


def test_sse_parser_byte_by_byte_with_crlf_and_multiline_data():
    raw = b'data: {"a": 1}\r\n\r\n: comment\n\nevent: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n'
    parser = _SSEParser()
    events = []
    for i in range(len(raw)):
        events += parser.feed(raw[i:i + 1])
    assert events == ['{"a": 1}', "line1\nline2", "[DONE]"]


# ------------------------------------------------------------------ streaming against the fake server

@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("chunked, crlf", [(True, False), (False, True)])
def test_stream_records_every_token(api, chunked, crlf):
    with FakeServer(chunked=chunked, crlf=crlf) as server:
        r = stream(Endpoint(server.url, api=api), max_tokens=10)
    assert r.ok and r.error is None
    assert r.text == "".join(fake_tokens(PROMPT.text, 10))
    assert r.n_tokens == 10 and r.token_source == "usage" and len(r.chunk_times) == 10
    assert r.prompt_tokens == 3 and r.finish_reason == "length"
    assert r.send_time <= r.chunk_times[0] <= r.chunk_times[-1] <= r.end_time


def test_multi_token_chunks_use_usage_count():
    with FakeServer(tokens_per_chunk=4) as server:
        r = stream(Endpoint(server.url), max_tokens=10)
    assert len(r.chunk_times) == 3 and r.n_tokens == 10
    assert r.tokens_per_chunk() == [4, 4, 2]     # equal-length words: characters share exactly
    assert len(r.token_times()) == 10


def test_ignore_eos_is_what_forces_the_length():
    with FakeServer(eos_after=4) as server:
        forced = stream(Endpoint(server.url), max_tokens=10)
        natural = stream(Endpoint(server.url, extra_body={"ignore_eos": None}), max_tokens=10)
    assert forced.n_tokens == 10
    assert natural.n_tokens == 4 and natural.finish_reason == "stop"


def test_http_error_and_unreachable_server_are_recorded():
    with FakeServer(fail_status=429) as server:
        r = stream(Endpoint(server.url))
    assert not r.ok and r.error.startswith("HTTP 429") and "refused by the fake server" in r.error
    r = stream(Endpoint(f"http://127.0.0.1:{free_port()}", timeout_s=5))
    assert not r.ok and "Error" in r.error


def test_sampling_request_changes_output():
    with FakeServer() as server:
        greedy = stream(Endpoint(server.url))
        sampled = stream(Endpoint(server.url, extra_body={"temperature": 0.9, "seed": 3}))
    assert greedy.text != sampled.text


# ------------------------------------------------------------------ waves

def test_wave_prompts_rotate_through_the_subset():
    assert [p.id for p in wave_prompts(SUBSET, 3, 0)] == ["p0", "p1", "p2"]
    assert [p.id for p in wave_prompts(SUBSET, 3, 3)] == ["p9", "p0", "p1"]
    assert [p.id for p in wave_prompts(SUBSET, 4, 2)] == ["p8", "p9", "p0", "p1"]


def test_run_level_counts_and_acceptance():
    with FakeServer(tokens_per_chunk=2) as server:
        summary, records = asyncio.run(run_level(Endpoint(server.url), SUBSET, concurrency=3, n_waves=2,
                                                 max_tokens=6, origin=time.perf_counter()))
        prompts_sent = sorted(body["prompt"] for body in server.requests)
    assert sorted(r.prompt_id for r in records) == [f"p{i}" for i in range(6)]
    assert prompts_sent == sorted(p.text for p in SUBSET[:6])
    assert (summary["requests"], summary["failed"], summary["short"], summary["waves"]) == (6, 0, 0, 2)
    assert summary["token_source"] == "usage"
    assert [w["tokens"] for w in summary["windows"]] == [3 * 6 - 2, 3 * 6 - 2]   # opening chunk: 2 tokens
    assert summary["acceptance_length"] == 2.0 and summary["acceptance_source"] == "luce_tokens_per_step"
    assert summary["ttft_s"]["n"] == 6 and summary["tbt_s"]["n"] == 6
    assert summary["output_tok_s"] > 0


def test_run_level_reports_short_outputs_and_no_metrics():
    with FakeServer(eos_after=3, metrics=False) as server:
        endpoint = Endpoint(server.url, extra_body={"ignore_eos": None})
        summary, _ = asyncio.run(run_level(endpoint, SUBSET, 2, 1, max_tokens=6, origin=0.0))
    assert summary["short"] == 2 and summary["acceptance_length"] is None


# ------------------------------------------------------------------ staggered

def test_staggered_round_against_fake_server():
    arriving = [Prompt(id="medium", text="word " * 200, corpus_words=200),
                Prompt(id="long", text="word " * 600, corpus_words=600)]
    config = StaggerConfig(established=2, established_tokens=60, arrive_after_s=0.05, arrival_tokens=5)
    with FakeServer(token_s=0.004, prefill_s_per_word=0.0001) as server:
        summary, records = asyncio.run(run_staggered(Endpoint(server.url), SUBSET, arriving, config, origin=0.0))
    assert [r.prompt_id for r in records] == ["p0", "p1", "medium", "long"]
    assert [r.n_tokens for r in records] == [60, 60, 5, 5]
    assert summary["errors"] == []
    assert summary["arriving_prompt_tokens"] == 800
    assert summary["prefill_window"]["duration_s"] > 0
    assert 0 <= summary["established_tokens_in_window"] <= 120
    assert summary["acceptance_length"] == 1.0
    assert summary["config"]["arriving_prompts"] == ["medium", "long"]


def test_staggered_needs_enough_prompts():
    with pytest.raises(ValueError, match="need as many prompts"):
        asyncio.run(run_staggered(Endpoint("http://127.0.0.1:1"), SUBSET[:1], SUBSET[:1],
                                  StaggerConfig(established=2), origin=0.0))


def test_request_timeout_is_recorded():
    with FakeServer(token_s=0.5) as server:
        r = stream(Endpoint(server.url, timeout_s=0.3), max_tokens=50)
    assert not r.ok and r.error == "timed out after 0.3 s"


def test_events_usage_null_reasoning_and_errors():
    from luce.benchmark.client import _apply_event
    from luce.benchmark.records import RequestRecord
    r = RequestRecord(key="k", prompt_id="k", max_tokens=4)
    assert not _apply_event(r, '{"choices": [{"delta": {"role": "assistant", "content": null}}], "usage": null}',
                            1.0, "chat")
    assert not _apply_event(r, '{"choices": [{"delta": {"reasoning_content": "hmm"}}]}', 2.0, "chat")
    assert not _apply_event(r, '{"choices": [{"delta": {"content": "ok"}, "finish_reason": "length"}]}', 3.0, "chat")
    assert (r.chunk_times, r.text, r.finish_reason, r.completion_tokens) == ([2.0, 3.0], "hmmok", "length", None)
    assert _apply_event(r, '{"error": {"message": "engine died"}}', 4.0, "chat")
    assert r.error == "server error: engine died"
    assert _apply_event(r, " [DONE]", 5.0, "chat")
