"""One generation request: prompt, progress, output tokens, visible text and how it finished.

Text is decoded incrementally (luce.detokenize.StreamDecoder, so every delta is whole UTF-8
characters). Stop strings end the text before the match; while a request runs, text that
could still turn into the start of a stop string is held back from deltas.
Finish rules, checked after every token, in order: a stop token id, an end-of-generation
token (unless ignore_eos), a stop string, max_tokens, the context length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from luce.engine.sampler import SamplingParams

WAITING, PREFILL, DECODE, FINISHED = "waiting", "prefill", "decode", "finished"


class FinishReason:
    STOP = "stop"            # stop token, end-of-generation token or stop string
    LENGTH = "length"        # max_tokens or the context length
    CANCELLED = "cancelled"
    ERROR = "error"          # the step failed; `error` says why


@dataclass
class RequestOutput:
    request_id: Any
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None            # None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that matched
    error: str | None = None
    prompt: str | None = None
    seed: int | None = None
    metrics: dict = field(default_factory=dict)  # admitted_step, first_token_step, finished_step

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Request:
    def __init__(self, request_id, prompt_ids: list[int], params: SamplingParams, seed: int, *,
                 tokenizer=None, eos_ids=(), ctx: int, prompt_text: str | None = None, order: int = 0):
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.seed = seed
        self.ctx = ctx
        self.prompt_text = prompt_text
        self.order = order                 # submission number: FIFO among running requests
        self.phase = WAITING
        self.slot: int | None = None
        self.n_prefilled = 0               # prompt tokens whose KV is committed
        self.output_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        self.metrics: dict[str, int] = {}
        self._eos = frozenset() if params.ignore_eos else frozenset(eos_ids)
        self._stop_ids = frozenset(params.stop_token_ids)
        self._decoder = None
        if tokenizer is not None:
            from luce.detokenize import StreamDecoder

            self._decoder = StreamDecoder(tokenizer)
        self._text = ""
        self._emitted = 0

    @property
    def finished(self) -> bool:
        return self.phase == FINISHED

    @property
    def next_input(self) -> int:
        """The token a decode row feeds: the last sampled one."""
        return self.output_ids[-1]

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    # ---- progress ---------------------------------------------------------------------------
    def add_token(self, token: int) -> None:
        """Append a sampled token and finish the request if a rule says so."""
        self.output_ids.append(int(token))
        if token in self._stop_ids:
            return self.finish(FinishReason.STOP, stop_reason=int(token))
        if token in self._eos:
            return self.finish(FinishReason.STOP)
        if self._decoder is not None:
            before = len(self._text)
            self._text += self._decoder.push(token)
            if self._match_stop_string(before):
                return
        if len(self.output_ids) >= self.params.max_tokens or self.n_tokens >= self.ctx:
            self.finish(FinishReason.LENGTH)

    def _match_stop_string(self, before: int) -> bool:
        stops = self.params.stop
        if not stops:
            return False
        lo = max(0, before - max(len(s) for s in stops) + 1)
        hits = [(i, s) for s in stops if (i := self._text.find(s, lo)) >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self._text = self._text[:index]
        self.finish(FinishReason.STOP, stop_reason=stop, flush=False)
        return True

    def finish(self, reason: str, *, stop_reason=None, error: str | None = None, flush: bool = True) -> None:
        if self.phase == FINISHED:
            return
        if flush and self._decoder is not None:
            self._text += self._decoder.flush()
        self.phase = FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.error = error

    # ---- text -------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """Text so far (final once finished); stop strings already cut."""
        return self._text

    def _visible_len(self) -> int:
        if self.finished or not self.params.stop:
            return len(self._text)
        hold = 0
        for s in self.params.stop:
            for k in range(min(len(s) - 1, len(self._text)), hold, -1):
                if self._text.endswith(s[:k]):
                    hold = k
                    break
        return len(self._text) - hold

    def take_delta(self) -> str:
        """Text not yet returned by take_delta that can no longer change."""
        end = max(self._emitted, self._visible_len())
        delta = self._text[self._emitted:end]
        self._emitted = end
        return delta

    def output(self) -> RequestOutput:
        return RequestOutput(self.request_id, list(self.prompt_ids), self._text, list(self.output_ids),
                             self.finish_reason, self.stop_reason, self.error, self.prompt_text,
                             self.seed, dict(self.metrics))
