"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens (Claude Code,
the anthropic SDK). Requests become a ChatRequest (system, text, tool_use / tool_result and
thinking blocks -> template messages); answers are content blocks (thinking, text, tool_use),
stop_reason and usage, or the event stream: message_start, ping, content_block_start / delta /
stop per block, message_delta (stop_reason, usage), message_stop. Errors use Anthropic's shape
({"type": "error", "error": {...}}: app.py). Auth: `x-api-key` or a bearer token.
"""
from __future__ import annotations

import json

from luce.server import responses as R
from luce.server.chat_request import (ChatRequest, arguments_object, template_tool_call, tool_definition)
from luce.server.errors import APIError, bad_request, internal
from luce.server.http import EventStream, Request, Response
from luce.server.turn import ChatTurn, GenerationFailed, render_prompt
from luce.server.validation import parse_common, parse_json_body, text_field, type_name

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "cancelled": "end_turn"}


# ---------------------------------------------------------------------------- request

def _text_blocks(content, where: str) -> str:
    """A string, or text blocks joined (other block kinds are refused by the callers first)."""
    if isinstance(content, str):
        return text_field(content, where)
    if not isinstance(content, list):
        raise bad_request(f"must be a string or an array of content blocks, got {type_name(content)}", param=where)
    parts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type_name(block)
            raise bad_request(f"block type {kind!r} is not supported here; only 'text'", param=f"{where}[{i}]")
        parts.append(text_field(block.get("text"), f"{where}[{i}].text"))
    return "".join(parts)


def _blocks(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": text_field(content, where)}]
    if not isinstance(content, list):
        raise bad_request(f"must be a string or an array of content blocks, got {type_name(content)}", param=where)
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise bad_request(f"must be an object, got {type_name(block)}", param=f"{where}[{i}]")
    return content


def _user(content, where: str) -> list[dict]:
    """One user turn -> tool result messages (in order), then the user's text."""
    out, text = [], []
    for i, block in enumerate(_blocks(content, where)):
        kind, w = block.get("type"), f"{where}[{i}]"
        if kind == "text":
            text.append(text_field(block.get("text"), f"{w}.text"))
        elif kind == "tool_result":
            result = block.get("content", "")
            body = _text_blocks(result, f"{w}.content") if result is not None else ""
            if block.get("is_error"):
                body = f"Error: {body}"
            out.append({"role": "tool", "tool_call_id": text_field(block.get("tool_use_id"), f"{w}.tool_use_id"),
                        "content": body})
        else:
            raise bad_request(f"block type {kind!r} is not supported; luce reads text and tool_result blocks "
                              "(no images or documents yet)", param=f"{w}.type")
    if text:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(content, where: str) -> dict:
    message: dict = {"role": "assistant", "content": ""}
    text, calls, thinking = [], [], []
    for i, block in enumerate(_blocks(content, where)):
        kind, w = block.get("type"), f"{where}[{i}]"
        if kind == "text":
            text.append(text_field(block.get("text"), f"{w}.text"))
        elif kind == "tool_use":
            calls.append(template_tool_call(text_field(block.get("id"), f"{w}.id"),
                                            text_field(block.get("name"), f"{w}.name", allow_empty=False),
                                            arguments_object(block.get("input", {}), f"{w}.input")))
        elif kind == "thinking":
            thinking.append(text_field(block.get("thinking", ""), f"{w}.thinking"))
        elif kind != "redacted_thinking":
            raise bad_request(f"block type {kind!r} is not supported in assistant turns", param=f"{w}.type")
    message["content"] = "".join(text)
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return message


def _tool_choice(value, tools) -> tuple[str, str | None, bool]:
    """(mode, forced name, parallel) from {"type": auto|any|tool|none, "name", "disable_parallel_tool_use"}."""
    if value is None:
        return "auto", None, True
    if not isinstance(value, dict):
        raise bad_request(f"must be an object like {{\"type\": \"auto\"}}, got {type_name(value)}", param="tool_choice")
    kind = value.get("type")
    parallel = not value.get("disable_parallel_tool_use", False)
    if kind == "tool":
        name = value.get("name")
        if name not in [t["function"]["name"] for t in tools or ()]:
            raise bad_request(f"names {str(name)[:60]!r}, which is not among the tools", param="tool_choice.name")
        return "function", name, parallel
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in modes:
        raise bad_request(f"type must be auto, any, tool or none, got {str(kind)[:40]!r}", param="tool_choice.type")
    if kind == "any" and not tools:
        raise bad_request("is 'any' but no tools were given", param="tool_choice")
    return modes[kind], None, parallel


def parse_messages_request(body: dict, defaults, for_counting: bool = False) -> ChatRequest:
    messages = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text_blocks(system, "system")})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise bad_request("must be a non-empty array of messages", param="messages")
    for i, msg in enumerate(turns):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"must be an object, got {type_name(msg)}", param=where)
        role = msg.get("role")
        if role == "user":
            messages += _user(msg.get("content"), f"{where}.content")
        elif role == "assistant":
            messages.append(_assistant(msg.get("content"), f"{where}.content"))
        else:
            raise bad_request(f"role must be 'user' or 'assistant', got {str(role)[:40]!r}", param=f"{where}.role")
    tools = None
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise bad_request("must be an array of tools", param="tools")
        tools = []
        for i, tool in enumerate(body["tools"]):
            if not isinstance(tool, dict):
                raise bad_request("must be an object", param=f"tools[{i}]")
            if tool.get("type") not in (None, "custom"):
                raise bad_request(f"server tool {tool.get('type')!r} is not supported; define client tools "
                                  "with name, description and input_schema", param=f"tools[{i}].type")
            tools.append(tool_definition(tool.get("name"), tool.get("description"), tool.get("input_schema"),
                                         f"tools[{i}]"))
    mode, name, parallel = _tool_choice(body.get("tool_choice"), tools)
    if for_counting:
        sampling = {"max_tokens": 1}
    else:
        if body.get("max_tokens") is None:
            raise bad_request("is required", param="max_tokens")
        sampling = {k: body.get(k) for k in ("model", "max_tokens", "temperature", "top_p", "top_k", "stream")}
        sampling["stop"] = body.get("stop_sequences")
    gen = parse_common({k: v for k, v in sampling.items() if v is not None}, "chat", "messages", defaults)
    kwargs, budget = {}, None
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        kwargs["enable_thinking"], budget = False, 0
    elif isinstance(thinking, dict) and thinking.get("type") == "enabled":
        kwargs["enable_thinking"] = True
        if isinstance(thinking.get("budget_tokens"), int) and thinking["budget_tokens"] > 0:
            budget = thinking["budget_tokens"]
    return ChatRequest(gen=gen, messages=messages, tools=tools, tool_choice=mode, forced_name=name,
                       parallel_tool_calls=parallel, template_kwargs=kwargs, reasoning_budget=budget)


# ---------------------------------------------------------------------------- answers

def _block(delta) -> dict:
    if delta.kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if delta.kind == "tool_call":
        return {"type": "tool_use", "id": "toolu_" + delta.call.id[5:], "name": delta.call.name, "input": {}}
    return {"type": "text", "text": ""}


def _block_delta(delta) -> dict:
    if delta.kind == "reasoning":
        return {"type": "thinking_delta", "thinking": delta.text}
    if delta.kind == "tool_call":
        return {"type": "input_json_delta", "partial_json": delta.call.arguments}
    return {"type": "text_delta", "text": delta.text}


def _stop(turn: ChatTurn) -> tuple[str, str | None]:
    if turn.stop_string is not None:
        return "stop_sequence", turn.stop_string
    return STOP_REASONS.get(turn.finish_reason or "stop", "end_turn"), None


def _error_event(e: Exception) -> tuple[str, dict]:
    if isinstance(e, APIError):
        return "error", json.loads(e.anthropic_body_bytes())
    return "error", {"type": "error", "error": {"type": "api_error", "message": f"generation failed: {e}"}}


class Messages:
    def __init__(self, app):
        self.app = app

    async def count_tokens(self, request: Request) -> Response:
        chat = parse_messages_request(parse_json_body(request.body), self.app.config.defaults, for_counting=True)
        tokenizer = self.app.require_bridge().tokenizer
        text, _, _ = render_prompt(tokenizer, chat, self.app.config.chat)
        return Response.json({"input_tokens": len(tokenizer.encode(text))})

    async def create(self, request: Request):
        chat = parse_messages_request(parse_json_body(request.body), self.app.config.defaults)
        turn = await ChatTurn.start(self.app, chat, "msg_" + R.new_id("x")[2:], request.received_at)
        if chat.gen.stream:
            expire = APIError(503, "the server shut down before this request finished", type="overloaded_error")
            return EventStream(self._stream(turn, request), on_close=turn.cancel,
                               on_expire=lambda: [_error_event(expire)])
        blocks = []
        try:
            async for d in turn.deltas():
                if blocks and d.kind == blocks[-1][0] and d.kind != "tool_call":
                    blocks[-1][1].append(d)
                else:
                    blocks.append((d.kind, [d]))
        except GenerationFailed as e:
            raise internal(f"generation failed: {e}") from None
        content = []
        for kind, ds in blocks:
            if kind == "reasoning":
                content.append({"type": "thinking", "thinking": "".join(d.text for d in ds), "signature": ""})
            elif kind == "tool_call":
                block = _block(ds[0])
                content.append({**block, "input": ds[0].call.input})
            else:
                content.append({"type": "text", "text": "".join(d.text for d in ds)})
        request.usage = (turn.n_prompt, turn.n_generated)
        reason, sequence = _stop(turn)
        return Response.json({"id": turn.request_id, "type": "message", "role": "assistant", "model": self.app.model_id,
                              "content": content, "stop_reason": reason, "stop_sequence": sequence,
                              "usage": {"input_tokens": turn.n_prompt, "output_tokens": turn.n_generated}})

    async def _stream(self, turn: ChatTurn, request: Request):
        message = {"id": turn.request_id, "type": "message", "role": "assistant", "model": self.app.model_id,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": turn.n_prompt, "output_tokens": 0}}
        index, open_kind = -1, None
        try:
            yield "message_start", {"type": "message_start", "message": message}
            yield "ping", {"type": "ping"}
            try:
                async for d in turn.deltas():
                    if d.kind != open_kind or d.kind == "tool_call":
                        if open_kind is not None:
                            yield _block_stop(index)
                        index, open_kind = index + 1, d.kind
                        yield "content_block_start", {"type": "content_block_start", "index": index,
                                                      "content_block": _block(d)}
                    yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                                  "delta": _block_delta(d)}
            except (GenerationFailed, APIError) as e:
                yield _error_event(e)
                return
            if open_kind is not None:
                yield _block_stop(index)
            reason, sequence = _stop(turn)
            yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                    "usage": {"output_tokens": turn.n_generated}}
            yield "message_stop", {"type": "message_stop"}
        finally:
            request.usage = (turn.n_prompt, turn.n_generated)
            turn.cancel()


def _block_stop(index: int) -> tuple[str, dict]:
    return "content_block_stop", {"type": "content_block_stop", "index": index}
