"""OpenAI response objects: chat completions (tool calls, reasoning), text completions, their
stream chunks, usage."""
from __future__ import annotations

import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens served from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def tool_call(call, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return out if index is None else {"index": index, **out}


def chat_message(content: str, reasoning: str, calls) -> dict:
    """The assistant message: content (null when only tool calls), reasoning_content, tool_calls."""
    message = {"role": "assistant", "content": content if content or not calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [tool_call(c) for c in calls]
    return message


def chat_delta(delta, call_index: int) -> dict:
    """A stream delta for one parsed piece (luce.server.assistant_output.Delta)."""
    if delta.kind == "reasoning":
        return {"reasoning_content": delta.text}
    if delta.kind == "tool_call":
        return {"tool_calls": [tool_call(delta.call, call_index)]}
    return {"content": delta.text}


def chat_choice(index: int, message: dict, finish_reason: str, logprobs: dict | None = None) -> dict:
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_completion(rid: str, created: int, model: str, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": use, "system_fingerprint": None}


def chat_chunk(rid: str, created: int, model: str, delta: dict | None, finish_reason: str | None = None,
               use: dict | None = None, include_usage: bool = False, index: int = 0,
               logprobs: dict | None = None) -> dict:
    """One `chat.completion.chunk`. delta None -> the usage-only chunk (choices: [])."""
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [] if delta is None else
             [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = use
    return chunk


def text_choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def text_completion(rid: str, created: int, model: str, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use, "system_fingerprint": None}


def text_chunk(rid: str, created: int, model: str, text: str | None, finish_reason: str | None = None,
               use: dict | None = None, include_usage: bool = False, index: int = 0,
               logprobs: dict | None = None) -> dict:
    """One streamed text_completion. text None -> the usage-only chunk (choices: [])."""
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [] if text is None else [text_choice(index, text, finish_reason, logprobs)]}
    if include_usage:
        chunk["usage"] = use
    return chunk


def stream_error(message: str, type: str = "server_error", code: str | None = "internal_error") -> dict:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}
