"""The OpenAI API as the official `openai` client sees it, over a deterministic fake engine.

The fake engine's output for a prompt is known (fake_core.SCRIPTS), so text, finish reasons
and usage numbers are checked against values computed here with the tokenizer.
"""
from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from tests.server.conftest import fake_server, openai_client, tiny_tokenizer
from tests.server.fake_core import SCRIPTS

openai = pytest.importorskip("openai")


def chat_ids(messages):
    tok = tiny_tokenizer()
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))


def messages_for_script(k: int, salt: str = ""):
    """User messages whose prompt makes the fake engine produce SCRIPTS[k]."""
    for i in range(1000):
        msgs = [{"role": "user", "content": f"prompt {salt}{i}"}]
        if sum(chat_ids(msgs)) % len(SCRIPTS) == k:
            return msgs
    raise AssertionError("no prompt found")


def prompt_for_script(k: int, salt: str = "") -> str:
    tok = tiny_tokenizer()
    for i in range(1000):
        text = f"text {salt}{i}"
        if sum(tok.encode(text)) % len(SCRIPTS) == k:
            return text
    raise AssertionError("no prompt found")


def n_tokens(text: str) -> int:
    return len(tiny_tokenizer().encode(text))


def test_chat_non_stream_text_finish_and_usage(server):
    client = openai_client(server)
    msgs = messages_for_script(1)
    r = client.chat.completions.create(model="fake-model", messages=msgs, temperature=0)
    assert r.object == "chat.completion" and r.model == "fake-model"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == SCRIPTS[1]
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len(chat_ids(msgs))
    assert r.usage.completion_tokens == n_tokens(SCRIPTS[1]) + 1       # + the end-of-generation token
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_deltas_concatenate_to_the_text_and_usage_comes_last(server):
    client = openai_client(server)
    msgs = messages_for_script(2)
    chunks = list(client.chat.completions.create(model="m", messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == SCRIPTS[2]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(chat_ids(msgs))
    assert chunks[-1].usage.completion_tokens == n_tokens(SCRIPTS[2]) + 1
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_chat_max_tokens_gives_length_and_exact_count(server):
    client = openai_client(server)
    msgs = messages_for_script(0)
    tok = tiny_tokenizer()
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.choices[0].message.content == tok.decode(tok.encode(SCRIPTS[0])[:7])
    r = client.chat.completions.create(model="m", messages=msgs, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_are_honoured(server, stream):
    client = openai_client(server)
    msgs = messages_for_script(1)
    stop = ["lazy", "fox j"]
    expected = SCRIPTS[1][: SCRIPTS[1].index("fox j")]
    tok = tiny_tokenizer()
    ids = tok.encode(SCRIPTS[1])
    n_expected = next(n for n in range(1, len(ids) + 1) if "fox j" in tok.decode(ids[:n]))
    if stream:
        chunks = list(client.chat.completions.create(model="m", messages=msgs, stop=stop, stream=True,
                                                     stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert (text, reason) == (expected, ["stop"])
        assert chunks[-1].usage.completion_tokens == n_expected
    else:
        r = client.chat.completions.create(model="m", messages=msgs, stop="fox j")
        assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == n_expected


def test_completions_text_and_token_prompts(server):
    client = openai_client(server)
    prompt = prompt_for_script(3)
    r = client.completions.create(model="m", prompt=prompt, max_tokens=1000)
    assert r.object == "text_completion" and r.choices[0].text == SCRIPTS[3]
    assert r.usage.prompt_tokens == n_tokens(prompt) and r.choices[0].finish_reason == "stop"
    ids = tiny_tokenizer().encode(prompt)
    r2 = client.completions.create(model="m", prompt=ids, max_tokens=1000)
    assert r2.choices[0].text == SCRIPTS[3] and r2.usage.prompt_tokens == len(ids)
    r3 = client.completions.create(model="m", prompt=[prompt], max_tokens=4)
    assert r3.choices[0].finish_reason == "length" and r3.usage.completion_tokens == 4


def test_completions_stream_with_stop(server):
    client = openai_client(server)
    prompt = prompt_for_script(0)
    chunks = list(client.completions.create(model="m", prompt=prompt, stream=True, stop=["return"],
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == SCRIPTS[0][: SCRIPTS[0].index("return")]
    assert chunks[-1].usage.prompt_tokens == n_tokens(prompt)


def test_four_concurrent_streams_each_get_their_own_text(server):
    client = openai_client(server)
    prompts = [messages_for_script(k % len(SCRIPTS), salt=f"c{k}") for k in range(4)]
    alone = [client.chat.completions.create(model="m", messages=p, temperature=0).choices[0].message.content
             for p in prompts]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def worker(i):
        try:
            c = openai_client(server)
            parts = []
            for ch in c.chat.completions.create(model="m", messages=prompts[i], temperature=0, stream=True):
                if ch.choices and ch.choices[0].delta.content:
                    parts.append(ch.choices[0].delta.content)
            results[i] = "".join(parts)
        except BaseException as e:   # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert [results[i] for i in range(4)] == alone
    assert len(set(alone)) == 4


def test_models_props_health(server):
    client = openai_client(server)
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    props = json.load(urllib.request.urlopen(server.url + "/props"))
    assert props["n_ctx"] == 256 and props["total_slots"] == 2
    assert props["speculation"] == {"mode": "off", "active": False, "draft": None, "draft_kind": None,
                                    "note": "fake engine for tests"}
    assert props["default_generation_settings"]["temperature"] == 0.8
    health = json.load(urllib.request.urlopen(server.url + "/health"))
    assert health["status"] == "ok"


def test_system_and_assistant_turns_and_text_parts_reach_the_template(server):
    client = openai_client(server)
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=1)
    flat = [dict(m, content="hi there") if i == 1 else m for i, m in enumerate(msgs)]
    assert r.usage.prompt_tokens == len(chat_ids(flat))
    r2 = client.chat.completions.create(model="m", messages=[{"role": "developer", "content": "be brief"},
                                                             *msgs[1:]], max_tokens=1)
    assert r2.usage.prompt_tokens == r.usage.prompt_tokens     # developer is the system role


def test_api_key_required_when_configured():
    with fake_server(api_key="sekrit") as s:
        with pytest.raises(openai.AuthenticationError) as e:
            openai_client(s, api_key="wrong").models.list()
        assert e.value.status_code == 401 and "API key" in e.value.message
        assert openai_client(s, api_key="sekrit").models.list().data[0].id == "fake-model"
        assert json.load(urllib.request.urlopen(s.url + "/health"))["status"] == "ok"   # public


def test_engine_error_becomes_500_or_stream_error(server):
    client = openai_client(server)
    msgs = [{"role": "user", "content": "PLEASE-FAIL now"}]
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="m", messages=msgs)
    assert "injected failure" in e.value.message
    with pytest.raises(openai.APIError) as e2:
        list(client.chat.completions.create(model="m", messages=msgs, stream=True))
    assert "injected failure" in str(e2.value)
    assert client.chat.completions.create(model="m", messages=messages_for_script(0)).choices[0].message.content \
        == SCRIPTS[0]


def test_speculative_steps_are_cut_at_max_tokens_and_stops():
    with fake_server(tokens_per_step=4) as s:
        client = openai_client(s)
        msgs = messages_for_script(1)
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=6)
        assert r.usage.completion_tokens == 6
        r = client.chat.completions.create(model="m", messages=msgs)
        assert r.choices[0].message.content == SCRIPTS[1]
        metrics = urllib.request.urlopen(s.url + "/metrics").read().decode()
        accept = [ln for ln in metrics.splitlines() if ln.startswith("luce_spec_acceptance_length ")]
        assert 3.0 < float(accept[0].split()[1]) <= 4.0
