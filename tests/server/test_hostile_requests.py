"""Malformed and hostile requests: each gets the right status, an OpenAI error body naming the
problem (and the field), and the server stays healthy and correct afterwards."""
from __future__ import annotations

import json

import pytest

from tests.server import rawhttp
from tests.server.conftest import fake_server, wait_until

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MAX_BODY = 64 * 1024
USER = [{"role": "user", "content": "hello"}]


def chat(**fields):
    return rawhttp.request_bytes("POST", CHAT, json.dumps({"messages": USER, **fields}).encode(),
                                 {**AUTH, "Content-Type": "application/json"})


def comp(**fields):
    return rawhttp.request_bytes("POST", COMP, json.dumps(fields).encode(), {**AUTH})


def post(path, body: bytes, headers=None):
    return rawhttp.request_bytes("POST", path, body, {**AUTH, **(headers or {})})


def head_only(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# (name, request bytes, status, substring of error.message, error.param)
CASES = [
    ("bad json", post(CHAT, b'{"messages": ['), 400, "invalid JSON", None),
    ("json array body", post(CHAT, b"[1, 2]"), 400, "must be a JSON object", None),
    ("empty body", post(CHAT, b""), 400, "body is empty", None),
    ("not utf-8", post(CHAT, b'\xff\xfe{"a": 1}'), 400, "not valid UTF-8", None),
    ("deep nesting", post(CHAT, b"[" * 100_000 + b"]" * 100_000), 413, "larger than", None),
    ("deep nesting small", post(CHAT, b"[" * 20_000 + b"]" * 20_000), 400, "invalid JSON", None),
    ("5000-digit integer", post(CHAT, b'{"max_tokens": ' + b"9" * 5000 + b"}"), 400, "invalid JSON", None),
    ("huge body", rawhttp.request_bytes("POST", CHAT, None, {**AUTH, "Content-Length": str(50_000_000)}),
     413, "larger than the server's limit", None),
    ("huge chunked body", post(CHAT, (b"%x\r\n" % (MAX_BODY // 2) + b"x" * (MAX_BODY // 2) + b"\r\n") * 3,
                               {"Transfer-Encoding": "chunked"}), 413, "larger than", None),
    ("missing messages", post(CHAT, b'{"model": "m"}'), 400, "is required", "messages"),
    ("messages not array", chat(messages="hi"), 400, "must be an array", "messages"),
    ("messages empty", chat(messages=[]), 400, "at least one message", "messages"),
    ("message not object", chat(messages=["hi"]), 400, "must be an object", "messages[0]"),
    ("unknown role", chat(messages=[{"role": "wizard", "content": "x"}]), 400, "unknown role 'wizard'",
     "messages[0].role"),
    ("tool role without content", chat(messages=[{"role": "tool", "tool_call_id": "c1"}]), 400, "must be a string",
     "messages[0].content"),
    ("tool call arguments not JSON", chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]), 400, "not valid JSON",
     "messages[0].tool_calls[0].function.arguments"),
    ("tool call without function", chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c"}]}]), 400,
     "must be", "messages[0].tool_calls[0]"),
    ("tools not array", chat(tools={"type": "function"}), 400, "must be an array", "tools"),
    ("tool without name", chat(tools=[{"type": "function", "function": {"description": "x"}}]), 400,
     "must be a string", "tools[0].function.name"),
    ("tool with bad name", chat(tools=[{"type": "function", "function": {"name": "a b"}}]), 400,
     "not a valid tool name", "tools[0].function.name"),
    ("tool defined twice", chat(tools=[{"type": "function", "function": {"name": "f"}}] * 2), 400,
     "defined twice", "tools[1].function.name"),
    ("tool_choice unknown", chat(tool_choice="sometimes"), 400, "must be 'auto'", "tool_choice"),
    ("tool_choice names a missing tool", chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                              tool_choice={"type": "function", "function": {"name": "g"}}), 400,
     "not among the tools", "tool_choice"),
    ("tool_choice required without tools", chat(tool_choice="required"), 400, "no tools", "tool_choice"),
    ("legacy functions", chat(functions=[{"name": "f"}]), 400, "send tools", "functions"),
    ("chat_template_kwargs not object", chat(chat_template_kwargs=[1]), 400, "must be an object",
     "chat_template_kwargs"),
    ("reasoning_format unknown", chat(reasoning_format="xml"), 400, "must be one of", "reasoning_format"),
    ("role not string", chat(messages=[{"role": 3, "content": "x"}]), 400, "must be a string", "messages[0].role"),
    ("content number", chat(messages=[{"role": "user", "content": 42}]), 400, "must be a string or an array",
     "messages[0].content"),
    ("content null for user", chat(messages=[{"role": "user", "content": None}]), 400, "must be a string",
     "messages[0].content"),
    ("image part", chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), 400,
     "'image_url' is not supported", "messages[0].content[0].type"),
    ("lone surrogate", post(CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}'), 400,
     "surrogate", "messages[0].content"),
    ("negative max_tokens", chat(max_tokens=-5), 400, "must be >= 1", "max_tokens"),
    ("zero max_tokens", chat(max_tokens=0), 400, "must be >= 1", "max_tokens"),
    ("string max_tokens", chat(max_tokens="10"), 400, "must be an integer", "max_tokens"),
    ("fractional max_tokens", chat(max_tokens=1.5), 400, "must be an integer", "max_tokens"),
    ("boolean max_tokens", chat(max_tokens=True), 400, "got boolean", "max_tokens"),
    ("negative max_completion_tokens", chat(max_completion_tokens=-1), 400, ">= 1", "max_completion_tokens"),
    ("NaN temperature", post(CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'), 400,
     "must be finite", "temperature"),
    ("Infinity top_p", post(CHAT, b'{"messages": [{"role": "user", "content": "x"}], "top_p": Infinity}'), 400,
     "finite", "top_p"),
    ("negative temperature", chat(temperature=-1), 400, ">= 0", "temperature"),
    ("string temperature", chat(temperature="hot"), 400, "must be a number", "temperature"),
    ("top_p zero", chat(top_p=0), 400, "> 0", "top_p"),
    ("top_p above one", chat(top_p=1.5), 400, "<= 1", "top_p"),
    ("top_k negative", chat(top_k=-5), 400, ">= -1", "top_k"),
    ("min_p two", chat(min_p=2), 400, "<= 1", "min_p"),
    ("presence_penalty 5", chat(presence_penalty=5), 400, "<= 2", "presence_penalty"),
    ("frequency_penalty string", chat(frequency_penalty="x"), 400, "must be a number", "frequency_penalty"),
    ("repetition_penalty zero", chat(repetition_penalty=0), 400, "> 0", "repetition_penalty"),
    ("seed string", chat(seed="abc"), 400, "must be an integer", "seed"),
    ("seed fractional", chat(seed=1.5), 400, "must be an integer", "seed"),
    ("stop number", chat(stop=5), 400, "string or an array of strings", "stop"),
    ("stop list of numbers", chat(stop=[1]), 400, "must be a string", "stop[0]"),
    ("stop empty string", chat(stop=[""]), 400, "must not be empty", "stop[0]"),
    ("too many stops", chat(stop=[f"s{i}" for i in range(17)]), 400, "at most 16", "stop"),
    ("stream not boolean", chat(stream="yes"), 400, "must be a boolean", "stream"),
    ("stream_options without stream", chat(stream_options={"include_usage": True}), 400,
     "only allowed when stream is true", "stream_options"),
    ("n=0", chat(n=0), 400, "between 1 and 16", "n"),
    ("n=17", chat(n=17), 400, "between 1 and 16", "n"),
    ("top_logprobs without logprobs", chat(top_logprobs=2), 400, "needs logprobs", "top_logprobs"),
    ("top_logprobs 21", chat(logprobs=True, top_logprobs=21), 400, "between 0 and 20", "top_logprobs"),
    ("completion logprobs 21", comp(prompt="a", logprobs=21), 400, "between 0 and 20", "logprobs"),
    ("logit_bias not object", chat(logit_bias=[1]), 400, "must be an object", "logit_bias"),
    ("logit_bias key", chat(logit_bias={"x": 1}), 400, "not a token id", "logit_bias"),
    ("logit_bias value", chat(logit_bias={"3": 101}), 400, "[-100, 100]", "logit_bias"),
    ("logit_bias id", chat(logit_bias={"999999": 1}), 400, "outside the vocabulary", "logit_bias"),
    ("tools with a template that has none", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "no tool-call format", "tools"),
    ("tools on completions", comp(prompt="a", tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "only supported on /v1/chat/completions", "tools"),
    ("response_format type", chat(response_format={"type": "xml"}), 400, "must be one of", "response_format.type"),
    ("response_format schema", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}), 400,
     "cannot be used as a grammar", "response_format.json_schema.schema"),
    ("model not string", chat(model=5), 400, "must be a string", "model"),
    ("prompt too long", comp(prompt="word " * 400), 400, "context holds 256", "prompt"),
    ("chat too long", chat(messages=[{"role": "user", "content": "word " * 400}]), 400, "context holds",
     "messages"),
    ("completion prompt missing", comp(max_tokens=3), 400, "is required", "prompt"),
    ("completion prompt empty", comp(prompt=""), 400, "must not be empty", "prompt"),
    ("token id out of range", comp(prompt=[1, 99999]), 400, "outside the vocabulary", "prompt[1]"),
    ("token id negative", comp(prompt=[-1]), 400, "outside the vocabulary", "prompt[0]"),
    ("token id boolean", comp(prompt=[True]), 400, "must be integers", "prompt[0]"),
    ("batched prompts", comp(prompt=["a", "b"]), 400, "batched prompts", "prompt"),
    ("prompt object", comp(prompt={"a": 1}), 400, "string or an array", "prompt"),
    ("echo", comp(prompt="a", echo=True), 400, "not supported", "echo"),
    ("unknown endpoint", rawhttp.request_bytes("GET", "/v1/nope", None, AUTH), 404, "no endpoint", None),
    ("path traversal", rawhttp.request_bytes("GET", "/../../etc/passwd", None, AUTH), 404, "no endpoint", None),
    ("wrong method", rawhttp.request_bytes("GET", CHAT, None, AUTH), 405, "use POST", None),
    ("DELETE models", rawhttp.request_bytes("DELETE", "/v1/models", None, AUTH), 405, "use GET", None),
    ("missing API key", rawhttp.request_bytes("POST", CHAT, json.dumps({"messages": USER}).encode()), 401,
     "API key", None),
    ("wrong API key", rawhttp.request_bytes("GET", "/v1/models", None, {"Authorization": "Bearer nope"}), 401,
     "API key", None),
    ("basic auth", rawhttp.request_bytes("GET", "/props", None, {"Authorization": f"Basic {KEY}"}), 401,
     "API key", None),
    ("garbage request line", b"GARBAGE\r\n\r\n", 400, "malformed request line", None),
    ("HTTP/2.0", head_only(["GET /health HTTP/2.0", "Host: x"]), 505, "not supported", None),
    ("absolute-form target", head_only(["GET http://evil/health HTTP/1.1", "Host: x"]), 400, "absolute path",
     None),
    ("CL and TE", head_only([f"POST {CHAT} HTTP/1.1", "Host: x", "Content-Length: 5", "Transfer-Encoding: chunked"]), 400,
     "both Content-Length and Transfer-Encoding", None),
    ("gzip TE", head_only([f"POST {CHAT} HTTP/1.1", "Host: x", "Transfer-Encoding: gzip"]), 501, "not supported", None),
    ("bad Content-Length", head_only([f"POST {CHAT} HTTP/1.1", "Host: x", "Content-Length: abc"]), 400,
     "malformed Content-Length", None),
    ("conflicting Content-Length", head_only([f"POST {CHAT} HTTP/1.1", "Host: x", "Content-Length: 1", "Content-Length: 2"]),
     400, "repeated content-length headers with different values", None),
    ("folded header", head_only(["GET /health HTTP/1.1", "Host: x", "X-A: 1", " continued"]), 400, "folded", None),
    ("huge header", head_only(["GET /health HTTP/1.1", "Host: x", "X-Big: " + "a" * 40_000]), 431, "larger than", None),
    ("too many headers", head_only(["GET /health HTTP/1.1", "Host: x"] + [f"X-{i}: 1" for i in range(150)]), 431,
     "more than 100", None),
]


@pytest.fixture(scope="module")
def hostile_server():
    with fake_server(api_key=KEY, max_body_bytes=MAX_BODY, n_ctx=256) as s:
        yield s


def test_enough_cases():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,raw,status,message,param", CASES, ids=[c[0] for c in CASES])
def test_hostile_request(hostile_server, name, raw, status, message, param):
    resp = rawhttp.send(hostile_server.url, raw)
    assert resp.status == status, resp.body[:300]
    err = resp.json()["error"]
    assert message in err["message"], err
    assert err["param"] == param
    assert set(err) == {"message", "type", "param", "code"}
    if status == 401:
        assert err["type"] == "authentication_error"
    if status == 405:
        assert resp.headers["allow"] in ("POST", "GET")


def test_server_healthy_and_correct_after_the_table(hostile_server):
    for _, raw, status, _, _ in CASES:          # once more, back to back
        assert rawhttp.send(hostile_server.url, raw).status == status
    assert rawhttp.call(hostile_server.url, "GET", "/health").json()["status"] == "ok"
    good = rawhttp.call(hostile_server.url, "POST", CHAT, {"messages": USER, "max_tokens": 5}, AUTH)
    assert good.status == 200 and good.json()["usage"]["completion_tokens"] == 5
    assert hostile_server.app.in_flight == 0
    assert wait_until(lambda: hostile_server.app.bridge.stats().slots_busy == 0)
    metrics = rawhttp.call(hostile_server.url, "GET", "/metrics").body.decode()
    assert 'luce_http_requests_total{endpoint="/v1/chat/completions",status="400"}' in metrics


def test_body_cut_short_by_a_half_close_gets_400(hostile_server):
    import socket
    with socket.create_connection(rawhttp.address(hostile_server.url), timeout=10) as sock:
        sock.sendall(rawhttp.request_bytes("POST", CHAT, None, {**AUTH, "Content-Length": "100"}) + b'{"a"')
        sock.shutdown(socket.SHUT_WR)
        resp = rawhttp.read_response(sock)
    assert resp.status == 400 and "before the whole request body" in resp.json()["error"]["message"]
    assert rawhttp.call(hostile_server.url, "GET", "/health").status == 200


def test_keep_alive_connection_survives_a_400():
    import socket
    with fake_server() as s, socket.create_connection(rawhttp.address(s.url), timeout=10) as sock:
        bad = b'{"messages": 5}'
        good = json.dumps({"messages": USER, "max_tokens": 2}).encode()
        for body, status in ((bad, 400), (good, 200), (bad, 400), (good, 200)):
            sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: localhost:8080\r\nContent-Length: {len(body)}\r\n"
                         "Content-Type: application/json\r\n\r\n".encode() + body)
            resp = rawhttp.read_response(sock)
            assert resp.status == status and resp.headers["connection"] == "keep-alive"


def test_expect_100_continue_and_chunked_request_body():
    import socket
    with fake_server() as s, socket.create_connection(rawhttp.address(s.url), timeout=10) as sock:
        body = json.dumps({"messages": USER, "max_tokens": 3}).encode()
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                     "Content-Type: application/json\r\n"
                     "Expect: 100-continue\r\n\r\n".encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue")
        half = len(body) // 2
        sock.sendall(b"%x\r\n%s\r\n%x;ext=1\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:]))
        resp = rawhttp.read_response(sock)
        assert resp.status == 200 and resp.json()["usage"]["completion_tokens"] == 3


def test_a_large_body_under_the_limit_is_read_whole():
    with fake_server() as s:     # default limit 4 MiB
        body = json.dumps({"messages": USER, "max_tokens": 2, "ignored_padding": "x" * 3_000_000}).encode()
        resp = rawhttp.send(s.url, rawhttp.request_bytes("POST", CHAT, body))
        assert resp.status == 200 and resp.json()["usage"]["completion_tokens"] == 2
