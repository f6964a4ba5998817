"""An assistant turn's text -> reasoning, content and tool calls, as it streams.

    out = AssistantOutput(reasoning=True, in_reasoning=prompt_opened_think, tools=tools, fmt=HERMES)
    for delta in out.push(text_delta): ...        # Delta("reasoning" | "content" | "tool_call", ...)
    for delta in out.finish(): ...

Reasoning (`--reasoning-format deepseek`, DeepSeek-R1 / Qwen3 style): a `<think>` at the very
start of the output (or a prompt that already opened one, as Qwen3.5 templates do) begins
reasoning text, which `</think>` ends; it is `reasoning_content`, never content, and tool calls
inside it are not parsed. With reasoning off (`none`) the tags stay in the content.
"""
from __future__ import annotations

from dataclasses import dataclass

from luce.server.tool_calls import HERMES, ToolCall, ToolCallExtractor, partial_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Delta:
    kind: str                          # "reasoning" | "content" | "tool_call"
    text: str = ""
    call: ToolCall | None = None


class ReasoningSplitter:
    """Text -> ("reasoning", s) / ("content", s) pieces; holds back partial think tags."""

    def __init__(self, in_reasoning: bool = False):
        self.in_reasoning = in_reasoning
        self._decided = in_reasoning   # whether the start of the output was seen
        self._text = ""
        self.ended = False             # a reasoning block was closed
        self._content_started = False

    def push(self, text: str) -> list[tuple[str, str]]:
        self._text += text
        out: list[tuple[str, str]] = []
        if not self._decided:
            head = self._text.lstrip()
            if not head or (THINK_OPEN.startswith(head) and len(head) < len(THINK_OPEN)):
                return out                       # still could be "<think>"
            self._decided = True
            if head.startswith(THINK_OPEN):
                self.in_reasoning = True
                self._text = head[len(THINK_OPEN):]
        if self.in_reasoning:
            end = self._text.find(THINK_CLOSE)
            if end < 0:
                keep = partial_suffix(self._text, (THINK_CLOSE,))
                if len(self._text) > keep:
                    out.append(("reasoning", self._text[:len(self._text) - keep]))
                self._text = self._text[len(self._text) - keep:]
                return out
            if end:
                out.append(("reasoning", self._text[:end]))
            self._text = self._text[end + len(THINK_CLOSE):]
            self.in_reasoning = False
            self.ended = True
        if self.ended and not self._content_started:     # the blank lines after </think>
            self._text = self._text.lstrip()
        if self._text:
            out.append(("content", self._text))
            self._content_started = True
        self._text = ""
        return out

    def finish(self) -> list[tuple[str, str]]:
        text, self._text = self._text, ""
        if not text:
            return []
        return [("reasoning" if self.in_reasoning else "content", text)]


class AssistantOutput:
    """Reasoning split (optional), then tool-call extraction (when tools are offered)."""

    def __init__(self, *, reasoning: bool, in_reasoning: bool = False, tools: list[dict] | None = None,
                 fmt: str | None = HERMES):
        self.splitter = ReasoningSplitter(in_reasoning) if reasoning else None
        self.extractor = ToolCallExtractor(tools, fmt) if tools else None
        self.reasoning = ""
        self.content = ""
        self.calls: list[ToolCall] = []

    @property
    def in_reasoning(self) -> bool:
        return self.splitter is not None and self.splitter.in_reasoning

    def push(self, text: str) -> list[Delta]:
        pieces = self.splitter.push(text) if self.splitter is not None else [("content", text)]
        return self._route(pieces, final=False)

    def finish(self) -> list[Delta]:
        pieces = self.splitter.finish() if self.splitter is not None else []
        return self._route(pieces, final=True)

    def _route(self, pieces, final: bool) -> list[Delta]:
        out: list[Delta] = []
        for kind, text in pieces:
            if kind == "reasoning":
                out.append(Delta("reasoning", text))
            elif self.extractor is None:
                out.append(Delta("content", text))
            else:
                out += [self._delta(k, v) for k, v in self.extractor.push(text)]
        if final and self.extractor is not None:
            out += [self._delta(k, v) for k, v in self.extractor.finish()]
        for d in out:
            if d.kind == "reasoning":
                self.reasoning += d.text
            elif d.kind == "content":
                self.content += d.text
            else:
                self.calls.append(d.call)
        return [d for d in out if d.text or d.call is not None]

    @staticmethod
    def _delta(kind: str, value) -> Delta:
        return Delta("tool_call", call=value) if kind == "tool_call" else Delta("content", value)
