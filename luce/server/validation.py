"""Request bodies -> validated generation requests. Every rejection is a 400 naming the field.

Accepted as in the OpenAI API (chat and legacy completions: n, logprobs, logit_bias,
response_format) plus the common llama-server / vLLM extensions (top_k, min_p,
repetition_penalty, ignore_eos, stop_token_ids). Fields luce cannot honour yet (best_of > 1,
echo, suffix, the legacy functions API) are refused with a message rather than silently
ignored; unknown fields are ignored.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from luce.engine.sampler import LOGPROBS_MAX, SamplingError, SamplingParams
from luce.server.errors import bad_request

MAX_STOP = 16
MAX_N = 16


@dataclass(frozen=True)
class Defaults:
    """Sampling defaults for fields a request leaves out (llama-server's, overridable by flags)."""
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repetition_penalty: float = 1.0

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p, "repetition_penalty": self.repetition_penalty}


@dataclass
class GenerationRequest:
    """A validated /v1/chat/completions or /v1/completions body."""
    kind: str                              # "chat" | "completion" (Anthropic and Responses are chat)
    model: str | None
    prompt_field: str                      # "messages" | "prompt": the field prompt errors name
    prompt_text: str | None = None         # completion given as text
    prompt_ids: list[int] | None = None    # completion given as token ids
    sampling: dict = field(default_factory=dict)   # SamplingParams kwargs except max_tokens
    max_tokens: int | None = None          # None: up to the context
    max_tokens_field: str = "max_tokens"
    stream: bool = False
    include_usage: bool = False
    n: int = 1                             # choices: n requests, seeds seed, seed + 1, ... when one is given

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """SamplingParams with the resolved max_tokens; SamplingError -> 400 naming the field."""
        try:
            return SamplingParams(max_tokens=max_tokens, **self.sampling)
        except SamplingError as e:
            name = self.max_tokens_field if e.field == "max_tokens" else e.field
            raise bad_request(str(e).split(": ", 1)[-1], param=name) from None


# ---------------------------------------------------------------------------- helpers

def parse_json_body(body: bytes) -> dict:
    if not body.strip():
        raise bad_request("request body is empty: send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad_request(f"invalid JSON in request body: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:   # e.g. integers over 4300 digits, deep nesting
        raise bad_request(f"invalid JSON in request body: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise bad_request(f"request body must be a JSON object, got {type_name(obj)}")
    return obj


def type_name(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def text_field(value, name: str, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise bad_request(f"must be a string, got {type_name(value)}", param=name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("contains an unpaired UTF-16 surrogate (invalid Unicode)", param=name) from None
    if not allow_empty and not value:
        raise bad_request("must not be empty", param=name)
    return value


def optional_field(body: dict, name: str, kind: type | tuple, kind_name: str):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise bad_request(f"must be {kind_name}, got boolean", param=name)
    if not isinstance(value, kind):
        raise bad_request(f"must be {kind_name}, got {type_name(value)}", param=name)
    return value


def integer_field(body: dict, name: str):
    value = optional_field(body, name, (int, float), "an integer")
    if value is None:
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise bad_request(f"must be an integer, got {value!r}", param=name)
        value = int(value)
    return value


def _refuse_unsupported(body: dict, chat: bool) -> None:
    best_of = integer_field(body, "best_of")
    if best_of is not None and best_of != 1:
        raise bad_request(f"only best_of=1 is supported, got {best_of}", param="best_of")
    if body.get("functions") or body.get("function_call"):
        raise bad_request("the legacy functions API is not supported: send tools (and tool_choice)",
                          param="functions" if body.get("functions") else "function_call")
    if body.get("tools") and not chat:
        raise bad_request("tools are only supported on /v1/chat/completions", param="tools")


def _structured(body: dict, out: dict) -> None:
    """response_format -> a grammar, logit_bias -> (id, bias) pairs (luce.server.structured)."""
    from luce.server.structured import parse_logit_bias, response_format_grammar

    grammar = response_format_grammar(body.get("response_format"))
    if grammar is not None:
        out["grammar"] = grammar
    bias = parse_logit_bias(body.get("logit_bias"), None)
    if bias:
        out["logit_bias"] = bias


def _choices(body: dict) -> int:
    n = integer_field(body, "n")
    if n is None:
        return 1
    if not 1 <= n <= MAX_N:
        raise bad_request(f"must be between 1 and {MAX_N}, got {n}", param="n")
    return n


def _sampling(body: dict, defaults: Defaults) -> dict:
    out = defaults.as_dict()
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad_request(f"must be a number, got {type_name(value)}", param=name)
            out[name] = value
    for name in ("top_k", "seed"):
        value = integer_field(body, name)
        if value is not None:
            out[name] = value
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list):
            raise bad_request(f"must be a string or an array of strings, got {type_name(stop)}", param="stop")
        if len(stop) > MAX_STOP:
            raise bad_request(f"at most {MAX_STOP} stop strings, got {len(stop)}", param="stop")
        out["stop"] = tuple(text_field(s, f"stop[{i}]", allow_empty=False) for i, s in enumerate(stop))
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise bad_request("must be an array of integers", param="stop_token_ids")
        out["stop_token_ids"] = tuple(ids)
    ignore_eos = optional_field(body, "ignore_eos", bool, "a boolean")
    if ignore_eos is not None:
        out["ignore_eos"] = ignore_eos
    if out.get("top_k") == -1:
        out["top_k"] = 0
    return out


def parse_common(body: dict, kind: str, prompt_field: str, defaults: Defaults) -> GenerationRequest:
    """The fields every generation endpoint shares: model, stream, max_tokens, sampling."""
    model = optional_field(body, "model", str, "a string")
    stream = optional_field(body, "stream", bool, "a boolean") or False
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad_request(f"must be an object, got {type_name(options)}", param="stream_options")
        if not stream:
            raise bad_request("is only allowed when stream is true", param="stream_options")
        include_usage = bool(optional_field(options, "include_usage", bool, "a boolean"))
    _refuse_unsupported(body, chat=kind == "chat")
    max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = integer_field(body, max_field)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"must be >= 1, got {max_tokens}", param=max_field)
    sampling = _sampling(body, defaults)
    _structured(body, sampling)
    req = GenerationRequest(kind=kind, model=model, prompt_field=prompt_field, sampling=sampling,
                            max_tokens=max_tokens, max_tokens_field=max_field, stream=stream,
                            include_usage=include_usage, n=_choices(body))
    req.sampling_params(1)   # range-check every sampling field now (400 before any work)
    return req


# ---------------------------------------------------------------------------- endpoints

def parse_completion(body: dict, defaults: Defaults, vocab_size: int) -> GenerationRequest:
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("is required", param="prompt")
    for name in ("echo",):
        if body.get(name):
            raise bad_request("is not supported by luce yet", param=name)
    if body.get("suffix"):
        raise bad_request("is not supported by luce yet (no fill-in-the-middle endpoint)", param="suffix")
    logprobs = integer_field(body, "logprobs")
    if logprobs is not None and not 0 <= logprobs <= LOGPROBS_MAX:
        raise bad_request(f"must be between 0 and {LOGPROBS_MAX}, got {logprobs}", param="logprobs")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]          # a batch of one
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise bad_request(f"batched prompts are not supported; send one prompt per request "
                          f"(got {len(prompt)})", param="prompt")
    req = parse_common(body, "completion", "prompt", defaults)
    if logprobs is not None:
        req.sampling["logprobs"] = logprobs
    if isinstance(prompt, str):
        req.prompt_text = text_field(prompt, "prompt", allow_empty=False)
    elif isinstance(prompt, list):
        if not prompt:
            raise bad_request("must not be empty", param="prompt")
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, int):
                raise bad_request(f"token ids must be integers, got {type_name(t)}", param=f"prompt[{i}]")
            if not 0 <= t < vocab_size:
                raise bad_request(f"token id {t} is outside the vocabulary (0..{vocab_size - 1})",
                                  param=f"prompt[{i}]")
        req.prompt_ids = list(prompt)
    else:
        raise bad_request(f"must be a string or an array of token ids, got {type_name(prompt)}", param="prompt")
    return req
