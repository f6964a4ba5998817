"""POST /v1/chat/completions and /v1/completions: validate, tokenize, submit, answer.

Streaming answers are async generators of SSE payloads; the server closes them when the
client disconnects, and their `finally` cancels the engine request (slot freed next step).
Non-streaming answers are awaited in a task the server cancels on disconnect, to the same end.
"""
from __future__ import annotations

import asyncio
import logging

from luce.server import responses as R
from luce.server.bridge import GenerationEvent, QueueFullError, RequestHandle
from luce.server.errors import bad_request, internal, queue_full
from luce.server.http import EventStream, Request, Response
from luce.server.validation import GenerationRequest, parse_chat, parse_completion, parse_json_body

log = logging.getLogger("luce.server")


def _render_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the messages through the model's chat template (worker thread)."""
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as e:
        raise bad_request(f"the model's chat template rejected the messages: {e}", param="messages") from None
    return tokenizer.encode(text)


def _expired() -> list:
    """The end of a stream cut short by the drain timeout."""
    return [R.stream_error("the server shut down before this request finished", type="unavailable_error",
                           code="unavailable"), "[DONE]"]


class _Timing:
    """Records TTFT, inter-token latency, tokens per step and totals for one request."""

    def __init__(self, metrics, arrival: float):
        self.metrics = metrics
        self.arrival = arrival
        self.last: float | None = None
        self.finished = False

    def event(self, event: GenerationEvent) -> None:
        n = len(event.token_ids)
        if not n:
            return
        t = asyncio.get_running_loop().time()
        if self.last is None:
            self.metrics.ttft.observe(max(t - self.arrival, 0.0))
        else:
            per_token = max(t - self.last, 0.0) / n
            for _ in range(n):
                self.metrics.itl.observe(per_token)
        self.last = t
        self.metrics.tokens_per_event.observe(n)
        self.metrics.generation_tokens.inc(n)

    def done(self, reason: str) -> None:
        if self.finished:
            return
        self.finished = True
        self.metrics.finished.inc(reason=reason)
        self.metrics.e2e.observe(max(asyncio.get_running_loop().time() - self.arrival, 0.0))


class Generation:
    """The two generation endpoints over `app.bridge` (see luce.server.app.App)."""

    def __init__(self, app):
        self.app = app

    # ------------------------------------------------------------------ endpoints

    async def chat(self, request: Request):
        body = parse_json_body(request.body)
        gen = parse_chat(body, self.app.config.defaults)
        bridge = self.app.require_bridge()
        ids = await asyncio.to_thread(_render_chat, bridge.tokenizer, gen.messages)
        handle, n_prompt = self._submit(gen, ids, R.new_id("chatcmpl"))
        timing = _Timing(self.app.metrics, request.received_at)
        if gen.stream:
            return EventStream(self._chat_stream(gen, handle, n_prompt, timing),
                               on_close=lambda: (handle.cancel(), timing.done("cancelled")), on_expire=_expired)
        text, reason = await self._collect(handle, timing)
        return Response.json(R.chat_completion(handle.request_id, R.now(), self.app.model_id, text, reason,
                                               R.usage(n_prompt, handle.n_generated)))

    async def completion(self, request: Request):
        body = parse_json_body(request.body)
        bridge = self.app.require_bridge()
        gen = parse_completion(body, self.app.config.defaults, bridge.tokenizer.vocab_size)
        ids = gen.prompt_ids
        if ids is None:
            ids = await asyncio.to_thread(bridge.tokenizer.encode, gen.prompt_text)
        handle, n_prompt = self._submit(gen, ids, R.new_id("cmpl"))
        timing = _Timing(self.app.metrics, request.received_at)
        if gen.stream:
            return EventStream(self._completion_stream(gen, handle, n_prompt, timing),
                               on_close=lambda: (handle.cancel(), timing.done("cancelled")), on_expire=_expired)
        text, reason = await self._collect(handle, timing)
        return Response.json(R.text_completion(handle.request_id, R.now(), self.app.model_id, text, reason,
                                               R.usage(n_prompt, handle.n_generated)))

    # ------------------------------------------------------------------ shared steps

    def _submit(self, gen: GenerationRequest, ids: list[int], request_id: str) -> tuple[RequestHandle, int]:
        bridge = self.app.require_bridge()
        n_ctx = bridge.info.n_ctx
        if not ids:
            raise bad_request("encodes to no tokens: send some text", param=gen.prompt_field)
        if len(ids) >= n_ctx:
            self.app.metrics.rejected.inc(reason="prompt_too_long")
            raise bad_request(f"the prompt is {len(ids)} tokens but the context holds {n_ctx} "
                              f"(luce-serve --ctx), including at least one generated token: shorten it",
                              param=gen.prompt_field, code="context_length_exceeded")
        room = n_ctx - len(ids)
        max_tokens = room if gen.max_tokens is None else min(gen.max_tokens, room)
        params = gen.sampling_params(max_tokens)
        try:
            handle = bridge.submit(ids, params, request_id)
        except QueueFullError as e:
            self.app.metrics.rejected.inc(reason="queue_full")
            raise queue_full(e.retry_after) from None
        self.app.metrics.prompt_tokens.inc(len(ids))
        return handle, len(ids)

    async def _collect(self, handle: RequestHandle, timing: _Timing) -> tuple[str, str]:
        reason = "cancelled"
        try:
            async for event in handle:
                timing.event(event)
                if event.finish_reason == "error":
                    reason = "error"
                    raise internal(f"generation failed: {event.error}")
                if event.finish_reason is not None:
                    reason = event.finish_reason
            return handle.text, reason
        finally:
            handle.cancel()
            timing.done(reason)

    async def _events(self, handle: RequestHandle, timing: _Timing, state: dict):
        """Events of `handle` with metrics; state['reason'] ends as the finish reason."""
        state["reason"] = "cancelled"
        async for event in handle:
            timing.event(event)
            if event.finish_reason is not None:
                state["reason"] = event.finish_reason
            yield event

    async def _chat_stream(self, gen: GenerationRequest, handle: RequestHandle, n_prompt: int, timing: _Timing):
        rid, created, model, usage_on = handle.request_id, R.now(), self.app.model_id, gen.include_usage
        state: dict = {}
        try:
            yield R.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, include_usage=usage_on)
            async for event in self._events(handle, timing, state):
                if event.finish_reason == "error":
                    yield R.stream_error(f"generation failed: {event.error}")
                    break
                if event.text:
                    yield R.chat_chunk(rid, created, model, {"content": event.text}, include_usage=usage_on)
                if event.finish_reason is not None:
                    yield R.chat_chunk(rid, created, model, {}, event.finish_reason, include_usage=usage_on)
            if usage_on:
                yield R.chat_chunk(rid, created, model, None, use=R.usage(n_prompt, handle.n_generated),
                                   include_usage=True)
            yield "[DONE]"
        finally:
            handle.cancel()
            timing.done(state.get("reason", "cancelled"))

    async def _completion_stream(self, gen: GenerationRequest, handle: RequestHandle, n_prompt: int,
                                 timing: _Timing):
        rid, created, model, usage_on = handle.request_id, R.now(), self.app.model_id, gen.include_usage
        state: dict = {}
        try:
            async for event in self._events(handle, timing, state):
                if event.finish_reason == "error":
                    yield R.stream_error(f"generation failed: {event.error}")
                    break
                if event.text or event.finish_reason is not None:
                    yield R.text_chunk(rid, created, model, event.text, event.finish_reason, include_usage=usage_on)
            if usage_on:
                yield R.text_chunk(rid, created, model, None, use=R.usage(n_prompt, handle.n_generated),
                                   include_usage=True)
            yield "[DONE]"
        finally:
            handle.cancel()
            timing.done(state.get("reason", "cancelled"))

