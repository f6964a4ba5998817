"""End to end over the real engine: tiny GGUF models, luce.engine.Engine behind the bridge, the
HTTP server on a loopback port, the official openai client in front.

The reference for every text is luce.llm.LLM (the offline API, no server, no bridge) on the
same file with the same sampling parameters.
"""
from __future__ import annotations

import threading
import time

import pytest

from luce.engine.sampler import SamplingParams
from luce.server import App, ServerConfig, ServerThread
from luce.server.engine_core import ServeOptions, load_bridge
from luce.testing.tiny_models import make_dense, make_qwen35
from tests.server import rawhttp
from tests.server.conftest import wait_until
from tests.server.rawhttp import open_stream, read_events

openai = pytest.importorskip("openai")
CTX = 512


def start(path, max_slots=3):
    bridge = load_bridge(ServeOptions(model=str(path), backend="cpu", max_slots=max_slots, ctx=CTX,
                                      max_queue=8, token_budget=256), progress=False, say=lambda m: None)
    return ServerThread(App(ServerConfig(host="127.0.0.1", port=0), bridge)).start()


@pytest.fixture(scope="module", params=["qwen3", "qwen35"])
def served(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / f"tiny-{request.param}.gguf"
    if request.param == "qwen35":
        make_qwen35(path, seed=1)
    else:
        make_dense(path, arch="qwen3", seed=1)
    server = start(path)
    from luce.llm import LLM
    server.reference = LLM(str(path), backend="cpu", max_slots=1, ctx=CTX, token_budget=256)
    yield server
    server.stop()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def reference_text(server, messages, **params) -> tuple[str, int, str]:
    """(text, generated tokens, finish reason) from the offline API for a chat prompt."""
    llm = server.reference
    ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    out = llm.generate([ids], SamplingParams(**params))[0]
    return out.text, len(out.token_ids), out.finish_reason


def msgs(text):
    return [{"role": "user", "content": text}]


def test_chat_matches_the_offline_api_with_usage(served):
    r = client(served).chat.completions.create(model="m", messages=msgs("hello"), max_tokens=12, temperature=0)
    text, n, reason = reference_text(served, msgs("hello"), max_tokens=12, temperature=0.0)
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == reason
    tok = served.reference.tokenizer
    assert r.usage.prompt_tokens == len(tok.encode(tok.apply_chat_template(msgs("hello"))))
    assert r.usage.completion_tokens == n


def test_four_concurrent_greedy_streams_each_get_their_text_alone(served):
    prompts = [msgs(f"question number {i}: {'why ' * i}") for i in range(4)]
    c = client(served)
    alone = [c.chat.completions.create(model="m", messages=p, max_tokens=16, temperature=0).choices[0].message.content
             for p in prompts]
    assert alone == [reference_text(served, p, max_tokens=16, temperature=0.0)[0] for p in prompts]
    results, errors = {}, []

    def worker(i):
        try:
            parts = [ch.choices[0].delta.content or "" for ch in
                     client(served).chat.completions.create(model="m", messages=prompts[i], max_tokens=16,
                                                            temperature=0, stream=True) if ch.choices]
            results[i] = "".join(parts)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]   # 4 clients, 3 slots
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and [results.get(i) for i in range(4)] == alone


def test_seeded_sampling_is_reproducible_and_matches_offline(served):
    c = client(served)
    kw = dict(max_tokens=10, temperature=0.9, seed=1234, top_p=0.9)
    a = c.chat.completions.create(model="m", messages=msgs("tell me"), **kw).choices[0].message.content
    b = c.chat.completions.create(model="m", messages=msgs("tell me"), **kw).choices[0].message.content
    offline = reference_text(served, msgs("tell me"), max_tokens=10, temperature=0.9, seed=1234, top_p=0.9,
                             top_k=40, min_p=0.05)[0]
    assert a == b == offline


def test_stop_string_and_completion_endpoint(served):
    c = client(served)
    full = c.completions.create(model="m", prompt="def fib(n):", max_tokens=24, temperature=0).choices[0].text
    clean = [i for i in range(4, len(full) - 3) if "\ufffd" not in full[i:i + 3] and full[i:i + 3].strip()]
    if not clean:
        pytest.skip("the tiny model's text has no clean 3-character stop candidate")
    stop = full[clean[0]:clean[0] + 3]
    r = c.completions.create(model="m", prompt="def fib(n):", max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_disconnect_frees_the_engine_slot(served):
    engine = served.app.bridge.core.engine
    cancelled = engine.stats.cancelled
    sock = open_stream(served.url, content="a long answer please", ignore_eos=True)   # ~490 tokens
    read_events(sock, 3)
    assert served.app.bridge.stats().slots_busy == 1
    sock.close()
    assert wait_until(lambda: served.app.bridge.stats().slots_busy == 0 and served.app.in_flight == 0, 30)
    assert wait_until(lambda: not engine.requests and engine.pool.n_used == engine.pool.n_cache_only, 10)  # the prefix cache keeps some
    assert engine.stats.cancelled == cancelled + 1
    engine.check()


def test_prompt_longer_than_context_is_400(served):
    resp = rawhttp.call(served.url, "POST", "/v1/completions", {"prompt": "word " * 600, "max_tokens": 4})
    assert resp.status == 400 and resp.json()["error"]["param"] == "prompt"
    assert "context holds 512" in resp.json()["error"]["message"]
    fams = rawhttp.call(served.url, "GET", "/metrics").body.decode()
    assert "luce_kv_pages_free " in fams and "luce_slots_total 3" in fams


def test_max_tokens_clamped_to_the_context(served):
    tok = served.reference.tokenizer
    prompt = [t for t in tok.encode("the quick brown fox " * 40)][: CTX - 5]
    t0 = time.monotonic()
    r = client(served).completions.create(model="m", prompt=prompt, max_tokens=1000, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == CTX - 5 and r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length" and time.monotonic() - t0 < 120


def test_messages_and_responses_apis_give_the_chat_text_over_the_real_engine(served):
    anthropic = pytest.importorskip("anthropic")
    text, n, _ = reference_text(served, msgs("hello there"), max_tokens=8, temperature=0.0)
    m = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0, timeout=120).messages.create(
        model="m", max_tokens=8, messages=msgs("hello there"), extra_body={"temperature": 0})
    assert "".join(b.text for b in m.content if b.type == "text") == text and m.usage.output_tokens == n
    r = client(served).responses.create(model="m", input="hello there", max_output_tokens=8, temperature=0)
    assert r.output_text == text and r.usage.output_tokens == n
