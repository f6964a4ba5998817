"""Raw-socket HTTP for tests that send what no well-behaved client would."""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def request_bytes(method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                  close: bool = True, content_type: str | None = "application/json") -> bytes:
    """A request; a POST says its body is `content_type` unless `headers` names one (None: no header)."""
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"] + (["Connection: close"] if close else [])
    hdrs = dict(headers or {})
    if method == "POST" and content_type and not any(k.lower() == "content-type" for k in hdrs):
        hdrs["Content-Type"] = content_type
    if body is not None and "Content-Length" not in hdrs and "Transfer-Encoding" not in hdrs:
        hdrs["Content-Length"] = str(len(body))
    head += [f"{k}: {v}" for k, v in hdrs.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")


def read_response(sock: socket.socket) -> RawResponse:
    """Read one response (Content-Length or until close; chunked bodies are de-chunked)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"connection closed before a response head: {buf!r}")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            data = sock.recv(65536)
            if not data:
                break
            rest += data
        return RawResponse(status, headers, rest[:n])
    while True:
        data = sock.recv(65536)
        if not data:
            break
        rest += data
    if headers.get("transfer-encoding") == "chunked":
        rest = dechunk(rest)
    return RawResponse(status, headers, rest)


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return out


def send(url: str, raw: bytes, timeout: float = 20.0) -> RawResponse:
    with socket.create_connection(address(url), timeout=timeout) as sock:
        sock.sendall(raw)
        return read_response(sock)


def call(url: str, method: str, path: str, body=None, headers: dict | None = None,
         timeout: float = 20.0) -> RawResponse:
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return send(url, request_bytes(method, path, body, headers), timeout)


def open_stream(url: str, content="go", stream=True, **fields) -> socket.socket:
    """Send a chat request (streaming unless told) and return the open socket, unread."""
    body = json.dumps({"messages": [{"role": "user", "content": content}], "stream": stream,
                       "temperature": 0, **fields}).encode()
    sock = socket.create_connection(address(url), timeout=10)
    sock.sendall(request_bytes("POST", "/v1/chat/completions", body, close=False))
    return sock


def read_events(sock: socket.socket, n: int) -> list[dict]:
    """Read until n SSE data events arrived (chunk framing ignored: events are small)."""
    buf = b""
    while buf.count(b"data: ") < n:
        data = sock.recv(4096)
        assert data, "stream ended early"
        buf += data
    events = []
    for part in buf.split(b"data: ")[1:n + 1]:
        payload = part.split(b"\n\n")[0]
        events.append(json.loads(payload))
    return events
