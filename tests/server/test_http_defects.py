"""Regression tests for the HTTP defects found with raw sockets (issue 16): each once crashed the
connection handler, was accepted although malformed, or let idle clients lock others out."""
from __future__ import annotations

import json
import socket
import threading

import pytest

from tests.server import rawhttp
from tests.server.conftest import fake_server, wait_until

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hello"}]


def raw(lines: list[str], body: bytes = b"") -> bytes:
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


@pytest.fixture(scope="module")
def server():
    with fake_server() as s:
        yield s


def test_bracket_in_the_path_is_a_404_not_a_crash(server):
    resp = rawhttp.send(server.url, raw(["GET //[/health HTTP/1.1", "Host: 127.0.0.1"]))
    assert resp.status == 404 and "//[/health" in resp.json()["error"]["message"]


def test_a_path_that_looks_like_an_authority_is_not_served_as_its_tail(server):
    resp = rawhttp.send(server.url, raw(["GET //evil.example/health HTTP/1.1", "Host: 127.0.0.1"]))
    assert resp.status == 404
    assert rawhttp.send(server.url, raw(["GET /health HTTP/1.1", "Host: 127.0.0.1"])).status == 200


def test_non_ascii_digit_content_length_is_a_400_not_a_crash(server):
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \xb2\r\n\r\nab"
    resp = rawhttp.send(server.url, head)
    assert resp.status == 400 and "Content-Length" in resp.json()["error"]["message"]


@pytest.mark.parametrize("size", ["0x2", "0_2", "+2", "-2", " 2x"])
def test_malformed_chunk_sizes_are_refused(server, size):
    body = f"{size}\r\n{{}}\r\n0\r\n\r\n".encode()
    resp = rawhttp.send(server.url, raw([f"POST {CHAT} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
                                         "Transfer-Encoding: chunked"], body))
    assert resp.status == 400 and "chunk size" in resp.json()["error"]["message"]


def test_http11_without_host_is_refused_and_http10_without_host_is_served(server):
    resp = rawhttp.send(server.url, raw(["GET /health HTTP/1.1"]))
    assert resp.status == 400 and "Host header" in resp.json()["error"]["message"]
    assert rawhttp.send(server.url, raw(["GET /health HTTP/1.0"])).status == 200


def test_the_server_answers_correctly_after_the_defects(server):
    good = rawhttp.call(server.url, "POST", CHAT, {"messages": USER, "max_tokens": 3})
    assert good.status == 200 and good.json()["usage"]["completion_tokens"] == 3


def _idle_connection(url) -> socket.socket:
    sock = socket.create_connection(rawhttp.address(url), timeout=10)
    sock.sendall(rawhttp.request_bytes("GET", "/health", close=False))
    assert rawhttp.read_response(sock).status == 200        # now idle between requests
    return sock


def test_idle_connections_cannot_lock_clients_out():
    with fake_server(max_connections=8, max_connections_per_client=8) as s:
        idle = [_idle_connection(s.url) for _ in range(8)]
        newcomers = [_idle_connection(s.url) for _ in range(8)]   # each takes an idle one's place
        try:
            assert s.app._table.evicted == 8
            assert all(sock.recv(1) == b"" for sock in idle)        # the server closed the old ones
            for sock in newcomers:                                   # and the newcomers still work
                sock.sendall(rawhttp.request_bytes("GET", "/health", close=False))
                assert rawhttp.read_response(sock).status == 200
        finally:
            for sock in idle + newcomers:
                sock.close()


def test_half_sent_heads_are_closed_and_busy_clients_are_refused_at_their_limit():
    with fake_server(max_connections_per_client=3, head_timeout_s=0.5) as s:
        slow = []
        for _ in range(3):
            sock = socket.create_connection(rawhttp.address(s.url), timeout=10)
            sock.sendall(b"GET /heal")              # a head that never completes
            slow.append(sock)
        assert wait_until(lambda: len(s.app._table) == 3)
        refused = rawhttp.call(s.url, "GET", "/health")
        assert refused.status == 503 and "limit is 3" in refused.json()["error"]["message"]
        for sock in slow:               # each is closed with a 408 once its head is overdue
            resp = rawhttp.read_response(sock)
            assert resp.status == 408 and "did not arrive" in resp.json()["error"]["message"]
            sock.close()
        assert wait_until(lambda: len(s.app._table) == 0)
        assert rawhttp.call(s.url, "GET", "/health").status == 200


def test_drain_timeout_ends_streams_with_an_error_then_done_and_others_with_503():
    with fake_server(max_slots=2, step_delay=0.01, script_repeat=200, n_ctx=100_000, drain_timeout_s=0.3) as s:
        stream = rawhttp.open_stream(s.url, content="long one")
        rawhttp.read_events(stream, 2)
        plain = rawhttp.open_stream(s.url, content="long two", stream=False)
        assert wait_until(lambda: s.app.bridge.stats().slots_busy == 2)
        stopper = threading.Thread(target=s.stop)
        stopper.start()
        buf = b""
        while True:
            data = stream.recv(65536)
            if not data:
                break
            buf += data
        answer = rawhttp.read_response(plain)
        stopper.join(30)
        stream.close()
        plain.close()
    events = [part.split(b"\n\n")[0] for part in buf.split(b"data: ")[1:]]
    assert events[-1] == b"[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "unavailable" and "shut down" in error["message"]
    assert answer.status == 503 and "shut down" in answer.json()["error"]["message"]
