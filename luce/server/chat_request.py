"""A chat turn to generate, whichever API asked for it, and the OpenAI chat body that makes one.

`ChatRequest` is what the three chat APIs (OpenAI chat completions, Anthropic Messages, OpenAI
Responses) reduce to: template-ready messages (Hugging Face shape: tool calls with arguments as
objects, `tool` role results), tools as OpenAI function definitions, the tool choice, template
variables and the generation fields. `parse_chat` builds one from a /v1/chat/completions body,
naming the offending field in every 400.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from luce.server.errors import bad_request
from luce.engine.sampler import LOGPROBS_MAX
from luce.server.validation import (Defaults, GenerationRequest, integer_field, optional_field, parse_common,
                                    text_field, type_name)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_MESSAGES = 4096
MAX_TOOLS = 512
REASONING_FORMATS = ("none", "deepseek", "auto")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


@dataclass
class ChatRequest:
    gen: GenerationRequest
    messages: list[dict]
    tools: list[dict] | None = None          # [{"type": "function", "function": {name, description, parameters}}]
    tool_choice: str = "auto"                # auto | none | required | function (then forced_name)
    forced_name: str | None = None
    parallel_tool_calls: bool = True
    template_kwargs: dict = field(default_factory=dict)
    reasoning_format: str | None = None      # None: the server's --reasoning-format
    reasoning_budget: int | None = None      # None: the server's --reasoning-budget


# ---------------------------------------------------------------------------- tools

def tool_definition(name, description, parameters, where: str) -> dict:
    """One OpenAI function tool, checked; `where` names the field in errors."""
    name = text_field(name, f"{where}.name", allow_empty=False)
    if not _TOOL_NAME.match(name):
        raise bad_request(f"{name[:60]!r} is not a valid tool name: use 1-128 letters, digits, '_', '-', '.', ':'",
                          param=f"{where}.name")
    function = {"name": name}
    if description is not None:
        function["description"] = text_field(description, f"{where}.description")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise bad_request(f"must be a JSON schema object, got {type_name(parameters)}", param=f"{where}.parameters")
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def parse_tools(value, where: str = "tools") -> list[dict] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(f"must be an array of tools, got {type_name(value)}", param=where)
    if len(value) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools, got {len(value)}", param=where)
    tools, names = [], set()
    for i, tool in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"must be an object, got {type_name(tool)}", param=w)
        if tool.get("type", "function") != "function":
            raise bad_request(f"tool type {tool.get('type')!r} is not supported; only 'function'", param=f"{w}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_request("must be an object with name, description and parameters", param=f"{w}.function")
        tools.append(tool_definition(fn.get("name"), fn.get("description"), fn.get("parameters"), f"{w}.function"))
        name = tools[-1]["function"]["name"]
        if name in names:
            raise bad_request(f"tool {name!r} is defined twice", param=f"{w}.function.name")
        names.add(name)
    return tools or None


def parse_tool_choice(value, tools: list[dict] | None, where: str = "tool_choice") -> tuple[str, str | None]:
    """(mode, forced function name). Strings: auto, none, required; or {"type": "function",
    "function": {"name": ...}}."""
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise bad_request(f"must be 'auto', 'none', 'required' or a function, got {value[:40]!r}", param=where)
        if value == "required" and not tools:
            raise bad_request("is 'required' but no tools were given", param=where)
        return value, None
    if isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function") if isinstance(value.get("function"), dict) else value
        name = fn.get("name")
        if not isinstance(name, str):
            raise bad_request("must name the function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                              param=where)
        known = [t["function"]["name"] for t in tools or ()]
        if name not in known:
            raise bad_request(f"names {name[:60]!r}, which is not among the tools ({', '.join(known) or 'none'})",
                              param=where)
        return "function", name
    raise bad_request(f"must be a string or a function object, got {type_name(value)}", param=where)


# ---------------------------------------------------------------------------- messages

def _content(content, where: str) -> str:
    if isinstance(content, str):
        return text_field(content, where)
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            pw = f"{where}[{i}]"
            if not isinstance(part, dict):
                raise bad_request(f"must be an object, got {type_name(part)}", param=pw)
            if part.get("type") not in ("text", "input_text", "output_text"):
                raise bad_request(f"content part type {part.get('type')!r} is not supported; only 'text'",
                                  param=f"{pw}.type")
            texts.append(text_field(part.get("text"), f"{pw}.text"))
        return "".join(texts)
    raise bad_request(f"must be a string or an array of text parts, got {type_name(content)}", param=where)


def arguments_object(arguments, where: str) -> dict:
    """A tool call's arguments (JSON text or an object) as the object templates expect."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}
    if not isinstance(arguments, str):
        raise bad_request(f"must be a JSON object as a string, got {type_name(arguments)}", param=where)
    try:
        value = json.loads(arguments)
    except ValueError as e:
        raise bad_request(f"is not valid JSON ({e}): send the arguments the model produced", param=where) from None
    if not isinstance(value, dict):
        raise bad_request(f"must encode a JSON object, got {type_name(value)}", param=where)
    return value


def template_tool_call(call_id: str | None, name: str, arguments: dict) -> dict:
    """An assistant tool call as chat templates read it."""
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id:
        out["id"] = call_id
    return out


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request(f"must be an array, got {type_name(calls)}", param=where)
    out = []
    for j, call in enumerate(calls):
        w = f"{where}[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise bad_request("must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", param=w)
        fn = call["function"]
        name = text_field(fn.get("name"), f"{w}.function.name", allow_empty=False)
        call_id = call.get("id")
        if call_id is not None:
            text_field(call_id, f"{w}.id")
        out.append(template_tool_call(call_id, name, arguments_object(fn.get("arguments"), f"{w}.function.arguments")))
    return out


def chat_messages(messages) -> list[dict]:
    """OpenAI chat messages -> template messages (400 naming the field for anything wrong)."""
    if messages is None:
        raise bad_request("is required", param="messages")
    if not isinstance(messages, list):
        raise bad_request(f"must be an array of messages, got {type_name(messages)}", param="messages")
    if not messages:
        raise bad_request("must contain at least one message", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"at most {MAX_MESSAGES} messages, got {len(messages)}", param="messages")
    clean = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"must be an object, got {type_name(msg)}", param=where)
        role = msg.get("role")
        if not isinstance(role, str):
            raise bad_request(f"must be a string, got {type_name(role)}", param=f"{where}.role")
        if role not in CHAT_ROLES:
            raise bad_request(f"unknown role {role[:40]!r}; expected one of {', '.join(CHAT_ROLES)}",
                              param=f"{where}.role")
        content = msg.get("content")
        out = {"role": "system" if role == "developer" else role}
        if role == "assistant":
            out["content"] = "" if content is None else _content(content, f"{where}.content")
            if msg.get("tool_calls"):
                out["tool_calls"] = _tool_calls(msg["tool_calls"], f"{where}.tool_calls")
            reasoning = msg.get("reasoning_content")
            if reasoning is not None:
                out["reasoning_content"] = text_field(reasoning, f"{where}.reasoning_content")
        else:
            out["content"] = _content(content, f"{where}.content")
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if msg.get(key) is not None:
                    out[key] = text_field(msg[key], f"{where}.{key}")
        clean.append(out)
    return clean


def template_kwargs(value, where: str = "chat_template_kwargs") -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"must be an object, got {type_name(value)}", param=where)
    reserved = {"messages", "tools", "add_generation_prompt", "documents"} & set(value)
    if reserved:
        raise bad_request(f"may not set {', '.join(sorted(reserved))}: send those as request fields", param=where)
    return dict(value)


def parse_reasoning_format(value, where: str = "reasoning_format") -> str | None:
    if value is None:
        return None
    if value not in REASONING_FORMATS:
        raise bad_request(f"must be one of {', '.join(REASONING_FORMATS)}, got {str(value)[:40]!r}", param=where)
    return value


def parse_chat(body: dict, defaults: Defaults) -> ChatRequest:
    """A /v1/chat/completions body."""
    messages = chat_messages(body.get("messages"))
    gen = parse_common(body, "chat", "messages", defaults)
    logprobs = optional_field(body, "logprobs", bool, "a boolean")
    top = integer_field(body, "top_logprobs")
    if top is not None and not 0 <= top <= LOGPROBS_MAX:
        raise bad_request(f"must be between 0 and {LOGPROBS_MAX}, got {top}", param="top_logprobs")
    if top is not None and not logprobs:
        raise bad_request("needs logprobs: true", param="top_logprobs")
    if logprobs:
        gen.sampling["logprobs"] = top or 0
    tools = parse_tools(body.get("tools"))
    mode, name = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = optional_field(body, "parallel_tool_calls", bool, "a boolean")
    return ChatRequest(gen=gen, messages=messages, tools=tools, tool_choice=mode, forced_name=name,
                       parallel_tool_calls=True if parallel is None else parallel,
                       template_kwargs=template_kwargs(body.get("chat_template_kwargs")),
                       reasoning_format=parse_reasoning_format(body.get("reasoning_format")))
