"""The bridge between the asyncio HTTP side and an engine stepped on its own thread.

An engine is anything with the small `EngineCore` interface (add a request, cancel one, step,
report stats). `EngineBridge` owns one thread that steps the core continuously while it has
work; the HTTP side only ever appends to thread-safe inboxes and reads the latest stats
snapshot, so it never blocks the engine and the engine never blocks it.

    handle = bridge.submit(prompt_ids, params, "chatcmpl-1")   # on the event loop
    async for event in handle:                                  # GenerationEvent
        send(event.text)                                        # until event.finish_reason
    handle.cancel()                                             # any time; slot freed next step

The core decides everything about a request's output (the engine's one stop rule,
luce.engine.output_stream: stop ids, end-of-generation tokens, stop strings, max_tokens, the
context): each StepOutput carries the tokens taken, the text that can no longer change and
the finish. The bridge only renders it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

log = logging.getLogger("luce.server")


@dataclass(frozen=True)
class StepOutput:
    """What a core reports for one request after a step."""
    request_id: str
    token_ids: tuple[int, ...] = ()      # new tokens (several with speculation, none mid-prefill)
    finish_reason: str | None = None     # "stop" | "length" | "error" when the core ended it
    error: str | None = None             # message when finish_reason == "error"
    text: str = ""                       # text of these tokens that can no longer change
    stop_string: str | None = None       # the stop string that ended the output, if one did
    logprobs: tuple = ()                 # luce.engine.request.TokenLogprob per token (when asked)
    cached_tokens: int | None = None     # prompt tokens served from the prefix cache (once known)


@dataclass(frozen=True)
class EngineStats:
    slots_total: int = 0
    slots_busy: int = 0
    queue_depth: int = 0                 # admitted by the server, waiting for a slot
    kv_pages_total: int = 0
    kv_pages_used: int = 0
    acceptance_length: float | None = None   # mean tokens committed per request-step
    steps: int = 0
    graphs: dict = field(default_factory=dict)   # graph replay counters (luce.models.graph_cache.COUNTERS)
    prefix_cache: dict = field(default_factory=dict)  # luce.engine Engine.prefix_cache_counters()
    slots: tuple = ()                    # per engine slot: (request id, KV tokens) or None when free

    @property
    def kv_pages_free(self) -> int:
        return self.kv_pages_total - self.kv_pages_used


@dataclass(frozen=True)
class ModelInfo:
    """What /v1/models and /props report about the served model."""
    model_id: str                        # name clients pass as "model"
    path: str
    n_ctx: int
    backend: str
    max_slots: int
    arch: str = ""
    draft_path: str | None = None
    spec_mode: str = "off"               # requested speculation mode
    draft_kind: str | None = None        # requested drafter: dflash | model | ngram
    spec_active: bool = False
    spec_note: str = ""
    extra: dict = field(default_factory=dict)


class EngineCore(Protocol):
    """The engine as the bridge drives it. Every method is called on the engine thread only."""

    def add_request(self, request_id: str, prompt_ids: Sequence[int], params) -> None: ...

    def cancel(self, request_id: str) -> None:
        """Drop the request (queued or running); its slot and pages are free after the next step."""

    def has_work(self) -> bool: ...

    def step(self) -> list[StepOutput]: ...

    def stats(self) -> EngineStats: ...


class QueueFullError(RuntimeError):
    """Every slot is busy and the wait queue is full."""

    def __init__(self, retry_after: int = 1):
        super().__init__("all slots busy and the queue is full")
        self.retry_after = retry_after


@dataclass(frozen=True)
class GenerationEvent:
    token_ids: tuple[int, ...]           # generated tokens this event accounts for
    text: str                            # text delta
    finish_reason: str | None = None     # "stop" | "length" | "error" on the last event
    error: str | None = None
    logprobs: tuple = ()                 # TokenLogprob per token_ids entry (when asked)


class RequestHandle:
    """One submitted request on the event loop side: an async iterator of GenerationEvents."""

    def __init__(self, bridge: "EngineBridge", request_id: str, n_prompt: int, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.n_prompt = n_prompt
        self.n_generated = 0                 # tokens the core emitted for this request
        self.n_cached = 0                    # prompt tokens the prefix cache served
        self.text = ""                       # everything rendered so far
        self.stop_string: str | None = None  # the stop string that ended the generation, if one did
        self.logprobs: list = []             # TokenLogprob of every token so far (when asked)
        self._bridge = bridge
        self._loop = loop
        self._queue: asyncio.Queue[StepOutput] = asyncio.Queue()
        self._closed = False

    def _deliver(self, out: StepOutput) -> None:
        """Engine thread -> event loop."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, out)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    def cancel(self) -> None:
        """Stop generating (idempotent). The engine frees the slot at its next step."""
        if not self._closed:
            self._closed = True
            self._bridge._cancel(self.request_id)
            self._bridge._release(self.request_id)

    def __aiter__(self):
        return self

    async def __anext__(self) -> GenerationEvent:
        while not self._closed:
            out = await self._queue.get()
            event = self._event(out)
            if event is None:
                continue
            if event.finish_reason is not None:
                self._closed = True
                self._bridge._release(self.request_id)
            return event
        raise StopAsyncIteration

    def _event(self, out: StepOutput) -> GenerationEvent | None:
        """Render one StepOutput (the core already applied every stop rule)."""
        tokens = tuple(int(t) for t in out.token_ids)
        self.n_generated += len(tokens)
        if out.cached_tokens is not None:
            self.n_cached = out.cached_tokens
        self.text += out.text
        self.logprobs.extend(out.logprobs)
        if out.stop_string is not None:
            self.stop_string = out.stop_string
        if out.finish_reason == "error":
            return GenerationEvent(tokens, out.text, "error", out.error or "engine error")
        reason = out.finish_reason
        if reason is not None and reason not in ("stop", "length"):
            reason = "stop"
        if reason is None and not out.text and not tokens:
            return None
        return GenerationEvent(tokens, out.text, reason, logprobs=tuple(out.logprobs))


class EngineBridge:
    """Runs `core` on a dedicated thread; submit/cancel/stats are safe from the event loop."""

    def __init__(self, core: EngineCore, tokenizer, info: ModelInfo, *, max_pending: int,
                 idle_wait_s: float = 0.5):
        self.core = core
        self.tokenizer = tokenizer
        self.info = info
        self.max_pending = max_pending
        self._idle_wait_s = idle_wait_s
        self._cv = threading.Condition()
        self._inbox: deque[tuple[str, list[int], object, RequestHandle]] = deque()
        self._cancels: deque[str] = deque()
        self._handles: dict[str, RequestHandle] = {}   # engine thread's view of live requests
        self._live: set[str] = set()                    # event loop's view (admission control)
        self._stop = False
        self._stats = EngineStats()
        self._tokens_emitted = 0
        self._emissions = 0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "EngineBridge":
        if self._thread is None:
            self._refresh_stats()
            self._thread = threading.Thread(target=self._run, name="luce-engine", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ event loop side

    @property
    def n_live(self) -> int:
        return len(self._live)

    def submit(self, prompt_ids: Sequence[int], params, request_id: str) -> RequestHandle:
        """Queue a request (call on the event loop). Raises QueueFullError at capacity."""
        if len(self._live) >= self.max_pending:
            raise QueueFullError()
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already live")
        handle = RequestHandle(self, request_id, len(prompt_ids), asyncio.get_running_loop())
        self._live.add(request_id)
        with self._cv:
            self._inbox.append((request_id, list(prompt_ids), params, handle))
            self._cv.notify()
        return handle

    def stats(self) -> EngineStats:
        """The snapshot taken after the engine's latest step (never waits for the engine)."""
        return self._stats

    def _cancel(self, request_id: str) -> None:
        with self._cv:
            self._cancels.append(request_id)
            self._cv.notify()

    def _release(self, request_id: str) -> None:
        self._live.discard(request_id)

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        stalled = False   # the last step had nothing to run (e.g. a queued request awaits pages)
        while True:
            with self._cv:
                if stalled and not (self._stop or self._inbox or self._cancels):
                    self._cv.wait(0.02)
                while not (self._stop or self._inbox or self._cancels or self._core_has_work()):
                    self._cv.wait(self._idle_wait_s)
                if self._stop:
                    break
                new = list(self._inbox)
                self._inbox.clear()
                cancels = list(self._cancels)
                self._cancels.clear()
            # cancels first, so the engine never holds more than max_pending requests; a request
            # cancelled before it was admitted is simply never admitted
            unadmitted = {c for c in cancels if c not in self._handles}
            for request_id in cancels:
                self._drop(request_id)
            for request_id, prompt_ids, params, handle in new:
                if request_id not in unadmitted:
                    self._admit(request_id, prompt_ids, params, handle)
            stalled = self._core_has_work() and not self._step()
            self._refresh_stats()
        for handle in list(self._handles.values()):
            handle._deliver(StepOutput(handle.request_id, (), "error", "the server is shutting down"))
        self._handles.clear()

    def _core_has_work(self) -> bool:
        try:
            return bool(self.core.has_work())
        except Exception:  # pragma: no cover - a broken core must not kill the loop
            log.exception("engine has_work() failed")
            return False

    def _admit(self, request_id, prompt_ids, params, handle) -> None:
        try:
            self.core.add_request(request_id, prompt_ids, params)
        except Exception as e:
            log.warning("engine rejected request %s: %s", request_id, e)
            handle._deliver(StepOutput(request_id, (), "error", f"engine rejected the request: {e}"))
            return
        self._handles[request_id] = handle

    def _drop(self, request_id: str) -> None:
        if self._handles.pop(request_id, None) is None:
            return
        try:
            self.core.cancel(request_id)
        except Exception:
            log.exception("engine cancel(%s) failed", request_id)

    def _step(self) -> bool:
        """One core step; False if it had nothing to do."""
        try:
            outputs = self.core.step()
        except Exception as e:
            log.exception("engine step failed; failing its %d live requests", len(self._handles))
            for handle in self._handles.values():
                handle._deliver(StepOutput(handle.request_id, (), "error", f"engine step failed: {e}"))
                self._drop_quietly(handle.request_id)
            self._handles.clear()
            return True
        for out in outputs:
            handle = self._handles.get(out.request_id)
            if handle is None:
                continue   # cancelled while the step ran
            if out.token_ids:
                self._tokens_emitted += len(out.token_ids)
                self._emissions += 1
            if out.finish_reason is not None:
                del self._handles[out.request_id]
            handle._deliver(out)
        return bool(outputs)

    def _drop_quietly(self, request_id: str) -> None:
        try:
            self.core.cancel(request_id)
        except Exception:
            pass

    def _refresh_stats(self) -> None:
        try:
            stats = self.core.stats()
        except Exception:  # pragma: no cover
            log.exception("engine stats() failed")
            return
        with self._cv:
            waiting = len(self._inbox)
        acceptance = stats.acceptance_length
        if acceptance is None and self._emissions:
            acceptance = self._tokens_emitted / self._emissions
        self._stats = dataclasses.replace(stats, queue_depth=stats.queue_depth + waiting,
                                          acceptance_length=acceptance)
