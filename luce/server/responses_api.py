"""The OpenAI Responses API: POST /v1/responses (Codex-style clients), text and function tools.

`input` (a string, or message / function_call / function_call_output items) and `instructions`
become a ChatRequest; the answer's `output` is reasoning, message and function_call items.
Streaming sends the typed events (response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta / reasoning_text.delta / function_call_arguments.delta,
their .done events, output_item.done, then response.completed or response.incomplete), each
with a sequence_number. Nothing is stored: `previous_response_id` is refused (send the whole
conversation), `store` is ignored.
"""
from __future__ import annotations

from luce.server import responses as R
from luce.server.chat_request import (ChatRequest, arguments_object, parse_tool_choice, template_tool_call,
                                      tool_definition)
from luce.server.errors import APIError, bad_request, internal
from luce.server.http import EventStream, Request, Response
from luce.server.turn import ChatTurn, GenerationFailed
from luce.server.validation import optional_field, parse_common, parse_json_body, text_field, type_name


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return text_field(content, where)
    if not isinstance(content, list):
        raise bad_request(f"must be a string or an array of parts, got {type_name(content)}", param=where)
    out = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type_name(part)
            raise bad_request(f"part type {kind!r} is not supported; only input_text / output_text",
                              param=f"{where}[{i}]")
        out.append(text_field(part.get("text"), f"{where}[{i}].text"))
    return "".join(out)


def _messages(body: dict) -> list[dict]:
    messages = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": text_field(body["instructions"], "instructions")})
    items = body.get("input")
    if items is None:
        raise bad_request("is required", param="input")
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("must be a string or a non-empty array of items", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"must be an object, got {type_name(item)}", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"role must be user, assistant, system or developer, got {str(role)[:40]!r}",
                                  param=f"{where}.role")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = template_tool_call(text_field(item.get("call_id"), f"{where}.call_id"),
                                      text_field(item.get("name"), f"{where}.name", allow_empty=False),
                                      arguments_object(item.get("arguments"), f"{where}.arguments"))
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": text_field(item.get("call_id"), f"{where}.call_id"),
                             "content": _text(output, f"{where}.output")})
        elif kind != "reasoning":
            raise bad_request(f"item type {kind!r} is not supported; send message, function_call and "
                              "function_call_output items", param=f"{where}.type")
    return messages


def parse_responses_request(body: dict, defaults) -> ChatRequest:
    if body.get("previous_response_id"):
        raise bad_request("luce stores no responses: send the whole conversation in input",
                          param="previous_response_id")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":
        raise bad_request("only the text format is supported (structured output comes later)", param="text.format")
    messages = _messages(body)
    tools = []
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type_name(tool)
            raise bad_request(f"tool type {kind!r} is not supported; only function tools", param=f"tools[{i}].type")
        tools.append(tool_definition(tool.get("name"), tool.get("description"), tool.get("parameters"),
                                     f"tools[{i}]"))
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    mode, name = parse_tool_choice(choice, tools or None)
    fields = {k: body.get(k) for k in ("model", "temperature", "top_p", "stream")}
    fields["max_tokens"] = body.get("max_output_tokens")
    gen = parse_common({k: v for k, v in fields.items() if v is not None}, "chat", "input", defaults)
    if gen.max_tokens_field == "max_tokens":
        gen.max_tokens_field = "max_output_tokens"
    parallel = optional_field(body, "parallel_tool_calls", bool, "a boolean")
    return ChatRequest(gen=gen, messages=messages, tools=tools or None, tool_choice=mode, forced_name=name,
                       parallel_tool_calls=True if parallel is None else parallel)


def _item_id(prefix: str) -> str:
    return prefix + "_" + R.new_id("x")[2:]


class _Items:
    """Parsed deltas grouped into output items, with the stream events that describe them."""

    def __init__(self):
        self.items: list[dict] = []
        self._kind: str | None = None

    def add(self, d) -> list[tuple[str, dict]]:
        events = []
        if d.kind != self._kind or d.kind == "tool_call":
            events += self.close()
            events += self._open(d)
        item, index = self.items[-1], len(self.items) - 1
        if d.kind == "reasoning":
            item["content"][0]["text"] += d.text
            events.append(("response.reasoning_text.delta", {"item_id": item["id"], "output_index": index,
                                                             "content_index": 0, "delta": d.text}))
        elif d.kind == "content":
            item["content"][0]["text"] += d.text
            events.append(("response.output_text.delta", {"item_id": item["id"], "output_index": index,
                                                          "content_index": 0, "delta": d.text, "logprobs": []}))
        else:
            item["arguments"] = d.call.arguments
            events.append(("response.function_call_arguments.delta",
                           {"item_id": item["id"], "output_index": index, "delta": d.call.arguments}))
        return events

    def _open(self, d) -> list[tuple[str, dict]]:
        self._kind = d.kind
        if d.kind == "reasoning":
            item = {"type": "reasoning", "id": _item_id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
        elif d.kind == "content":
            item = {"type": "message", "id": _item_id("msg"), "status": "in_progress", "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": []}]}
        else:
            item = {"type": "function_call", "id": _item_id("fc"), "call_id": d.call.id, "name": d.call.name,
                    "arguments": "", "status": "in_progress"}
        self.items.append(item)
        index = len(self.items) - 1
        events = [("response.output_item.added", {"output_index": index, "item": {**item, "content": []}
                                                   if "content" in item else dict(item)})]
        if d.kind == "content":
            events.append(("response.content_part.added", {"item_id": item["id"], "output_index": index,
                                                           "content_index": 0,
                                                           "part": {"type": "output_text", "text": "",
                                                                    "annotations": []}}))
        return events

    def close(self) -> list[tuple[str, dict]]:
        if self._kind is None:
            return []
        item, index = self.items[-1], len(self.items) - 1
        kind, self._kind = self._kind, None
        events = []
        if kind == "reasoning":
            events.append(("response.reasoning_text.done", {"item_id": item["id"], "output_index": index,
                                                            "content_index": 0, "text": item["content"][0]["text"]}))
        elif kind == "content":
            part = item["content"][0]
            events.append(("response.output_text.done", {"item_id": item["id"], "output_index": index,
                                                         "content_index": 0, "text": part["text"], "logprobs": []}))
            events.append(("response.content_part.done", {"item_id": item["id"], "output_index": index,
                                                          "content_index": 0, "part": part}))
        else:
            events.append(("response.function_call_arguments.done", {"item_id": item["id"], "output_index": index,
                                                                     "arguments": item["arguments"],
                                                                     "name": item["name"]}))
        if "status" in item:
            item["status"] = "completed"
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
        return events


class Responses:
    def __init__(self, app):
        self.app = app

    def _response(self, turn: ChatTurn, created: int, output: list, status: str) -> dict:
        chat = turn.chat
        return {"id": turn.request_id, "object": "response", "created_at": created, "status": status,
                "model": self.app.model_id, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": None, "parallel_tool_calls": chat.parallel_tool_calls,
                "tool_choice": chat.tool_choice if chat.tool_choice != "function" else
                {"type": "function", "name": chat.forced_name},
                "tools": [{"type": "function", **t["function"]} for t in chat.tools or ()],
                "temperature": chat.gen.sampling.get("temperature"), "top_p": chat.gen.sampling.get("top_p"),
                "max_output_tokens": chat.gen.max_tokens, "text": {"format": {"type": "text"}},
                "usage": None if status == "in_progress" else {
                    "input_tokens": turn.n_prompt, "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": turn.n_generated,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": turn.n_prompt + turn.n_generated}}

    async def create(self, request: Request):
        chat = parse_responses_request(parse_json_body(request.body), self.app.config.defaults)
        turn = await ChatTurn.start(self.app, chat, _item_id("resp"), request.received_at)
        created = R.now()
        if chat.gen.stream:
            expire = {"type": "error", "code": "unavailable", "param": None, "sequence_number": 0,
                      "message": "the server shut down before this request finished"}
            return EventStream(self._stream(turn, created, request), on_close=turn.cancel,
                               on_expire=lambda: [("error", expire)])
        items = _Items()
        try:
            async for d in turn.deltas():
                items.add(d)
        except GenerationFailed as e:
            raise internal(f"generation failed: {e}") from None
        items.close()
        request.usage = (turn.n_prompt, turn.n_generated)
        status = "incomplete" if turn.finish_reason == "length" else "completed"
        return Response.json(self._response(turn, created, items.items, status))

    async def _stream(self, turn: ChatTurn, created: int, request: Request):
        sequence = 0

        def event(name: str, payload: dict) -> tuple[str, dict]:
            nonlocal sequence
            sequence += 1
            return name, {"type": name, "sequence_number": sequence - 1, **payload}

        items = _Items()
        try:
            start = self._response(turn, created, [], "in_progress")
            yield event("response.created", {"response": start})
            yield event("response.in_progress", {"response": start})
            try:
                async for d in turn.deltas():
                    for name, payload in items.add(d):
                        yield event(name, payload)
            except (GenerationFailed, APIError) as e:
                message = e.message if isinstance(e, APIError) else f"generation failed: {e}"
                yield event("error", {"code": getattr(e, "code", None) or "server_error", "message": message,
                                      "param": None})
                return
            for name, payload in items.close():
                yield event(name, payload)
            status = "incomplete" if turn.finish_reason == "length" else "completed"
            yield event(f"response.{status}", {"response": self._response(turn, created, items.items, status)})
        finally:
            request.usage = (turn.n_prompt, turn.n_generated)
            turn.cancel()
