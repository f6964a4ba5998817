"""The HTTP application: connections, routing, authentication, browser policy, drain.

    app = App(ServerConfig(port=8080), bridge)        # bridge may come later: app.set_bridge()
    await app.start()                                  # listening; app.port is the bound port
    await app.drain()                                  # stop listening, finish in-flight requests

Routes: see `App._routes` and docs/SERVER.md (the /v1 prefix is optional on the OpenAI routes,
as in llama-server). One access-log line per answer goes to the `luce.access` logger.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass, field

from luce.server.anthropic_api import Messages
from luce.server.browser import BrowserPolicy, require_json
from luce.server.connections import ConnectionTable
from luce.server.endpoints import Endpoints
from luce.server.errors import (APIError, internal, method_not_allowed, not_found, unauthorized,
                                unavailable)
from luce.server.generation import Generation
from luce.server.http import EventStream, HTTPConnection, Limits, Request, Response, raw_response
from luce.server.metrics import ServerMetrics
from luce.server.responses_api import Responses
from luce.server.turn import ChatSettings
from luce.server.validation import Defaults

log = logging.getLogger("luce.server")
access_log = logging.getLogger("luce.access")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/metrics"})
ANTHROPIC_PREFIX = "/v1/messages"


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    keep_alive_s: float = 60.0           # time to send the next request on a connection
    head_timeout_s: float = 10.0         # a request head must arrive this long after it starts
    write_timeout_s: float = 60.0        # a client that reads nothing this long is dropped
    drain_timeout_s: float = 30.0        # SIGTERM: wait this long for in-flight requests
    max_connections: int = 512
    max_connections_per_client: int = 128
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    defaults: Defaults = field(default_factory=Defaults)
    chat: ChatSettings = field(default_factory=ChatSettings)
    props_extra: dict = field(default_factory=dict)

    @property
    def limits(self) -> Limits:
        return Limits(self.max_body_bytes, self.keep_alive_s, self.head_timeout_s, self.write_timeout_s)


class _PeerWatchingProtocol(asyncio.StreamReaderProtocol):
    """A stream protocol that also signals, without reading, when the peer goes away."""

    def __init__(self, reader, callback, gone: asyncio.Event):
        super().__init__(reader, callback)
        self._gone = gone

    def eof_received(self):
        self._gone.set()
        return super().eof_received()

    def connection_lost(self, exc):
        self._gone.set()
        super().connection_lost(exc)


class App:
    def __init__(self, config: ServerConfig, bridge=None):
        self.config = config
        self.bridge = bridge
        self.loading_message = "Loading model"
        self.metrics = ServerMetrics()
        self.draining = False
        self.port: int | None = None
        self.address: tuple | None = None   # (host, port) actually bound
        self.policy = BrowserPolicy.for_server(config.host, config.api_key, config.cors_origins,
                                               config.allowed_hosts)
        self._server: asyncio.base_events.Server | None = None
        self._table = ConnectionTable(config.max_connections, config.max_connections_per_client)
        self._busy: set[asyncio.Task] = set()          # connections in the middle of a request
        self._expired = asyncio.Event()                # the drain timeout passed
        self._generation = Generation(self)
        self._endpoints = Endpoints(self)
        e, g, messages, responses = self._endpoints, self._generation, Messages(self), Responses(self)
        self._routes = {
            "/v1/chat/completions": {"POST": g.chat}, "/chat/completions": {"POST": g.chat},
            "/v1/completions": {"POST": g.completion}, "/completions": {"POST": g.completion},
            "/v1/messages": {"POST": messages.create}, "/v1/messages/count_tokens": {"POST": messages.count_tokens},
            "/v1/responses": {"POST": responses.create}, "/responses": {"POST": responses.create},
            "/v1/models": {"GET": e.models}, "/models": {"GET": e.models},
            "/health": {"GET": e.health}, "/v1/health": {"GET": e.health},
            "/metrics": {"GET": e.metrics}, "/props": {"GET": e.props},
            "/slots": {"GET": e.slots}, "/tokenize": {"POST": e.tokenize}, "/detokenize": {"POST": e.detokenize},
        }

    # ------------------------------------------------------------------ state

    @property
    def model_id(self) -> str:
        return self.bridge.info.model_id if self.bridge is not None else "loading"

    def set_bridge(self, bridge) -> None:
        self.bridge = bridge

    def require_bridge(self):
        if self.bridge is None:
            raise unavailable(f"{self.loading_message}; try again shortly", retry_after=5)
        return self.bridge

    @property
    def in_flight(self) -> int:
        return self.bridge.n_live if self.bridge is not None else 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def protocol():
            reader = asyncio.StreamReader(loop=loop)
            gone = asyncio.Event()

            async def on_connect(r, w):
                await self._connection(r, w, gone)

            return _PeerWatchingProtocol(reader, on_connect, gone)

        self._server = await loop.create_server(protocol, self.config.host, self.config.port)
        self.address = self._server.sockets[0].getsockname()[:2]
        self.port = self.address[1]

    async def drain(self) -> None:
        """Stop accepting, let in-flight requests finish (up to drain_timeout_s); what is left
        then gets 503 (streams: an error event and [DONE]); then close every connection."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        started = loop.time()
        while (self._busy or self.in_flight) and loop.time() < started + self.config.drain_timeout_s:
            await asyncio.sleep(0.05)
        if self._busy:
            log.warning("drain timeout: ending %d unfinished requests", len(self._busy))
            self._expired.set()
            end = loop.time() + 5
            while self._busy and loop.time() < end:
                await asyncio.sleep(0.02)
        tasks = self._table.tasks()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    # ------------------------------------------------------------------ connections

    async def _connection(self, reader, writer, gone: asyncio.Event) -> None:
        task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        conn = HTTPConnection(reader, writer, self.config.limits, client=str(peer[0]) if peer else "")
        try:
            refusal = self._table.admit(task, conn)
            if refusal is not None:
                self.metrics.requests.inc(endpoint="other", status="503")
                writer.write(raw_response(Response.error(unavailable(refusal, retry_after=1))))
                await asyncio.wait_for(writer.drain(), 5)
                return
            await self._serve(conn, gone)
        except (ConnectionError, asyncio.TimeoutError, asyncio.CancelledError):
            pass
        except Exception:  # pragma: no cover - a bug must not leak past one connection
            log.exception("connection handler failed")
        finally:
            self._table.remove(task)
            self._busy.discard(task)
            try:
                writer.close()
            except Exception:  # pragma: no cover
                pass

    async def _serve(self, conn: HTTPConnection, gone: asyncio.Event) -> None:
        first = True
        while not self.draining or first:
            try:
                request = await conn.next_request(first=first)
            except APIError as err:   # unparsable, oversized or too slow: answer and close
                self.metrics.requests.inc(endpoint="other", status=str(err.status))
                access_log.info('%s "- -" %d', conn.client, err.status)
                await conn.send(Response.error(err), keep_alive=False)
                await _lingering_close(conn.reader, conn.writer)
                return
            first = False
            if request is None:
                return
            self._busy.add(asyncio.current_task())
            try:
                keep = await self._answer(request, conn, gone)
            finally:
                self._busy.discard(asyncio.current_task())
            if not keep or not conn.reusable:
                return

    async def _answer(self, request: Request, conn: HTTPConnection, gone: asyncio.Event) -> bool:
        """Dispatch one request and write its answer; returns whether to keep the connection."""
        loop = asyncio.get_running_loop()
        endpoint = self._endpoint_label(request.path)
        result = await _first(self._dispatch(request), gone, self._expired)
        if result is gone:   # the client left first: the work was cancelled, answer nobody
            self._record(request, endpoint, 499, loop)
            return False
        if result is self._expired:
            result = Response.error(unavailable("the server shut down before this request finished", retry_after=5))
        keep = request.keep_alive and not self.draining   # a drain begun meanwhile closes after this
        cors = self.policy.cors_headers(request)
        if isinstance(result, EventStream):
            ok = await self._stream(result, conn, keep, gone, cors)
            self._record(request, endpoint, 200 if ok else 499, loop)
            return keep and ok
        result.headers.update(cors)
        self._record(request, endpoint, result.status, loop)
        await conn.send(result, keep_alive=keep, head_only=request.method == "HEAD")
        return keep

    def _endpoint_label(self, path: str) -> str:
        if path in self._routes:
            return path
        return "/v1/models/{id}" if _model_id(path) is not None else "other"

    def _record(self, request: Request, endpoint: str, status: int, loop) -> None:
        self.metrics.requests.inc(endpoint=endpoint, status=str(status))
        ms = (loop.time() - request.received_at) * 1000 if request.received_at else 0.0
        tokens = "" if request.usage is None else f" prompt={request.usage[0]} completion={request.usage[1]}"
        access_log.info('%s "%s %s" %d%s %.0f ms', request.client, request.method, request.path[:200], status,
                        tokens, ms)

    async def _dispatch(self, request: Request) -> Response | EventStream:
        try:
            refusal = self.policy.check_host(request)
            if refusal is not None:
                raise refusal
            methods = self._routes.get(request.path)
            handler_arg = None
            if methods is None and (handler_arg := _model_id(request.path)) is not None:
                methods = {"GET": self._endpoints.model}
            if methods is None:
                raise not_found(request.path)
            if request.method == "OPTIONS":
                return self.policy.preflight(request, list(methods) + (["HEAD"] if "GET" in methods else []))
            method = "GET" if request.method == "HEAD" else request.method
            handler = methods.get(method)
            if handler is None:
                raise method_not_allowed(request.method, request.path, list(methods))
            if self.config.api_key is not None and request.path not in PUBLIC_PATHS:
                self._authenticate(request)
            if method == "POST":
                require_json(request)
                if self.draining:
                    raise unavailable("the server is shutting down", retry_after=5)
            return await (handler(request, handler_arg) if handler_arg is not None else handler(request))
        except APIError as err:
            return self._error(request, err)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("handler for %s %s failed", request.method, request.path)
            return self._error(request, internal(f"internal error: {type(e).__name__}: {e}"))

    def _error(self, request: Request, err: APIError) -> Response:
        if request.path.startswith(ANTHROPIC_PREFIX):
            return Response(err.status, err.anthropic_body_bytes(), headers=dict(err.headers))
        return Response.error(err)

    def _authenticate(self, request: Request) -> None:
        """`Authorization: Bearer KEY` (OpenAI) or `x-api-key: KEY` (Anthropic)."""
        key = self.config.api_key.encode()
        scheme, _, token = (request.header("authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key):
            return
        other = request.header("x-api-key")
        if other is not None and hmac.compare_digest(other.strip().encode(), key):
            return
        raise unauthorized()

    async def _stream(self, stream: EventStream, conn: HTTPConnection, keep: bool, gone: asyncio.Event,
                      cors: dict) -> bool:
        """Send SSE events until the generator ends or the client goes; True if all were sent."""
        events = stream.events
        try:
            await conn.start_stream({**stream.headers, **cors}, keep)
            while True:
                try:
                    item = await _first(events.__anext__(), gone, self._expired)
                except StopAsyncIteration:
                    break
                if item is gone:
                    return False
                if item is self._expired:
                    for last in (stream.on_expire() if stream.on_expire is not None else []):
                        await conn.send_event(last)
                    break
                await conn.send_event(item)
            await conn.end_stream()
            return True
        except (ConnectionError, asyncio.TimeoutError):
            return False
        finally:
            await events.aclose()
            if stream.on_close is not None:
                stream.on_close()


def _model_id(path: str) -> str | None:
    for prefix in ("/v1/models/", "/models/"):
        if path.startswith(prefix) and len(path) > len(prefix):
            return path[len(prefix):]
    return None


LINGER_S = 2.0
LINGER_BYTES = 16 * 1024 * 1024


async def _lingering_close(reader, writer) -> None:
    """Half-close, then discard what the client is still sending (the rest of a refused body)
    for a moment: closing with unread input would reset the connection and could destroy the
    error response before the client reads it."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER_S
        discarded = 0
        while discarded < LINGER_BYTES and loop.time() < deadline:
            data = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
            if not data:
                return
            discarded += len(data)
    except (ConnectionError, asyncio.TimeoutError, OSError):
        pass


async def _first(coro, *signals: asyncio.Event):
    """Await `coro` unless one of `signals` is set first; then cancel it and return that event.

    If the caller itself is cancelled, `coro` is cancelled and awaited before re-raising, so
    an engine request never outlives the connection that made it."""
    work = asyncio.ensure_future(coro)
    watches = {asyncio.ensure_future(s.wait()): s for s in signals}
    try:
        done, _ = await asyncio.wait({work, *watches}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise
    finally:
        for w in watches:
            w.cancel()
    if work in done:
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return next(watches[w] for w in done if w in watches)
