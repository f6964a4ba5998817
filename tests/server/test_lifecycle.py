"""Disconnects free slots, a full queue answers 429, shutdown drains in-flight requests."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.server import rawhttp
from tests.server.conftest import fake_server, openai_client, wait_until
from tests.server.fake_core import SCRIPTS
from tests.server.rawhttp import open_stream, read_events

CHAT = "/v1/chat/completions"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stream_disconnect_cancels_request_and_frees_slot():
    with fake_server(max_slots=1, step_delay=0.01, script_repeat=100, n_ctx=100_000) as s:
        sock = open_stream(s.url)
        rid = read_events(sock, 3)[0]["id"]
        assert s.app.bridge.stats().slots_busy == 1
        sock.close()
        assert wait_until(lambda: rid in s.core.cancelled and s.app.bridge.stats().slots_busy == 0)
        assert s.app.in_flight == 0 and rid not in s.core.finished
        # the freed slot serves the next request to completion
        r = openai_client(s).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                     max_tokens=4)
        assert r.usage.completion_tokens == 4
        metrics = rawhttp.call(s.url, "GET", "/metrics").body.decode()
        assert 'luce_request_finished_total{reason="cancelled"} 1' in metrics


def test_non_stream_disconnect_cancels_request():
    with fake_server(max_slots=1, step_delay=0.01, script_repeat=100, n_ctx=100_000) as s:
        sock = open_stream(s.url, stream=False)
        assert wait_until(lambda: s.app.bridge.stats().slots_busy == 1)
        sock.close()
        assert wait_until(lambda: len(s.core.cancelled) == 1 and s.app.bridge.stats().slots_busy == 0)
        assert s.core.finished == [] and s.app.in_flight == 0


def test_stream_that_never_starts_still_cancels_its_request():
    import asyncio

    from luce.server.http import EventStream, HTTPConnection

    class BrokenWriter:
        def write(self, data):
            pass

        async def drain(self):
            raise ConnectionResetError("peer gone before the headers went out")

    with fake_server(step_delay=0.01, script_repeat=100, n_ctx=100_000) as s:
        async def scenario():
            body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True}).encode()
            reader = asyncio.StreamReader()
            reader.feed_data(rawhttp.request_bytes("POST", CHAT, body))
            conn = HTTPConnection(reader, BrokenWriter())
            request = await conn.next_request(first=True)
            result = await s.app._dispatch(request)
            assert isinstance(result, EventStream)
            return await s.app._stream(result, conn, True, asyncio.Event(), {})

        assert s.run(scenario()) is False
        # cancelled in the engine, or never admitted to it when the cancel came first
        assert wait_until(lambda: s.app.in_flight == 0 and not s.core.running and not s.core.waiting)
        time.sleep(0.1)
        assert s.core.finished == [] and s.app.bridge.stats().slots_busy == 0


def test_full_queue_gets_429_with_retry_after_then_recovers():
    with fake_server(max_slots=1, max_queue=1, step_delay=0.01, script_repeat=100, n_ctx=100_000) as s:
        busy = [open_stream(s.url, content=f"busy {i}") for i in range(2)]
        try:
            for sock in busy:
                read_events(sock, 1)        # both admitted (one running, one queued)
            assert wait_until(lambda: s.app.bridge.stats().queue_depth == 1)
            resp = rawhttp.call(s.url, "POST", CHAT, {"messages": [{"role": "user", "content": "x"}]})
            assert resp.status == 429 and resp.headers["retry-after"] == "1"
            assert resp.json()["error"]["type"] == "rate_limit_error"
            health = rawhttp.call(s.url, "GET", "/health").json()
            assert health["slots_processing"] == 1 and health["queue_depth"] == 1
        finally:
            for sock in busy:
                sock.close()
        assert wait_until(lambda: s.app.in_flight == 0 and s.app.bridge.stats().slots_busy == 0)
        ok = rawhttp.call(s.url, "POST", CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert ok.status == 200
        metrics = rawhttp.call(s.url, "GET", "/metrics").body.decode()
        assert 'luce_requests_rejected_total{reason="queue_full"} 1' in metrics


def test_stop_drains_in_flight_stream_and_refuses_new_connections():
    with fake_server(step_delay=0.01) as s:
        client = openai_client(s)
        got: dict = {}
        first = threading.Event()

        def stream():
            parts = []
            for ch in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "drain"}],
                                                     stream=True):
                first.set()
                if ch.choices and ch.choices[0].delta.content:
                    parts.append(ch.choices[0].delta.content)
                if ch.choices and ch.choices[0].finish_reason:
                    got["finish"] = ch.choices[0].finish_reason
            got["text"] = "".join(parts)

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(10)
        s.stop()                      # drains: returns once the stream has finished
        t.join(10)
        assert got.get("finish") == "stop" and got["text"] in SCRIPTS
        with pytest.raises(OSError):
            socket.create_connection(rawhttp.address(s.url), timeout=2).close()


def test_sigterm_drains_then_exits_cleanly():
    proc = subprocess.Popen([sys.executable, "-m", "tests.server.fake_serve_main", "0.02"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY "), line + proc.stderr.read()
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        sock = open_stream(url)
        read_events(sock, 2)
        proc.send_signal(signal.SIGTERM)
        buf = b""
        while not buf.endswith(b"0\r\n\r\n"):     # the stream runs to its end despite SIGTERM
            data = sock.recv(65536)
            assert data, f"stream cut: {buf[-200:]!r}"
            buf += data
        sock.close()
        assert b"data: [DONE]" in buf and b'"finish_reason": "stop"' in buf
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "EXIT 0" in out, err
        assert "draining" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
