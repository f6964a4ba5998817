"""Submitting a generation to the engine bridge: the context check, max_tokens, admission, metrics.

    handle, n_prompt = submit(app, gen, prompt_ids, "chatcmpl-...")   # 400 / 429 as APIError
    timing = Timing(app.metrics, request.received_at)                  # TTFT, ITL, totals
"""
from __future__ import annotations

import asyncio
import dataclasses

from luce.server.bridge import GenerationEvent, QueueFullError, RequestHandle
from luce.server.errors import bad_request, queue_full
from luce.server.validation import GenerationRequest

CTX_FLAG = "luce-serve --ctx (bounded by --kv-memory)"


def submit(app, gen: GenerationRequest, ids: list[int], request_id: str, *, max_tokens: int | None = None,
           count_prompt: bool = True, choice: int = 0) -> tuple[RequestHandle, int]:
    """Queue `ids`; max_tokens defaults to the request's, clamped to the room the context leaves.
    choice i of n: the request's seed + i when it gave one (else the engine draws distinct seeds)."""
    bridge = app.require_bridge()
    n_ctx = bridge.info.n_ctx
    if not ids:
        raise bad_request("encodes to no tokens: send some text", param=gen.prompt_field)
    if len(ids) >= n_ctx:
        app.metrics.rejected.inc(reason="prompt_too_long")
        raise bad_request(f"the prompt is {len(ids)} tokens but the context holds {n_ctx}, including at least "
                          f"one generated token: shorten it, or raise {CTX_FLAG}",
                          param=gen.prompt_field, code="context_length_exceeded")
    room = n_ctx - len(ids)
    wanted = gen.max_tokens if max_tokens is None else max_tokens
    params = gen.sampling_params(room if wanted is None else min(wanted, room))
    vocab = bridge.tokenizer.vocab_size
    for token, _ in params.logit_bias:
        if token >= vocab:
            raise bad_request(f"token id {token} is outside the vocabulary (0..{vocab - 1})", param="logit_bias")
    if choice and params.seed is not None:
        params = dataclasses.replace(params, seed=(params.seed + choice) & ((1 << 64) - 1))
    try:
        handle = bridge.submit(ids, params, request_id)
    except QueueFullError as e:
        app.metrics.rejected.inc(reason="queue_full")
        raise queue_full(e.retry_after) from None
    if count_prompt:
        app.metrics.prompt_tokens.inc(len(ids))
    return handle, len(ids)


class Timing:
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
