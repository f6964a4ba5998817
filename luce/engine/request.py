"""One generation request: prompt, progress, output tokens, visible text and how it finished.

The output (tokens, text, stop strings, the finish rules) is a luce.engine.output_stream.
OutputStream: the one stop and end-of-generation rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from luce.engine.output_stream import OutputStream
from luce.engine.sampler import SamplingParams

WAITING, PREFILL, DECODE, FINISHED = "waiting", "prefill", "decode", "finished"


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-prob under the target and the `top` most likely (id, log-prob)."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


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
    logprobs: list | None = None         # per token: TokenLogprob (when the params asked for them)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Request:
    def __init__(self, request_id, prompt_ids: list[int], params: SamplingParams, seed: int, *,
                 tokenizer=None, eos_ids=(), ctx: int, prompt_text: str | None = None, order: int = 0,
                 vocab: int | None = None):
        """vocab: the model's (logits width); a grammar in `params` is compiled here
        (luce.engine.constraint.GrammarError when it cannot be)."""
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
        self.prefill_stops: tuple[int, ...] = ()  # prompt chunks end here (prefix cache snapshots)
        self.error: str | None = None
        self.metrics: dict[str, int] = {}
        self.out = OutputStream(params, tokenizer=tokenizer, eos_ids=eos_ids, max_total=ctx,
                                n_prompt=len(self.prompt_ids))
        self.constraint = None             # luce.engine.constraint.TokenConstraint
        if params.grammar is not None:
            from luce.engine.constraint import TokenConstraint

            self.constraint = TokenConstraint(params.grammar, tokenizer, vocab or tokenizer.vocab_size)
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None

    @property
    def finished(self) -> bool:
        return self.phase == FINISHED

    @property
    def output_ids(self) -> list[int]:
        return self.out.token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.out.finish_reason

    @property
    def stop_reason(self):
        return self.out.stop_reason

    @property
    def next_input(self) -> int:
        """The token a decode row feeds: the last sampled one."""
        return self.output_ids[-1]

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def add_tokens(self, tokens, logprobs=()) -> list[int]:
        """Take emitted tokens in order up to the one that finishes the request (the output
        rules), with their TokenLogprobs when asked for; returns those taken."""
        taken = self.out.add_many(tokens)
        if self.constraint is not None:
            self.constraint.advance(taken)
        if self.logprobs is not None:
            self.logprobs.extend(list(logprobs)[:len(taken)])
        if self.out.finish_reason is not None:
            self.phase = FINISHED
        return taken

    def finish(self, reason: str, *, error: str | None = None) -> None:
        """End from outside (cancelled, error)."""
        if self.phase == FINISHED:
            return
        self.out.finish(reason)
        self.phase = FINISHED
        self.error = error

    @property
    def text(self) -> str:
        return self.out.text

    def take_delta(self) -> str:
        return self.out.take_delta()

    def output(self) -> RequestOutput:
        return RequestOutput(self.request_id, list(self.prompt_ids), self.text, list(self.output_ids),
                             self.finish_reason, self.stop_reason, self.error, self.prompt_text,
                             self.seed, dict(self.metrics),
                             list(self.logprobs) if self.logprobs is not None else None)
