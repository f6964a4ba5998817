"""CORS, the JSON Content-Type rule and the Host allow-list (DNS rebinding), over raw HTTP."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from luce.server.browser import BrowserPolicy, host_name
from tests.server import rawhttp
from tests.server.conftest import fake_server
from tests.server.test_cli import ROOT

CHAT = "/v1/chat/completions"
BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
SITE = "http://localhost:3000"


def request(method, path, headers, body=None, content_type="application/json"):
    lines = [f"{method} {path} HTTP/1.1", "Connection: close"] + [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}")
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


@pytest.fixture(scope="module")
def cors_server():
    with fake_server(cors_origins=(SITE,)) as s:
        yield s


def test_preflight_from_an_allowed_origin_is_answered_with_the_cors_headers(cors_server):
    resp = rawhttp.send(cors_server.url, request("OPTIONS", CHAT, {
        "Host": "127.0.0.1", "Origin": SITE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"}))
    assert resp.status == 204
    assert resp.headers["access-control-allow-origin"] == SITE
    assert "POST" in resp.headers["access-control-allow-methods"]
    assert resp.headers["access-control-allow-headers"] == "content-type, authorization"
    assert resp.headers["vary"] == "Origin"


def test_answers_carry_the_cors_header_only_for_allowed_origins(cors_server):
    ok = rawhttp.send(cors_server.url, request("POST", CHAT, {"Host": "127.0.0.1", "Origin": SITE}, BODY))
    assert ok.status == 200 and ok.headers["access-control-allow-origin"] == SITE
    other = rawhttp.send(cors_server.url, request("POST", CHAT, {"Host": "127.0.0.1", "Origin": "http://evil.example"},
                                                  BODY))
    assert other.status == 200 and "access-control-allow-origin" not in other.headers
    pre = rawhttp.send(cors_server.url, request("OPTIONS", CHAT, {"Host": "127.0.0.1", "Origin": "http://evil.example",
                                                                  "Access-Control-Request-Method": "POST"}))
    assert pre.status == 204 and "access-control-allow-origin" not in pre.headers and "POST" in pre.headers["allow"]


def test_no_cors_headers_by_default_and_wildcard_when_asked():
    with fake_server() as s:
        resp = rawhttp.send(s.url, request("OPTIONS", CHAT, {"Host": "127.0.0.1", "Origin": SITE}))
        assert resp.status == 204 and "access-control-allow-origin" not in resp.headers
    with fake_server(cors_origins=("*",)) as s:
        resp = rawhttp.send(s.url, request("GET", "/v1/models", {"Host": "127.0.0.1", "Origin": SITE}))
        assert resp.status == 200 and resp.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_post_without_a_json_content_type_is_415_and_not_run(cors_server, content_type):
    steps = cors_server.core.steps
    resp = rawhttp.send(cors_server.url, request("POST", CHAT, {"Host": "127.0.0.1"}, BODY, content_type))
    assert resp.status == 415
    message = resp.json()["error"]["message"]
    assert "Content-Type: application/json" in message
    assert ("missing" in message) if content_type is None else (content_type.split(";")[0] in message)
    assert cors_server.core.steps == steps


def test_json_content_type_with_a_charset_is_accepted(cors_server):
    resp = rawhttp.send(cors_server.url, request("POST", CHAT, {"Host": "127.0.0.1"}, BODY,
                                                 "Application/JSON; charset=utf-8"))
    assert resp.status == 200


@pytest.mark.parametrize("host,status", [("localhost:8080", 200), ("127.0.0.1", 200), ("[::1]:8080", 200),
                                         ("app.localhost", 200), ("evil.example", 403),
                                         ("evil.example:8080", 403), ("127.0.0.1.evil.example", 403)])
def test_keyless_loopback_server_answers_loopback_hosts_only(cors_server, host, status):
    resp = rawhttp.send(cors_server.url, request("GET", "/v1/models", {"Host": host}))
    assert resp.status == status
    if status == 403:
        err = resp.json()["error"]
        assert "--allowed-hosts" in err["message"] and err["code"] == "host_not_allowed"


def test_host_check_is_off_with_an_api_key_and_extended_by_allowed_hosts():
    with fake_server(api_key="k") as s:
        resp = rawhttp.send(s.url, request("GET", "/v1/models", {"Host": "box.lan", "Authorization": "Bearer k"}))
        assert resp.status == 200
    with fake_server(allowed_hosts=("box.lan",)) as s:
        assert rawhttp.send(s.url, request("GET", "/v1/models", {"Host": "box.lan:8080"})).status == 200
        assert rawhttp.send(s.url, request("GET", "/v1/models", {"Host": "other.lan"})).status == 403
    with fake_server(allowed_hosts=("*",)) as s:
        assert rawhttp.send(s.url, request("GET", "/v1/models", {"Host": "other.lan"})).status == 200


def test_policy_helpers():
    assert host_name("LocalHost:80") == "localhost" and host_name("[::1]:1") == "::1" and host_name("::1") == "::1"
    assert BrowserPolicy.for_server("0.0.0.0", None).allowed_hosts is None      # not loopback: no check
    assert BrowserPolicy.for_server("127.0.0.1", "key").allowed_hosts is None


@pytest.mark.parametrize("flags,message", [
    (["--port", "70000"], "--port must be 0..65535"),
    (["--port", "-1"], "--port must be 0..65535"),
    (["--max-body-bytes", "-1"], "--max-body-bytes must be >= 1"),
    (["--port", "abc"], "invalid int value: 'abc'"),
    (["--cors-origins", "localhost:3000"], "is not an origin"),
])
def test_bad_flags_give_one_line_and_exit_2(flags, message):
    run = subprocess.run([sys.executable, "-m", "luce.server.serve_cli", "tiny.gguf", *flags], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
