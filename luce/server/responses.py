"""OpenAI response objects: chat completions, text completions, their stream chunks, usage."""
from __future__ import annotations

import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_completion(rid: str, created: int, model: str, text: str, finish_reason: str, use: dict) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": use, "system_fingerprint": None,
    }


def chat_chunk(rid: str, created: int, model: str, delta: dict | None, finish_reason: str | None = None,
               use: dict | None = None, include_usage: bool = False) -> dict:
    """One `chat.completion.chunk`. delta None -> the usage-only chunk (choices: [])."""
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [] if delta is None else
             [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = use
    return chunk


def text_completion(rid: str, created: int, model: str, text: str, finish_reason: str, use: dict) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": use, "system_fingerprint": None,
    }


def text_chunk(rid: str, created: int, model: str, text: str | None, finish_reason: str | None = None,
               use: dict | None = None, include_usage: bool = False) -> dict:
    """One streamed text_completion. text None -> the usage-only chunk (choices: [])."""
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [] if text is None else
             [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = use
    return chunk


def stream_error(message: str, type: str = "server_error", code: str | None = "internal_error") -> dict:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}
