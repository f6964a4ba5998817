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
from luce.server.logprobs import chat_logprobs, text_logprobs
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


async def merged(streams):
    """(index, item) from several async iterators as they come; an iterator's exception is
    yielded as its item, and each one ends with (index, None). Closing this closes the tasks."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        try:
            async for item in stream:
                await queue.put((i, item))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, e))
        await queue.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            i, item = await queue.get()
            open_streams -= item is None
            yield i, item
    finally:
        for t in tasks:
            t.cancel()


class Generation:
    """The two OpenAI generation endpoints over `app.bridge` (see luce.server.app.App). n > 1:
    n engine requests of the same prompt (seeds seed + i when the request gives one; the
    prompt is prefilled for each), streamed interleaved by choice index."""

    def __init__(self, app):
        self.app = app

    # ------------------------------------------------------------------ chat

    async def chat(self, request: Request):
        chat = parse_chat(parse_json_body(request.body), self.app.config.defaults)
        rid = R.new_id("chatcmpl")
        turns = []
        try:
            for i in range(chat.gen.n):
                turns.append(await ChatTurn.start(self.app, chat, rid if i == 0 else f"{rid}-{i}",
                                                  request.received_at, choice=i))
        except BaseException:
            for t in turns:
                t.cancel()
            raise
        cancel_all = lambda: [t.cancel() for t in turns]  # noqa: E731
        if chat.gen.stream:
            return EventStream(self._chat_stream(turns, rid, request), on_close=cancel_all, on_expire=expired_events)
        try:
            async for _, item in merged([t.deltas() for t in turns]):
                if isinstance(item, GenerationFailed):
                    raise internal(f"generation failed: {item}") from None
                if isinstance(item, Exception):
                    raise item
        finally:
            cancel_all()
        n_generated = sum(t.n_generated for t in turns)
        request.usage = (turns[0].n_prompt, n_generated)
        tok = self.app.bridge.tokenizer
        choices = [R.chat_choice(t.choice, R.chat_message(t.output.content, t.output.reasoning, t.calls),
                                 t.finish_reason, chat_logprobs(t.logprobs, tok)) for t in turns]
        return Response.json(R.chat_completion(rid, R.now(), self.app.model_id, choices,
                                               R.usage(turns[0].n_prompt, n_generated, turns[0].n_cached)))

    async def _chat_stream(self, turns: list[ChatTurn], rid: str, request: Request):
        created, model = R.now(), self.app.model_id
        usage_on = turns[0].chat.gen.include_usage
        tok = self.app.bridge.tokenizer
        chunk = lambda t, delta, reason=None: R.chat_chunk(  # noqa: E731
            rid, created, model, delta, reason, include_usage=usage_on, index=t.choice,
            logprobs=chat_logprobs(t.take_logprobs(), tok))
        try:
            for t in turns:
                yield R.chat_chunk(rid, created, model, {"role": "assistant", "content": ""},
                                   include_usage=usage_on, index=t.choice)
            async for i, item in merged([t.deltas() for t in turns]):
                t = turns[i]
                if isinstance(item, (GenerationFailed, APIError)):
                    yield stream_failure(item)
                    break
                if isinstance(item, Exception):
                    raise item
                yield chunk(t, {}, t.finish_reason) if item is None else chunk(t, R.chat_delta(item, len(t.calls) - 1))
            if usage_on:
                yield R.chat_chunk(rid, created, model, None, use=R.usage(turns[0].n_prompt,
                                                                          sum(t.n_generated for t in turns),
                                                                          turns[0].n_cached),
                                   include_usage=True)
            yield "[DONE]"
        finally:
            request.usage = (turns[0].n_prompt, sum(t.n_generated for t in turns))
            for t in turns:
                t.cancel()

    # ------------------------------------------------------------------ completions

    async def completion(self, request: Request):
        body = parse_json_body(request.body)
        bridge = self.app.require_bridge()
        gen = parse_completion(body, self.app.config.defaults, bridge.tokenizer.vocab_size)
        ids = gen.prompt_ids
        if ids is None:
            ids = await asyncio.to_thread(bridge.tokenizer.encode, gen.prompt_text)
        rid = R.new_id("cmpl")
        handles = []
        try:
            for i in range(gen.n):
                handles.append(submit(self.app, gen, ids, rid if i == 0 else f"{rid}-{i}", choice=i,
                                      count_prompt=i == 0)[0])
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        n_prompt = len(ids)
        timings = [Timing(self.app.metrics, request.received_at) for _ in handles]
        reasons = ["cancelled"] * len(handles)

        def close():
            for h, timing, reason in zip(handles, timings, reasons):
                h.cancel()
                timing.done(reason)

        if gen.stream:
            return EventStream(self._completion_stream(gen, rid, handles, timings, reasons, n_prompt, request),
                               on_close=close, on_expire=expired_events)
        try:
            async for i, event in merged(handles):
                if event is None:
                    continue
                if isinstance(event, Exception):
                    raise event
                timings[i].event(event)
                if event.finish_reason == "error":
                    reasons[i] = "error"
                    raise internal(f"generation failed: {event.error}")
                reasons[i] = event.finish_reason or reasons[i]
        finally:
            close()
        n_generated = sum(h.n_generated for h in handles)
        request.usage = (n_prompt, n_generated)
        want = gen.sampling.get("logprobs") is not None
        choices = [R.text_choice(i, h.text, reasons[i], text_logprobs(h.logprobs if want else None, bridge.tokenizer))
                   for i, h in enumerate(handles)]
        return Response.json(R.text_completion(rid, R.now(), self.app.model_id, choices,
                                               R.usage(n_prompt, n_generated, handles[0].n_cached)))

    async def _completion_stream(self, gen, rid, handles, timings, reasons, n_prompt: int, request: Request):
        created, model, usage_on = R.now(), self.app.model_id, gen.include_usage
        want = gen.sampling.get("logprobs") is not None
        tok = self.app.bridge.tokenizer
        offsets, pending = [0] * len(handles), [[] for _ in handles]
        try:
            async for i, event in merged(handles):
                if event is None:
                    continue
                if isinstance(event, Exception):
                    raise event
                timings[i].event(event)
                if event.finish_reason == "error":
                    reasons[i] = "error"
                    yield R.stream_error(f"generation failed: {event.error}")
                    break
                reasons[i] = event.finish_reason or reasons[i]
                pending[i].extend(event.logprobs)
                if event.text or event.finish_reason is not None:   # tokens of held-back text go with the next
                    lp = text_logprobs(pending[i] if want else None, tok, offsets[i])
                    pending[i], offsets[i] = [], offsets[i] + len(event.text)
                    yield R.text_chunk(rid, created, model, event.text, event.finish_reason, include_usage=usage_on,
                                       index=i, logprobs=lp)
            if usage_on:
                use = R.usage(n_prompt, sum(h.n_generated for h in handles), handles[0].n_cached)
                yield R.text_chunk(rid, created, model, None, use=use,
                                   include_usage=True)
            yield "[DONE]"
        finally:
            request.usage = (n_prompt, sum(h.n_generated for h in handles))
            for h, timing, reason in zip(handles, timings, reasons):
                h.cancel()
                timing.done(reason)
