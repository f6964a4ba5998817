"""Running an App: in the foreground with signal-driven drain, or on a background thread.

    serve_forever(app, load=lambda: bridge)   # luce-serve: listen at once, load, serve, drain
    with ServerThread(app) as server:         # tests and embedding: server.url
        ...
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Callable

from luce.server.app import App

log = logging.getLogger("luce.server")


def serve_forever(app: App, load: Callable[[], object] | None = None,
                  on_ready: Callable[[App], None] | None = None,
                  on_listening: Callable[[App], None] | None = None) -> int:
    """Listen, then (if given) run `load()` on a worker thread and serve the bridge it returns;
    /health answers 503 meanwhile. SIGINT/SIGTERM stop accepting and drain in-flight requests
    (a second signal stops at once). Returns the process exit status."""
    return asyncio.run(_main(app, load, on_ready, on_listening))


async def _main(app: App, load, on_ready, on_listening) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal(sig: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.warning("received %s: draining (send again to stop now)", signal.Signals(sig).name)
            stop.set()
        else:
            app.config.drain_timeout_s = 0.0

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
            pass
    await app.start()
    if on_listening is not None:
        on_listening(app)
    if load is not None:
        load_task = asyncio.ensure_future(asyncio.to_thread(load))
        stop_task = asyncio.ensure_future(stop.wait())
        await asyncio.wait({load_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        stop_task.cancel()
        if not load_task.done():     # stopped while loading: the thread finishes on its own
            await app.drain()
            return 130
        try:
            app.set_bridge(load_task.result().start())
        except Exception as e:
            log.error("loading the model failed: %s", e)
            await app.drain()
            return 1
    if on_ready is not None:
        on_ready(app)
    await stop.wait()
    await app.drain()
    if app.bridge is not None:
        await asyncio.to_thread(app.bridge.close)
    return 0


class ServerThread:
    """Run `app` on its own event loop in a daemon thread (tests, notebooks, embedding)."""

    def __init__(self, app: App, start_bridge: bool = True):
        self.app = app
        self._start_bridge = start_bridge
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="luce-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.app.config.host}:{self.app.port}"

    def start(self) -> "ServerThread":
        if self._start_bridge and self.app.bridge is not None:
            self.app.bridge.start()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.app.start(), self._loop).result(10)
        return self

    def run(self, coro, timeout: float = 10.0):
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.app.drain(), self._loop).result(timeout)
        if self.app.bridge is not None:
            self.app.bridge.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
