"""One assistant turn: the prompt through the chat template, generation, and its output parsed.

    turn = await ChatTurn.start(app, chat_request, "chatcmpl-...", arrival)
    async for delta in turn.deltas():       # Delta: reasoning / content / tool_call
        ...
    turn.finish_reason, turn.calls, turn.n_prompt, turn.n_generated

Tools go to the template unless tool_choice is 'none' (then nothing is parsed as a call
either). tool_choice 'required' or a named function: the prompt ends with the start of a call
(`<tool_call>`, and the function's name) and a grammar forces the rest of the call, its
arguments by the tool's schema (luce.server.structured); the result is still checked (a turn
cut by max_tokens or a stop string can lack the call: an error). response_format is a grammar
too. A grammar and thinking do not mix: when the prompt opens a think block and the turn is
constrained, the block is closed at once (as reasoning budget 0).

Reasoning budget (llama-server's --reasoning-budget): -1 unlimited; 0 thinking off (the
template's `enable_thinking` false, and a think block the prompt opens is closed at once); N
generates at most N tokens first; if the model is still thinking then, the server closes the
think block (`</think>`) and generation goes on as a continuation of the same sequence
(prompt + the N tokens + the closing text, same seed, so sampling draws stay those of the
positions). No engine hook: the continuation is a new engine request whose prompt is
prefilled again (a cost of N + prompt tokens once, and only when the budget is reached).
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from luce.server.assistant_output import THINK_CLOSE, THINK_OPEN, AssistantOutput, Delta
from luce.server.chat_request import ChatRequest
from luce.server.errors import APIError, bad_request
from luce.server.submit import Timing, submit
from luce.server.structured import forced_call_grammar
from luce.server.tool_calls import ToolCall, forced_prefix, template_format

BUDGET_CLOSE = "\n" + THINK_CLOSE + "\n\n"


@dataclass(frozen=True)
class ChatSettings:
    """Server-wide chat defaults (luce-serve --reasoning-format / --reasoning-budget)."""
    reasoning_format: str = "deepseek"   # none | deepseek | auto (= deepseek)
    reasoning_budget: int = -1           # -1 unlimited, 0 off, N > 0 tokens


class GenerationFailed(Exception):
    """The engine ended the request with an error (its cohort was retired)."""


def tool_choice_error(mode: str, name: str | None) -> APIError:
    wanted = f"a call of {name!r}" if name else "a tool call"
    return APIError(500, f"tool_choice asked for {wanted} but the turn ended without one (max_tokens or a stop "
                         "string cut the grammar-forced call): raise max_tokens, or drop the stop strings",
                    type="server_error", code="tool_call_not_produced")


def render_prompt(tokenizer, chat: ChatRequest, settings: ChatSettings,
                  constrained: bool = False) -> tuple[str, bool, str | None]:
    """(prompt text, whether generation starts inside a think block, tool-call format);
    constrained: a grammar decides the output (no thinking)."""
    tools = chat.tools if chat.tool_choice != "none" else None
    fmt = template_format(tokenizer.chat_template) if tools else None
    if tools and fmt is None:
        raise bad_request("this model's chat template has no tool-call format luce can parse (Hermes "
                          "<tool_call> JSON or Qwen3 XML): send the request without tools", param="tools")
    kwargs = dict(chat.template_kwargs)
    budget = settings.reasoning_budget if chat.reasoning_budget is None else chat.reasoning_budget
    if budget == 0 or constrained:
        kwargs.setdefault("enable_thinking", False)
    try:
        text = tokenizer.apply_chat_template(chat.messages, add_generation_prompt=True, tools=tools, **kwargs)
    except Exception as e:
        raise bad_request(f"the model's chat template rejected the messages: {e}", param="messages") from None
    reasoning = (chat.reasoning_format or settings.reasoning_format) != "none"
    in_reasoning = reasoning and text.rstrip().endswith(THINK_OPEN)
    if in_reasoning and (budget == 0 or constrained):
        text += BUDGET_CLOSE
        in_reasoning = False
    return text, in_reasoning, fmt


class ChatTurn:
    def __init__(self, app, chat: ChatRequest, request_id: str, timing: Timing, choice: int = 0):
        self.app = app
        self.choice = choice                  # index among the request's n choices
        self.chat = chat
        self.request_id = request_id
        self.timing = timing
        self.settings: ChatSettings = app.config.chat
        self.handle = None
        self.output: AssistantOutput | None = None   # the parser (set by start)
        self.n_prompt = 0
        self._first_cached: int | None = None
        self.finish_reason: str | None = None
        self.calls: list[ToolCall] = []
        self.stop_string: str | None = None   # the stop string that ended the turn, if one did
        self._done_tokens = 0                 # generated by finished phases
        self._ids: list[int] = []
        self._output_ids: list[int] = []
        self.logprobs: list | None = [] if chat.gen.sampling.get("logprobs") is not None else None
        self._logprobs_sent = 0

    @classmethod
    async def start(cls, app, chat: ChatRequest, request_id: str, arrival: float, choice: int = 0) -> "ChatTurn":
        """Render, tokenize (worker thread) and submit; raises APIError (400, 429) before any work."""
        turn = cls(app, chat, request_id, Timing(app.metrics, arrival), choice)
        bridge = app.require_bridge()
        forced = bool(chat.tools) and chat.tool_choice in ("required", "function")
        constrained = forced or chat.gen.sampling.get("grammar") is not None
        text, in_reasoning, fmt = render_prompt(bridge.tokenizer, chat, turn.settings, constrained)
        prefix = ""
        if fmt and forced:
            prefix = forced_prefix(fmt, chat.forced_name)
            chat.gen.sampling["grammar"] = forced_call_grammar(fmt, chat.tools, chat.forced_name,
                                                               chat.parallel_tool_calls)
        turn.output = AssistantOutput(reasoning=(chat.reasoning_format or turn.settings.reasoning_format) != "none",
                                      in_reasoning=in_reasoning, fmt=fmt,
                                      tools=chat.tools if chat.tool_choice != "none" else None)
        turn._ids = await asyncio.to_thread(bridge.tokenizer.encode, text + prefix)
        turn._pending = turn.output.push(prefix) if prefix else []
        budget = turn.settings.reasoning_budget if chat.reasoning_budget is None else chat.reasoning_budget
        turn._budget = budget if budget > 0 and turn.output.splitter is not None and not constrained else None
        if turn._budget is not None and chat.gen.sampling.get("seed") is None:
            chat.gen.sampling["seed"] = random.getrandbits(63)   # one seed across the phases
        turn.handle, turn.n_prompt = submit(app, chat.gen, turn._ids, request_id,
                                            max_tokens=turn._phase_max(chat.gen.max_tokens), choice=choice)
        return turn

    def _phase_max(self, wanted: int | None) -> int | None:
        if self._budget is None:
            return wanted
        return self._budget if wanted is None else min(wanted, self._budget)

    @property
    def n_cached(self) -> int:
        """Prompt tokens the prefix cache served (the first submission's)."""
        return self._first_cached if self._first_cached is not None else (
            self.handle.n_cached if self.handle is not None else 0)

    @property
    def n_generated(self) -> int:
        return self._done_tokens + (self.handle.n_generated if self.handle is not None else 0)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()

    async def deltas(self):
        """Parsed output as it comes; raises GenerationFailed, or APIError when tool_choice
        forced a call that did not come. Sets finish_reason at the end."""
        reason = "cancelled"
        try:
            for d in self._pending:
                yield d
            while True:
                phase_reason = None
                async for event in self.handle:
                    self.timing.event(event)
                    self._output_ids += event.token_ids
                    if self.logprobs is not None:
                        self.logprobs.extend(event.logprobs)
                    if event.finish_reason == "error":
                        reason = "error"
                        raise GenerationFailed(event.error or "engine error")
                    for d in self._admit(self.output.push(event.text)):
                        yield d
                    phase_reason = event.finish_reason or phase_reason
                if not self._continue(phase_reason):
                    reason = phase_reason or "cancelled"
                    break
                if self.output.in_reasoning:
                    for d in self._admit(self.output.push(BUDGET_CLOSE)):
                        yield d
                    self._output_ids += self.app.bridge.tokenizer.encode(BUDGET_CLOSE)
                self._next_phase()
            for d in self._admit(self.output.finish()):
                yield d
            if self.chat.tool_choice in ("required", "function") and reason in ("stop", "length"):
                if not self.calls or (self.chat.forced_name and self.calls[0].name != self.chat.forced_name):
                    raise tool_choice_error(self.chat.tool_choice, self.chat.forced_name)
            self.stop_string = self.handle.stop_string
            self.finish_reason = "tool_calls" if self.calls and reason == "stop" else reason
        finally:
            self.cancel()
            self.timing.done(reason)

    def take_logprobs(self) -> list | None:
        """The log-probs not yet sent (a stream chunk's); None when the request did not ask."""
        if self.logprobs is None:
            return None
        out = self.logprobs[self._logprobs_sent:]
        self._logprobs_sent = len(self.logprobs)
        return out

    def _admit(self, deltas: list[Delta]) -> list[Delta]:
        """Drop calls past the first when parallel_tool_calls is false."""
        out = []
        for d in deltas:
            if d.kind == "tool_call":
                if self.calls and not self.chat.parallel_tool_calls:
                    continue
                self.calls.append(d.call)
            out.append(d)
        return out

    def _continue(self, phase_reason: str | None) -> bool:
        """After a phase: go on only when the budget (not max_tokens) cut it."""
        if self._budget is None or phase_reason != "length":
            return False
        wanted = self.chat.gen.max_tokens
        room = self.app.bridge.info.n_ctx - len(self._ids) - len(self._output_ids) - len(BUDGET_CLOSE)
        return room > 1 and (wanted is None or self.n_generated < wanted)

    def _next_phase(self) -> None:
        self._done_tokens += self.handle.n_generated
        if self._first_cached is None:
            self._first_cached = self.handle.n_cached
        self._budget = None                   # the budget applies once
        wanted = self.chat.gen.max_tokens
        ids = self._ids + self._output_ids
        self.handle, _ = submit(self.app, self.chat.gen, ids, self.request_id + "-cont",
                                max_tokens=None if wanted is None else wanted - self._done_tokens,
                                count_prompt=False, choice=self.choice)
