"""A small HTTP/1.1 server-side parser and response writer over asyncio streams.

Enough of RFC 9112 for API clients (curl, httpx/openai, requests, browsers): request line,
headers, Content-Length or chunked bodies (with `Expect: 100-continue`), keep-alive, and
chunked responses for server-sent events. Anything ambiguous that could smuggle a second
request (both Content-Length and Transfer-Encoding, conflicting lengths, folded headers)
is rejected with 400 and the connection closed.
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

from luce.server.errors import APIError, payload_too_large

MAX_HEAD_BYTES = 32 * 1024       # request line + headers
MAX_HEADERS = 100
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_CHUNK_LINE_MAX = 1024


class ProtocolError(APIError):
    """The bytes on the wire are not a request we can answer; the connection is closed after."""

    def __init__(self, status: int, message: str):
        super().__init__(status, message, code="bad_http_request")


@dataclass
class Request:
    method: str
    target: str                      # as sent: "/v1/models?x=1"
    path: str                        # percent-decoded path without the query
    query: dict[str, list[str]]
    version: str                     # "HTTP/1.1"
    headers: dict[str, str]          # lower-case names; repeated headers joined with ", "
    body: bytes = b""
    keep_alive: bool = True
    received_at: float = 0.0         # loop.time() when the head was complete

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, obj, status: int = 200, headers: dict[str, str] | None = None) -> "Response":
        return cls(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), headers=dict(headers or {}))

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> "Response":
        return cls(status, text.encode("utf-8"), content_type)

    @classmethod
    def error(cls, err: APIError) -> "Response":
        return cls(err.status, err.body_bytes(), headers=dict(err.headers))


@dataclass
class EventStream:
    """A handler's streamed answer: each item is sent as one SSE `data:` event (dicts as JSON).

    The server closes `events` (aclose) when the client goes away, so its `finally` runs."""
    events: object                   # AsyncIterator[dict | str]
    headers: dict[str, str] = field(default_factory=dict)
    on_close: object = None          # called once the stream is over, even if it never started


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def response_head(status: int, headers: dict[str, str], keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_reason(status)}", "Server: luce", f"Date: {formatdate(usegmt=True)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def response_bytes(resp: Response, keep_alive: bool, head_only: bool = False) -> bytes:
    headers = {"Content-Type": resp.content_type, "Content-Length": str(len(resp.body)), **resp.headers}
    return response_head(resp.status, headers, keep_alive) + (b"" if head_only else resp.body)


# ---------------------------------------------------------------------------- parsing

def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise ProtocolError(400, "request head is not latin-1 text")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise ProtocolError(400, f"malformed request line {lines[0][:100]!r}: expected 'METHOD /path HTTP/1.1'")
    method, target, version = parts
    if not _TOKEN.match(method):
        raise ProtocolError(400, f"malformed method {method[:40]!r}")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if version.startswith("HTTP/"):
            raise ProtocolError(505, f"{version[:20]} is not supported; use HTTP/1.1")
        raise ProtocolError(400, f"malformed request line {lines[0][:100]!r}: expected 'METHOD /path HTTP/1.1'")
    if not target.startswith("/") and not (method == "OPTIONS" and target == "*"):
        raise ProtocolError(400, f"request target must be an absolute path, got {target[:100]!r}")
    headers: dict[str, str] = {}
    header_lines = [ln for ln in lines[1:] if ln]
    if len(header_lines) > MAX_HEADERS:
        raise ProtocolError(431, f"more than {MAX_HEADERS} request headers")
    for line in header_lines:
        if line[0] in " \t":
            raise ProtocolError(400, "folded (obsolete line-continued) headers are not accepted")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise ProtocolError(400, f"malformed header line {line[:100]!r}")
        name = name.lower()
        value = value.strip(" \t")
        if name in headers:
            if name in ("content-length", "host", "authorization", "transfer-encoding"):
                if name == "content-length" and headers[name] == value:
                    continue
                raise ProtocolError(400, f"repeated {name} header")
            headers[name] = headers[name] + ", " + value
        else:
            headers[name] = value
    return method, target, version, headers


def _keep_alive(version: str, headers: dict[str, str]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


async def _read_chunked(reader: asyncio.StreamReader, max_body: int) -> bytes:
    body = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        if len(line) > _CHUNK_LINE_MAX:
            raise ProtocolError(400, "chunk size line too long")
        size_text = line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError(400, f"malformed chunk size {size_text[:20]!r}")
        if size < 0:
            raise ProtocolError(400, "negative chunk size")
        if size == 0:
            break
        if len(body) + size > max_body:
            raise payload_too_large(max_body)
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise ProtocolError(400, "chunk not followed by CRLF")
    for _ in range(MAX_HEADERS + 1):  # trailers, ignored
        if await reader.readuntil(b"\r\n") == b"\r\n":
            return bytes(body)
    raise ProtocolError(400, "too many chunked trailers")


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       max_body: int) -> Request | None:
    """The next request on the connection, or None at a clean end of stream.

    Raises ProtocolError (close after answering) or APIError 413 for an oversized body."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise ProtocolError(400, "connection closed in the middle of the request head")
    except asyncio.LimitOverrunError:
        raise ProtocolError(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
    if len(head) > MAX_HEAD_BYTES:
        raise ProtocolError(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
    received_at = asyncio.get_running_loop().time()
    method, target, version, headers = _parse_head(head[:-4].lstrip(b"\r\n"))
    split = urlsplit(target)
    request = Request(method=method.upper(), target=target, path=unquote(split.path or "/"),
                      query=parse_qs(split.query), version=version, headers=headers,
                      keep_alive=_keep_alive(version, headers), received_at=received_at)
    te = headers.get("transfer-encoding")
    cl = headers.get("content-length")
    if te is not None and cl is not None:
        raise ProtocolError(400, "both Content-Length and Transfer-Encoding given")
    if te is not None and te.strip().lower() != "chunked":
        raise ProtocolError(501, f"Transfer-Encoding {te[:40]!r} is not supported; use chunked or Content-Length")
    length = 0
    if cl is not None:
        if not cl.isdigit():
            raise ProtocolError(400, f"malformed Content-Length {cl[:40]!r}")
        length = int(cl)
        if length > max_body:
            raise payload_too_large(max_body)
    if (length or te) and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    try:
        if te is not None:
            request.body = await _read_chunked(reader, max_body)
        elif length:
            request.body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ProtocolError(400, "connection closed before the whole request body arrived")
    except asyncio.LimitOverrunError:
        raise ProtocolError(400, "malformed chunked body")
    return request


# ---------------------------------------------------------------------------- SSE

class EventStreamWriter:
    """Server-sent events over a chunked HTTP/1.1 response (`data: ...\\n\\n` per event)."""

    def __init__(self, writer: asyncio.StreamWriter, keep_alive: bool, write_timeout: float):
        self.writer = writer
        self.keep_alive = keep_alive
        self.write_timeout = write_timeout

    async def start(self, headers: dict[str, str] | None = None) -> None:
        base = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no", "Transfer-Encoding": "chunked"}
        self.writer.write(response_head(200, {**base, **(headers or {})}, self.keep_alive))
        await self._drain()

    async def send(self, data: str) -> None:
        payload = f"data: {data}\n\n".encode("utf-8")
        self.writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        await self._drain()

    async def send_json(self, obj) -> None:
        await self.send(json.dumps(obj, ensure_ascii=False))

    async def finish(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self._drain()

    async def _drain(self) -> None:
        await asyncio.wait_for(self.writer.drain(), self.write_timeout)
