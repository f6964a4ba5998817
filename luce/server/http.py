"""HTTP/1.1 over asyncio streams, parsed by h11 (a maintained sans-IO parser).

`HTTPConnection` reads requests and writes responses on one client connection:

    conn = HTTPConnection(reader, writer, limits)
    request = await conn.next_request()          # None: the client closed or stayed idle
    await conn.send(Response.json({...}), keep_alive=True)
    # or, for server-sent events:
    await conn.start_stream(headers); await conn.send_event("..."); await conn.end_stream()

h11 does the RFC 9112 grammar (request line, header syntax, Content-Length digits, chunk
sizes, the Host header HTTP/1.1 requires). On top of it this module refuses what could smuggle
a second request past a proxy (both Content-Length and Transfer-Encoding, folded headers,
repeated Authorization), bodies over the limit (413 before they are read), heads over 32 KiB or
100 headers (431), HTTP versions other than 1.x (505), and heads that trickle in slower than
`head_timeout_s` (the connection is closed).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qs, unquote

import h11

from luce.server.errors import APIError, payload_too_large

MAX_HEAD_BYTES = 32 * 1024       # request line + headers
MAX_HEADERS = 100
READ_SIZE = 65536


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
    client: str = ""                 # peer address
    usage: tuple[int, int] | None = None   # (prompt, completion) tokens, for the access log

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
    """A handler's streamed answer: each item is sent as one SSE event. A str or dict item is
    a `data:` line (dicts as JSON); a (name, dict) pair is an `event: name` event (Anthropic).

    The server closes `events` (aclose) when the client goes away, so its `finally` runs.
    `on_expire()` (if given) returns the last items to send when the drain timeout cuts the
    stream short (an error event, then the end marker)."""
    events: object                   # AsyncIterator[dict | str | tuple[str, dict]]
    headers: dict[str, str] = field(default_factory=dict)
    on_close: object = None          # called once the stream is over, even if it never started
    on_expire: object = None         # () -> list of items


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 * 1024 * 1024
    keep_alive_s: float = 60.0       # idle time allowed before the next request's first byte
    head_timeout_s: float = 10.0     # a request head must be complete this long after its first byte
    write_timeout_s: float = 60.0    # a client that reads nothing this long is dropped


# h11's message prefixes -> (status, a message that names the problem and the fix)
_H11_MESSAGES = {
    "illegal request line": (400, "malformed request line {line!r}: expected 'METHOD /path HTTP/1.1'"),
    "Missing mandatory Host": (400, "HTTP/1.1 requests must carry a Host header"),
    "Found multiple Host": (400, "repeated host header"),
    "bad Content-Length": (400, "malformed Content-Length: it must be decimal digits (0-9)"),
    "conflicting Content-Length": (400, "repeated content-length headers with different values"),
    "Only Transfer-Encoding: chunked": (501, "Transfer-Encoding is not supported except chunked; "
                                             "use chunked or Content-Length"),
    "multiple Transfer-Encoding": (501, "repeated Transfer-Encoding is not supported; send one: chunked"),
    "illegal header line": (400, "malformed header line"),
    "illegal chunk header": (400, "malformed chunk size line: a chunk size is hexadecimal digits only"),
}


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("latin-1")
    except ValueError:
        return b"Unknown"


def _split_target(target: str) -> tuple[str, dict]:
    """(percent-decoded path, query). Never interprets `//host/...` as an authority: the path is
    what was sent, so `//evil.example/health` is not /health."""
    path, _, query = target.partition("?")
    return unquote(path), parse_qs(query)


def _keep_alive(version: str, headers: dict[str, str]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _head_of(buffer: bytes) -> bytes:
    start = len(buffer) - len(buffer.lstrip(b"\r\n"))
    end = buffer.find(b"\r\n\r\n", start)
    return buffer[start:end if end >= 0 else len(buffer)]


class HTTPConnection:
    """One client connection: requests in, responses out (not thread-safe; one task uses it)."""

    def __init__(self, reader: asyncio.StreamReader, writer, limits: Limits = Limits(), client: str = ""):
        self.reader = reader
        self.writer = writer
        self.limits = limits
        self.client = client
        self.idle = True             # waiting for a request with no byte of it received yet
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._head = bytearray()     # raw head bytes of the request being read (fold check)
        self._stream_keep = False

    # ------------------------------------------------------------------ reading

    async def next_request(self, first: bool = False) -> Request | None:
        """The next request, or None when the client closes or stays idle past keep_alive_s.
        Raises ProtocolError (answer, then close) or APIError 413."""
        loop = asyncio.get_running_loop()
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        self.idle = True
        self._head.clear()
        started = None               # when the head's first non-blank byte came
        deadline = loop.time() + (self.limits.head_timeout_s if first else self.limits.keep_alive_s)
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as e:
                raise self._protocol_error(e) from None
            if event is h11.NEED_DATA:
                data = await self._read(deadline - loop.time(), idle=started is None, what="request head",
                                        limit=self.limits.head_timeout_s)
                if data is None:
                    return None
                if started is None and data.strip(b"\r\n"):
                    started = loop.time()
                    deadline = min(deadline, started + self.limits.head_timeout_s)
                    self.idle = False
                if len(self._head) <= MAX_HEAD_BYTES:
                    self._head += data
                    if len(_head_of(bytes(self._head))) > MAX_HEAD_BYTES:
                        raise ProtocolError(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
                self._h11.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                self.idle = False
                request = self._request(event, loop.time())
                request.body = await self._body(request)
                return request
            raise ProtocolError(400, f"unexpected {type(event).__name__} before a request")

    async def _read(self, timeout: float, idle: bool, what: str, limit: float) -> bytes | None:
        """Bytes from the client; b"" at EOF (h11 sees it); None when an idle wait times out."""
        try:
            return await asyncio.wait_for(self.reader.read(READ_SIZE), max(timeout, 0.0))
        except asyncio.TimeoutError:
            if idle:
                return None
            raise ProtocolError(408, f"the {what} did not arrive within {limit:g} s: send it whole, "
                                     "without pauses") from None

    def _protocol_error(self, e: h11.RemoteProtocolError) -> ProtocolError:
        message = str(e) or "malformed HTTP request"
        status = e.error_status_hint
        if status == 431 or "too long" in message or "exceeds" in message:
            return ProtocolError(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
        for prefix, (code, better) in _H11_MESSAGES.items():
            if message.startswith(prefix):
                line = _head_of(bytes(self._head)).split(b"\r\n", 1)[0]
                return ProtocolError(code, better.format(line=line[:100]))
        return ProtocolError(status if status in (400, 501, 505) else 400, message)

    def _request(self, event: h11.Request, now: float) -> Request:
        head = _head_of(bytes(self._head))
        if b"\r\n " in head or b"\r\n\t" in head:
            raise ProtocolError(400, "folded (obsolete line-continued) headers are not accepted")
        version = "HTTP/" + event.http_version.decode("ascii", "replace")
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise ProtocolError(505, f"{version[:20]} is not supported; use HTTP/1.1")
        if len(event.headers) > MAX_HEADERS:
            raise ProtocolError(431, f"more than {MAX_HEADERS} request headers")
        method = event.method.decode("ascii", "replace").upper()
        target = event.target.decode("latin-1")
        if not target.startswith("/") and not (method == "OPTIONS" and target == "*"):
            raise ProtocolError(400, f"request target must be an absolute path, got {target[:100]!r}")
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            if key in headers:
                if key in ("authorization", "x-api-key", "content-type"):
                    raise ProtocolError(400, f"repeated {key} header")
                headers[key] += ", " + text
            else:
                headers[key] = text
        if "transfer-encoding" in headers and "content-length" in headers:
            raise ProtocolError(400, "both Content-Length and Transfer-Encoding given")
        path, query = _split_target(target)
        return Request(method=method, target=target, path=path, query=query, version=version, headers=headers,
                       keep_alive=_keep_alive(version, headers), received_at=now, client=self.client)

    async def _body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and int(length) > limit:
            raise payload_too_large(limit)
        if self._h11.they_are_waiting_for_100_continue:
            self.writer.write(self._h11.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")))
        loop = asyncio.get_running_loop()
        body = bytearray()
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as e:
                raise self._protocol_error(e) from None
            if event is h11.NEED_DATA:
                data = await self._read(self.limits.keep_alive_s, idle=False, what="request body",
                                        limit=self.limits.keep_alive_s)
                self._h11.receive_data(data)
                if not data and self._h11.their_state is h11.SEND_BODY:
                    raise ProtocolError(400, "connection closed before the whole request body arrived")
                continue
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise payload_too_large(limit)
            elif isinstance(event, h11.EndOfMessage):
                request.received_at = loop.time()
                return bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise ProtocolError(400, "connection closed before the whole request body arrived")

    # ------------------------------------------------------------------ writing

    def _response_event(self, status: int, headers: dict[str, str], keep_alive: bool) -> h11.Response:
        items = [("Server", "luce"), ("Date", formatdate(usegmt=True))]
        items += [(k, v) for k, v in headers.items() if k.lower() != "connection"]
        items.append(("Connection", "keep-alive" if keep_alive else "close"))
        return h11.Response(status_code=status, headers=items, reason=_reason(status))

    async def send(self, resp: Response, keep_alive: bool, head_only: bool = False) -> None:
        """A whole response. Before any request was read (an early refusal) it is written raw."""
        headers = {"Content-Type": resp.content_type, "Content-Length": str(len(resp.body)), **resp.headers}
        if self._h11.their_state is h11.IDLE or self._h11.our_state is not h11.SEND_RESPONSE:
            self.writer.write(raw_response(resp, keep_alive=False, head_only=head_only))
        else:
            out = self._h11.send(self._response_event(resp.status, headers, keep_alive))
            if resp.body and not head_only:
                out += self._h11.send(h11.Data(data=resp.body))
            out += self._h11.send(h11.EndOfMessage())
            self.writer.write(out)
        await self._drain()

    async def start_stream(self, headers: dict[str, str], keep_alive: bool) -> None:
        base = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no"}
        self.writer.write(self._h11.send(self._response_event(200, {**base, **headers}, keep_alive)))
        await self._drain()

    async def send_event(self, item) -> None:
        """One SSE event: str -> `data: str`; dict -> `data: json`; (name, dict) -> named event."""
        if isinstance(item, tuple):
            name, obj = item
            payload = f"event: {name}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"
        else:
            data = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
            payload = f"data: {data}\n\n"
        self.writer.write(self._h11.send(h11.Data(data=payload.encode("utf-8"))))
        await self._drain()

    async def end_stream(self) -> None:
        self.writer.write(self._h11.send(h11.EndOfMessage()))
        await self._drain()

    @property
    def reusable(self) -> bool:
        """Whether another request may follow on this connection."""
        return self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE

    async def _drain(self) -> None:
        await asyncio.wait_for(self.writer.drain(), self.limits.write_timeout_s)


def raw_response(resp: Response, keep_alive: bool = False, head_only: bool = False) -> bytes:
    """A response written without a parsed request (refusals before or instead of one)."""
    headers = {"Content-Type": resp.content_type, "Content-Length": str(len(resp.body)), **resp.headers}
    lines = [f"HTTP/1.1 {resp.status} {_reason(resp.status).decode()}", "Server: luce",
             f"Date: {formatdate(usegmt=True)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else resp.body)
