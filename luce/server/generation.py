"""POST /v1/chat/completions and /v1/completions: validate, submit, answer (OpenAI shapes).

Streaming answers are async generators of SSE payloads; the server closes them when the
client disconnects, and their `finally` cancels the engine request (slot freed next step).
Non-streaming answers are awaited in a task the server cancels on disconnect, to the same end.
"""
from __future__ import annotations

import asyncio
import logging

from luce.server import responses as R
from luce.server.chat_request import parse_chat
from luce.server.errors import APIError, internal
from luce.server.http import EventStream, Request, Response
from luce.server.submit import Timing, submit
from luce.server.turn import ChatTurn, GenerationFailed
from luce.server.validation import parse_completion, parse_json_body

log = logging.getLogger("luce.server")


def expired_events() -> list:
    """The end of a stream cut short by the drain timeout."""
    return [R.stream_error("the server shut down before this request finished", type="unavailable_error",
                           code="unavailable"), "[DONE]"]


def stream_failure(e: Exception) -> dict:
    if isinstance(e, APIError):
        return R.stream_error(e.message, type=e.type, code=e.code)
    return R.stream_error(f"generation failed: {e}")


class Generation:
    """The two OpenAI generation endpoints over `app.bridge` (see luce.server.app.App)."""

    def __init__(self, app):
        self.app = app

    # ------------------------------------------------------------------ chat

    async def chat(self, request: Request):
        chat = parse_chat(parse_json_body(request.body), self.app.config.defaults)
        turn = await ChatTurn.start(self.app, chat, R.new_id("chatcmpl"), request.received_at)
        if chat.gen.stream:
            return EventStream(self._chat_stream(turn, request), on_close=turn.cancel, on_expire=expired_events)
        try:
            async for _ in turn.deltas():
                pass
        except GenerationFailed as e:
            raise internal(f"generation failed: {e}") from None
        request.usage = (turn.n_prompt, turn.n_generated)
        out = turn.output
        return Response.json(R.chat_completion(turn.request_id, R.now(), self.app.model_id,
                                               R.chat_message(out.content, out.reasoning, turn.calls),
                                               turn.finish_reason, R.usage(turn.n_prompt, turn.n_generated, turn.n_cached)))

    async def _chat_stream(self, turn: ChatTurn, request: Request):
        rid, created, model = turn.request_id, R.now(), self.app.model_id
        usage_on = turn.chat.gen.include_usage
        try:
            yield R.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, include_usage=usage_on)
            try:
                async for d in turn.deltas():
                    yield R.chat_chunk(rid, created, model, R.chat_delta(d, len(turn.calls) - 1),
                                       include_usage=usage_on)
                yield R.chat_chunk(rid, created, model, {}, turn.finish_reason, include_usage=usage_on)
            except (GenerationFailed, APIError) as e:
                yield stream_failure(e)
            if usage_on:
                yield R.chat_chunk(rid, created, model, None, use=R.usage(turn.n_prompt, turn.n_generated, turn.n_cached),
                                   include_usage=True)
            yield "[DONE]"
        finally:
            request.usage = (turn.n_prompt, turn.n_generated)
            turn.cancel()

    # ------------------------------------------------------------------ completions

    async def completion(self, request: Request):
        body = parse_json_body(request.body)
        bridge = self.app.require_bridge()
        gen = parse_completion(body, self.app.config.defaults, bridge.tokenizer.vocab_size)
        ids = gen.prompt_ids
        if ids is None:
            ids = await asyncio.to_thread(bridge.tokenizer.encode, gen.prompt_text)
        handle, n_prompt = submit(self.app, gen, ids, R.new_id("cmpl"))
        timing = Timing(self.app.metrics, request.received_at)
        if gen.stream:
            return EventStream(self._completion_stream(gen, handle, n_prompt, timing, request),
                               on_close=lambda: (handle.cancel(), timing.done("cancelled")),
                               on_expire=expired_events)
        reason = "cancelled"
        try:
            async for event in handle:
                timing.event(event)
                if event.finish_reason == "error":
                    reason = "error"
                    raise internal(f"generation failed: {event.error}")
                reason = event.finish_reason or reason
        finally:
            handle.cancel()
            timing.done(reason)
        request.usage = (n_prompt, handle.n_generated)
        return Response.json(R.text_completion(handle.request_id, R.now(), self.app.model_id, handle.text, reason,
                                               R.usage(n_prompt, handle.n_generated, handle.n_cached)))

    async def _completion_stream(self, gen, handle, n_prompt: int, timing: Timing, request: Request):
        rid, created, model, usage_on = handle.request_id, R.now(), self.app.model_id, gen.include_usage
        reason = "cancelled"
        try:
            async for event in handle:
                timing.event(event)
                if event.finish_reason == "error":
                    reason = "error"
                    yield R.stream_error(f"generation failed: {event.error}")
                    break
                reason = event.finish_reason or reason
                if event.text or event.finish_reason is not None:
                    yield R.text_chunk(rid, created, model, event.text, event.finish_reason, include_usage=usage_on)
            if usage_on:
                yield R.text_chunk(rid, created, model, None, use=R.usage(n_prompt, handle.n_generated, handle.n_cached),
                                   include_usage=True)
            yield "[DONE]"
        finally:
            request.usage = (n_prompt, handle.n_generated)
            handle.cancel()
            timing.done(reason)
