"""A streaming OpenAI-compatible client on asyncio sockets (standard library only).

    endpoint = Endpoint("http://127.0.0.1:8080", api="completions")
    record = await stream_request(endpoint, prompt, max_tokens=128)

Every request is greedy (temperature 0, fixed seed) and asks the server to ignore EOS and to
produce exactly `max_tokens` tokens (`ignore_eos` for llama-server, vLLM and luce-serve;
`min_tokens` for vLLM). `stream_options.include_usage` asks for the token counts. Fields
`extra_body` sets override these (a value of None removes the field). One connection per
request (`Connection: close`), so concurrent requests never queue behind each other in the
client. Chunked and length-delimited bodies are both understood; SSE events are parsed as
they arrive and each text-carrying event is timestamped when its bytes were read.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from luce.benchmark.prompts import Prompt
from luce.benchmark.records import RequestRecord

MAX_HEAD_BYTES = 64 * 1024


@dataclass
class Endpoint:
    base_url: str                      # "http://host:port" (a trailing /v1 is accepted)
    api: str = "completions"           # "completions" (/v1/completions) | "chat" (/v1/chat/completions)
    model: str | None = None
    api_key: str | None = None
    extra_body: dict = field(default_factory=dict)
    timeout_s: float = 600.0           # one request, connect to last byte

    def __post_init__(self):
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {self.api!r}")
        url = urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"endpoint URL must look like http://host:port, got {self.base_url!r}")

    @property
    def root(self) -> str:
        """The server root: base_url without a trailing '/' or '/v1'."""
        root = self.base_url.rstrip("/")
        return root[:-3] if root.endswith("/v1") else root

    @property
    def path(self) -> str:
        """The request path, under any path prefix of the root (a server behind a proxy)."""
        prefix = urlsplit(self.root).path
        return prefix + ("/v1/chat/completions" if self.api == "chat" else "/v1/completions")


def request_body(endpoint: Endpoint, prompt_text: str, max_tokens: int) -> dict:
    """The JSON body for one greedy, EOS-ignoring, exactly-`max_tokens` streamed request."""
    body: dict = {
        "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0.0, "seed": 0,
    }
    if endpoint.model is not None:
        body["model"] = endpoint.model
    if endpoint.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt_text}]
    else:
        body["prompt"] = prompt_text
    body.update(endpoint.extra_body)
    return {k: v for k, v in body.items() if v is not None}


class _SSEParser:
    """Bytes in, complete SSE `data` payloads out (events end at a blank line)."""

    def __init__(self):
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        events = []
        while True:
            nl = self._buffer.find(b"\n")
            if nl < 0:
                return events
            line = self._buffer[:nl].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[nl + 1:]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
            # "event:", "id:", "retry:" and ":" comments carry nothing we use

    def close(self) -> list[str]:
        events = self.feed(b"\n\n") if self._buffer or self._data else []
        return events


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[str, str]):
    """The response body as it arrives: chunked, Content-Length, or until EOF."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                raise ConnectionError("connection closed before Content-Length bytes arrived")
            left -= len(data)
            yield data
    else:
        while data := await reader.read(65536):
            yield data


def _apply_event(record: RequestRecord, payload: str, now: float, api: str) -> bool:
    """Record one SSE payload; returns True at [DONE]."""
    if payload.strip() == "[DONE]":
        return True
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        record.error = f"malformed SSE payload: {payload[:200]!r}"
        return True
    if not isinstance(event, dict):
        return False
    if event.get("error"):
        err = event["error"]
        record.error = "server error: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
        return True
    usage = event.get("usage")
    if isinstance(usage, dict):
        record.completion_tokens = usage.get("completion_tokens", record.completion_tokens)
        record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
    for choice in event.get("choices") or ():
        if api == "chat":   # reasoning servers stream thinking tokens in a field of their own
            delta = choice.get("delta") or {}
            text = "".join(delta.get(k) or "" for k in ("reasoning_content", "reasoning", "content"))
        else:
            text = choice.get("text") or ""
        if text:
            record.chunk_times.append(now)
            record.chunk_texts.append(text)
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    return False


async def _exchange(endpoint: Endpoint, body: bytes, record: RequestRecord) -> None:
    url = urlsplit(endpoint.root)
    tls = ssl.create_default_context() if url.scheme == "https" else None
    port = url.port or (443 if tls else 80)
    reader, writer = await asyncio.open_connection(url.hostname, port, ssl=tls, limit=MAX_HEAD_BYTES)
    try:
        head = [f"POST {endpoint.path} HTTP/1.1", f"Host: {url.netloc}", "Content-Type: application/json",
                "Accept: text/event-stream", f"Content-Length: {len(body)}", "Connection: close"]
        if endpoint.api_key:
            head.append(f"Authorization: Bearer {endpoint.api_key}")
        record.send_time = time.perf_counter()
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ConnectionError(f"not an HTTP response: {status_line[:100]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if status != 200:
            raw = b"".join([c async for c in _body_chunks(reader, headers)])
            record.error = f"HTTP {status}: {raw.decode('utf-8', errors='replace')[:500]}"
            return
        parser = _SSEParser()
        async for data in _body_chunks(reader, headers):
            now = time.perf_counter()
            for payload in parser.feed(data):
                if _apply_event(record, payload, now, endpoint.api):
                    return
        for payload in parser.close():
            if _apply_event(record, payload, time.perf_counter(), endpoint.api):
                return
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass


async def stream_request(endpoint: Endpoint, prompt: Prompt, max_tokens: int) -> RequestRecord:
    """Send one streamed request and record its chunks; errors end up in `record.error`."""
    record = RequestRecord(key=f"{prompt.id}|max_tokens={max_tokens}", prompt_id=prompt.id,
                           max_tokens=max_tokens)
    body = json.dumps(request_body(endpoint, prompt.text, max_tokens)).encode("utf-8")
    try:
        await asyncio.wait_for(_exchange(endpoint, body, record), endpoint.timeout_s)
    except asyncio.TimeoutError:
        record.error = f"timed out after {endpoint.timeout_s:g} s"
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
        record.error = f"{type(e).__name__}: {e}"
    record.end_time = time.perf_counter()
    if record.error is None and not record.chunk_times:
        record.error = "the stream ended without any output text"
    return record


def http_get(url: str, timeout_s: float = 5.0, api_key: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET; status 0 with the reason as body when unreachable."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # never via a proxy
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)
