"""/tokenize, /detokenize, /slots, GET /v1/models/{id} and the access log."""
from __future__ import annotations

import logging

import pytest

from tests.server import rawhttp
from tests.server.conftest import fake_server, openai_client, tiny_tokenizer, wait_until
from tests.server.rawhttp import open_stream, read_events

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server():
    with fake_server(max_slots=2, step_delay=0.01, script_repeat=100, n_ctx=100_000) as s:
        yield s


def test_tokenize_and_detokenize_round_trip(server):
    tok = tiny_tokenizer()
    text = "héllo <|im_end|> world"
    r = rawhttp.call(server.url, "POST", "/tokenize", {"content": text}).json()
    assert r["tokens"] == tok.encode(text) and r["count"] == len(r["tokens"]) and r["max_model_len"] == 100_000
    plain = rawhttp.call(server.url, "POST", "/tokenize", {"prompt": text, "parse_special": False}).json()
    assert plain["tokens"] == tok.encode(text, parse_special=False) and len(plain["tokens"]) > len(r["tokens"])
    pieces = rawhttp.call(server.url, "POST", "/tokenize", {"content": "hé", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tok.encode("hé")
    assert b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                    for p in pieces) == "hé".encode()
    back = rawhttp.call(server.url, "POST", "/detokenize", {"tokens": r["tokens"]}).json()
    assert back["content"] == text
    chat = [{"role": "user", "content": "hi"}]
    templ = rawhttp.call(server.url, "POST", "/tokenize", {"messages": chat}).json()
    assert templ["tokens"] == tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True))


def test_tokenize_errors_name_the_field(server):
    bad = rawhttp.call(server.url, "POST", "/detokenize", {"tokens": [1, 10**9]})
    assert bad.status == 400 and bad.json()["error"]["param"] == "tokens[1]"
    bad = rawhttp.call(server.url, "POST", "/tokenize", {"content": 5})
    assert bad.status == 400 and bad.json()["error"]["param"] == "content"


def test_slots_show_the_running_request(server):
    sock = open_stream(server.url, content="long")
    rid = read_events(sock, 2)[0]["id"]
    try:
        assert wait_until(lambda: any(s["is_processing"] for s in rawhttp.call(server.url, "GET", "/slots").json()))
        slots = rawhttp.call(server.url, "GET", "/slots").json()
        assert len(slots) == 2 and [s["id"] for s in slots] == [0, 1]
        busy = [s for s in slots if s["is_processing"]]
        assert busy[0]["id_task"] == rid and busy[0]["n_past"] > 0 and busy[0]["n_ctx"] == 100_000
    finally:
        sock.close()
    assert wait_until(lambda: not any(s["is_processing"] for s in rawhttp.call(server.url, "GET", "/slots").json()))


def test_model_by_id(server):
    client = openai_client(server)
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-9")
    assert "this server serves 'fake-model'" in e.value.message


def test_one_access_log_line_per_request(server, caplog):
    with caplog.at_level(logging.INFO, logger="luce.access"):
        openai_client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                      max_tokens=4)
        rawhttp.call(server.url, "GET", "/nope")
    lines = [r.getMessage() for r in caplog.records if r.name == "luce.access"]
    assert len(lines) == 2
    assert '"POST /v1/chat/completions" 200 prompt=' in lines[0] and "completion=4 " in lines[0]
    assert lines[0].startswith("127.0.0.1 ") and lines[0].endswith(" ms")
    assert '"GET /nope" 404' in lines[1]
