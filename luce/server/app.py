"""The HTTP application: connections, routing, authentication, disconnects, graceful drain.

    app = App(ServerConfig(port=8080), bridge)        # bridge may come later: app.set_bridge()
    await app.start()                                  # listening; app.port is the bound port
    await app.drain()                                  # stop listening, finish in-flight requests

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /metrics, GET /props (the /v1 prefix is optional on the OpenAI routes, as in llama-server).
"""
from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass, field

from luce.server import http
from luce.server.endpoints import Endpoints
from luce.server.errors import (APIError, internal, method_not_allowed, not_found, unauthorized,
                                unavailable)
from luce.server.generation import Generation
from luce.server.http import EventStream, EventStreamWriter, Request, Response
from luce.server.metrics import ServerMetrics
from luce.server.validation import Defaults

log = logging.getLogger("luce.server")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/metrics"})


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    keep_alive_s: float = 60.0           # time to send the next request on a connection
    write_timeout_s: float = 60.0        # a client that reads nothing this long is dropped
    drain_timeout_s: float = 30.0        # SIGTERM: wait this long for in-flight requests
    max_connections: int = 512
    defaults: Defaults = field(default_factory=Defaults)
    props_extra: dict = field(default_factory=dict)


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
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._busy: set[asyncio.Task] = set()          # connections in the middle of a request
        self._generation = Generation(self)
        self._endpoints = Endpoints(self)
        self._routes = {
            "/v1/chat/completions": {"POST": self._generation.chat},
            "/chat/completions": {"POST": self._generation.chat},
            "/v1/completions": {"POST": self._generation.completion},
            "/completions": {"POST": self._generation.completion},
            "/v1/models": {"GET": self._endpoints.models},
            "/models": {"GET": self._endpoints.models},
            "/health": {"GET": self._endpoints.health},
            "/v1/health": {"GET": self._endpoints.health},
            "/metrics": {"GET": self._endpoints.metrics},
            "/props": {"GET": self._endpoints.props},
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
            reader = asyncio.StreamReader(limit=http.MAX_HEAD_BYTES, loop=loop)
            gone = asyncio.Event()

            async def on_connect(r, w):
                await self._connection(r, w, gone)

            return _PeerWatchingProtocol(reader, on_connect, gone)

        self._server = await loop.create_server(protocol, self.config.host, self.config.port)
        self.address = self._server.sockets[0].getsockname()[:2]
        self.port = self.address[1]

    async def drain(self) -> None:
        """Stop accepting, let in-flight requests finish (up to drain_timeout_s), then close."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        started = loop.time()
        while (self._busy or self.in_flight) and loop.time() < started + self.config.drain_timeout_s:
            await asyncio.sleep(0.05)
        if self._busy:
            log.warning("drain timeout: cancelling %d unfinished requests", len(self._busy))
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    # ------------------------------------------------------------------ connections

    async def _connection(self, reader, writer, gone: asyncio.Event) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            if len(self._connections) > self.config.max_connections:
                err = unavailable("too many open connections; retry later", retry_after=1)
                writer.write(http.response_bytes(Response.error(err), keep_alive=False))
                return
            await self._serve(reader, writer, gone)
        except (ConnectionError, asyncio.TimeoutError, asyncio.CancelledError):
            pass
        except Exception:  # pragma: no cover - a bug must not leak past one connection
            log.exception("connection handler failed")
        finally:
            self._connections.discard(task)
            self._busy.discard(task)
            try:
                writer.close()
            except Exception:  # pragma: no cover
                pass

    async def _serve(self, reader, writer, gone: asyncio.Event) -> None:
        first = True
        while not self.draining or first:
            first = False
            try:
                request = await self._read(reader, writer)
            except APIError as err:   # unparsable or oversized: answer and close
                self.metrics.requests.inc(endpoint="other", status=str(err.status))
                writer.write(http.response_bytes(Response.error(err), keep_alive=False))
                await writer.drain()
                await _lingering_close(reader, writer)
                return
            if request is None:
                return
            self._busy.add(asyncio.current_task())
            try:
                keep = await self._answer(request, reader, writer, gone)
            finally:
                self._busy.discard(asyncio.current_task())
            if not keep:
                return

    async def _read(self, reader, writer) -> Request | None:
        """The next request, or None when the client closes or stays idle past keep_alive_s."""
        try:
            return await asyncio.wait_for(http.read_request(reader, writer, self.config.max_body_bytes),
                                          self.config.keep_alive_s)
        except asyncio.TimeoutError:
            return None

    async def _answer(self, request: Request, reader, writer, gone: asyncio.Event) -> bool:
        """Dispatch one request and write its answer; returns whether to keep the connection."""
        endpoint = request.path if request.path in self._routes else "other"
        result = await _unless_gone(self._dispatch(request), gone)
        if result is _GONE:   # the client left first: the work was cancelled, answer nobody
            self.metrics.requests.inc(endpoint=endpoint, status="499")
            return False
        keep = request.keep_alive and not self.draining   # a drain begun meanwhile closes after this
        head_only = request.method == "HEAD"
        if isinstance(result, EventStream):
            ok = await self._stream(result, writer, keep, gone)
            self.metrics.requests.inc(endpoint=endpoint, status="200" if ok else "499")
            return keep and ok
        self.metrics.requests.inc(endpoint=endpoint, status=str(result.status))
        writer.write(http.response_bytes(result, keep_alive=keep, head_only=head_only))
        await asyncio.wait_for(writer.drain(), self.config.write_timeout_s)
        return keep

    async def _dispatch(self, request: Request) -> Response | EventStream:
        try:
            methods = self._routes.get(request.path)
            if methods is None:
                raise not_found(request.path)
            method = "GET" if request.method == "HEAD" else request.method
            handler = methods.get(method)
            if handler is None:
                raise method_not_allowed(request.method, request.path, list(methods))
            if self.config.api_key is not None and request.path not in PUBLIC_PATHS:
                self._authenticate(request)
            if self.draining and method == "POST":
                raise unavailable("the server is shutting down", retry_after=5)
            return await handler(request)
        except APIError as err:
            return Response.error(err)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("handler for %s %s failed", request.method, request.path)
            return Response.error(internal(f"internal error: {type(e).__name__}: {e}"))

    def _authenticate(self, request: Request) -> None:
        auth = request.header("authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                  self.config.api_key.encode()):
            raise unauthorized()

    async def _stream(self, stream: EventStream, writer, keep: bool, gone: asyncio.Event) -> bool:
        """Send SSE events until the generator ends or the client goes; True if all were sent."""
        sse = EventStreamWriter(writer, keep, self.config.write_timeout_s)
        events = stream.events
        try:
            await sse.start(stream.headers)
            while True:
                try:
                    item = await _unless_gone(events.__anext__(), gone)
                except StopAsyncIteration:
                    break
                if item is _GONE:
                    return False
                await (sse.send(item) if isinstance(item, str) else sse.send_json(item))
            await sse.finish()
            return True
        except (ConnectionError, asyncio.TimeoutError):
            return False
        finally:
            await events.aclose()
            if stream.on_close is not None:
                stream.on_close()


_GONE = object()
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


async def _unless_gone(coro, gone: asyncio.Event):
    """Await `coro` unless the peer goes away first; then cancel it and return _GONE.

    If the caller itself is cancelled, `coro` is cancelled and awaited before re-raising, so
    an engine request never outlives the connection that made it."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(gone.wait())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise
    finally:
        watch.cancel()
    if work in done:
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return _GONE
